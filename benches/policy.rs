//! One full scheduling pass (preemption step + admission pops + batch build) at 128, 256
//! and 1024 resident requests with 2048 waiters, both preemption modes, in steady state
//! under load: every slot taken, X formed, a late queue, pauses and forced resumes live.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use genslot::policy::admission::AdmissionParams;
use genslot::policy::preemption::paused_cap;
use genslot::policy::Mode;
use genslot::worker::{Arrival, KvReady, PassInputs, Stepped, WorkerCore, WorkerParams};

struct Bench {
    core: WorkerCore,
    now: f64,
    next_id: u64,
    last: Vec<u64>,
    ready: Vec<KvReady>,
}

fn setup(residents: u32, waiters: u64, mode: Mode) -> Bench {
    let mut p = WorkerParams::simple(residents, mode, paused_cap(residents), 1u64 << 34);
    p.admission = AdmissionParams {
        min_samples: 10,
        max_waiting: 1 << 16,
        ..AdmissionParams::default()
    };
    let mut b = Bench {
        core: WorkerCore::new(p),
        now: 0.0,
        next_id: 0,
        last: Vec::new(),
        ready: Vec::new(),
    };
    // Fill every slot with long decoders, then queue the waiters.
    let fill: Vec<_> = (0..residents as u64)
        .map(|i| b.arrival(4096 + (i % 64) as u32 * 512, 1_000_000))
        .collect();
    b.pass_with(fill);
    for _ in 0..200 {
        b.pass_with(Vec::new());
    }
    let queue: Vec<_> = (0..waiters)
        .map(|i| b.arrival(1000 + (i % 97) as u32 * 1000, 500))
        .collect();
    b.pass_with(queue);
    // Run into steady state: X formed from the waited TTFTs, pauses at the cap.
    for _ in 0..2000 {
        b.pass_with(Vec::new());
    }
    b
}

impl Bench {
    fn arrival(&mut self, ctx: u32, max_tokens: u32) -> Arrival {
        self.next_id += 1;
        Arrival {
            id: self.next_id,
            arrival: self.now - 0.5,
            context_tokens: ctx,
            max_tokens,
        }
    }

    fn pass_with(&mut self, arrivals: Vec<Arrival>) {
        let inp = PassInputs {
            now: self.now,
            arrivals,
            cancellations: Vec::new(),
            kv_ready: std::mem::take(&mut self.ready),
            stepped: self
                .last
                .iter()
                .map(|&id| Stepped {
                    id,
                    tokens: 1,
                    stop: false,
                    token_ids: Vec::new(),
                })
                .collect(),
            step_s: Some(0.03),
        };
        let out = self.core.pass(&inp);
        self.ready = out
            .admitted
            .iter()
            .map(|a| KvReady {
                id: a.id,
                at: self.now,
            })
            .collect();
        self.last = out.batch.iter().map(|r| r.id).collect();
        self.now += 0.03;
    }

    /// One pass, keeping the queue at its size (one arrival per pass).
    fn step(&mut self) {
        let a = self.arrival(5000, 500);
        self.pass_with(vec![a]);
    }
}

fn passes(c: &mut Criterion) {
    let mut g = c.benchmark_group("pass");
    g.sample_size(30)
        .measurement_time(std::time::Duration::from_secs(3));
    for (name, mode) in [
        ("tpot_budget", Mode::TpotBudget(0.1)),
        ("target_output_tps", Mode::TargetOutputTps(20.0)),
    ] {
        for residents in [128u32, 256, 1024] {
            let mut b = setup(residents, 2048, mode);
            g.bench_with_input(
                BenchmarkId::new(name, format!("{residents}res_2048wait")),
                &residents,
                |bch, _| bch.iter(|| b.step()),
            );
        }
        // Waiter scaling at fixed residency.
        for waiters in [256u64, 8192] {
            let mut b = setup(256, waiters, mode);
            g.bench_with_input(
                BenchmarkId::new(name, format!("256res_{waiters}wait")),
                &waiters,
                |bch, _| bch.iter(|| b.step()),
            );
        }
    }
    g.finish();
}

criterion_group!(benches, passes);
criterion_main!(benches);
