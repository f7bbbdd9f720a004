//! One full scheduling pass (ingest → preemption step → admission pops → batch build) at
//! 128, 256 and 1024 resident requests with 2048 waiters (and 256 residents with 256 or
//! 8192 waiters), both preemption modes, in a live steady state: every slot taken,
//! requests finishing and being admitted, X formed from waited TTFTs, D formed from
//! completions, pauses and resumes happening. Each admission is replaced by one new
//! arrival, so the queue stays at its size.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use genslot::policy::admission::AdmissionParams;
use genslot::policy::preemption::paused_cap;
use genslot::policy::Mode;
use genslot::worker::{
    Arrival, KvReady, PassInputs, PassOutput, Stepped, WorkerCore, WorkerParams,
};

/// Decode step length, seconds.
const STEP_S: f64 = 0.03;
/// Passes run before measuring, so X, D and the pause churn have formed.
const WARM_PASSES: usize = 6000;

struct Bench {
    core: WorkerCore,
    /// Inputs and outputs reused pass to pass, as a runtime would.
    inp: PassInputs,
    out: PassOutput,
    next_id: u64,
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
        inp: PassInputs {
            step_s: Some(STEP_S),
            ..PassInputs::default()
        },
        out: PassOutput::default(),
        next_id: 0,
    };
    // Queue the waiters; the first pass admits a slot's worth of them (each replaced by a
    // new arrival). Decode lengths are spread so requests finish every few passes.
    for _ in 0..waiters {
        b.arrive();
    }
    for _ in 0..WARM_PASSES {
        b.step();
    }
    b
}

impl Bench {
    fn arrive(&mut self) {
        self.next_id += 1;
        let id = self.next_id;
        self.inp.arrivals.push(Arrival {
            id,
            arrival: self.inp.now - 0.5,
            context_tokens: 1000 + (id % 97) as u32 * 1000,
            max_tokens: 200 + (id * 37 % 800) as u32,
        });
    }

    /// One pass; its results become the next pass's inputs.
    fn step(&mut self) {
        self.core.pass_into(&self.inp, &mut self.out);
        let (inp, out) = (&mut self.inp, &self.out);
        inp.arrivals.clear();
        inp.kv_ready.clear();
        inp.kv_ready.extend(out.admitted.iter().map(|a| KvReady {
            id: a.id,
            at: out.now,
        }));
        inp.stepped.clear();
        inp.stepped.extend(out.batch.iter().map(|r| Stepped {
            id: r.id,
            tokens: 1,
            stop: false,
            token_ids: Vec::new(),
        }));
        inp.now += STEP_S;
        for _ in 0..out.admitted.len() + out.rejected.len() {
            self.arrive();
        }
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
