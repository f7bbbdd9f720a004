//! The policy bench's live workload, shared by `benches/policy.rs` and
//! `examples/pass_decisions.rs`: every slot taken, requests finishing (decode lengths
//! 200–1,000 tokens) and being admitted, X formed from waited TTFTs, D from completions,
//! pauses and resumes happening. Each admission is replaced by one new arrival, so the queue
//! stays at its size.

use genslot::policy::admission::AdmissionParams;
use genslot::policy::preemption::paused_cap;
use genslot::policy::Mode;
use genslot::worker::{
    Arrival, KvReady, PassInputs, PassOutput, Stepped, WorkerCore, WorkerParams,
};

/// Decode step length, seconds.
pub const STEP_S: f64 = 0.03;

pub struct LiveWorkload {
    pub core: WorkerCore,
    /// Inputs and outputs reused pass to pass, as a runtime would.
    pub inp: PassInputs,
    pub out: PassOutput,
    next_id: u64,
}

impl LiveWorkload {
    /// `residents` slots (paused cap on top) and `waiters` queued requests; no pass run yet.
    pub fn new(residents: u32, waiters: u64, mode: Mode) -> Self {
        let mut p = WorkerParams::simple(residents, mode, paused_cap(residents), 1u64 << 34);
        p.admission = AdmissionParams {
            min_samples: 10,
            max_waiting: 1 << 16,
            ..AdmissionParams::default()
        };
        let mut w = LiveWorkload {
            core: WorkerCore::new(p),
            inp: PassInputs {
                step_s: Some(STEP_S),
                ..PassInputs::default()
            },
            out: PassOutput::default(),
            next_id: 0,
        };
        for _ in 0..waiters {
            w.arrive();
        }
        w
    }

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
    pub fn step(&mut self) {
        self.core.pass_into(&self.inp, &mut self.out);
        let (inp, out) = (&mut self.inp, &self.out);
        inp.arrivals.clear();
        inp.kv_ready.clear();
        inp.kv_ready.extend(out.admitted.iter().map(|a| KvReady {
            id: a.id,
            at: out.now,
        }));
        // Every result is one token, no stop: reused entries only need their id, and
        // only entries the batch outgrew are built (no per-entry drop or rebuild).
        inp.stepped.truncate(out.batch.len());
        for (s, r) in inp.stepped.iter_mut().zip(&out.batch) {
            s.id = r.id;
        }
        let have = inp.stepped.len();
        inp.stepped
            .extend(out.batch[have..].iter().map(|r| Stepped {
                id: r.id,
                tokens: 1,
                ids: 0,
                stop: false,
            }));
        inp.now += STEP_S;
        for _ in 0..out.admitted.len() + out.rejected.len() {
            self.arrive();
        }
    }
}
