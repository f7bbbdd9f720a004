//! One full scheduling pass (ingest → preemption step → admission pops → batch build) at
//! 128, 256 and 1024 resident requests with 2048 waiters (and 256 residents with 256 or
//! 8192 waiters), both preemption modes, in a live steady state: every slot taken,
//! requests finishing and being admitted, X formed from waited TTFTs, D formed from
//! completions, pauses and resumes happening. Each admission is replaced by one new
//! arrival, so the queue stays at its size.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use genslot::policy::Mode;

#[path = "support/live_workload.rs"]
mod live_workload;
use live_workload::LiveWorkload;

/// Passes run before measuring, so X, D and the pause churn have formed: `tpot_budget`'s
/// controller reaches its steady pause rate between passes 8,000 and 16,000 (BENCHMARKS §1,
/// round 6), and criterion's own warm-up then runs far past it.
const WARM_PASSES: usize = 20_000;

fn setup(residents: u32, waiters: u64, mode: Mode) -> LiveWorkload {
    let mut b = LiveWorkload::new(residents, waiters, mode);
    for _ in 0..WARM_PASSES {
        b.step();
    }
    b
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
