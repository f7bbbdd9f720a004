//! What the tensor-parallel rank check adds to a pass, in the policy bench's live steady
//! state (every slot taken, pauses and admissions happening): the leader's encoding of the
//! pass inputs, a follower's decoding of them, the decision hash every rank computes, and a
//! whole pass checked against one follower core on a thread over channels (the leader's
//! pass, the broadcast, the follower's pass beside it, the hash compare), next to the same
//! pass unchecked.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use genslot::policy::Mode;
use genslot::worker::ranks::{follow, Link, RankGroup};
use genslot::worker::wire::{decision_hash_with, decode_inputs_into, encode_inputs};
use genslot::worker::PassInputs;

#[path = "support/live_workload.rs"]
mod live_workload;
use live_workload::LiveWorkload;

/// As in benches/policy.rs: X, D and the pause churn have formed.
const WARM_PASSES: usize = 20_000;

fn rank_check(c: &mut Criterion) {
    let mut g = c.benchmark_group("ranks");
    g.sample_size(30)
        .measurement_time(std::time::Duration::from_secs(3));
    let mode = Mode::TpotBudget(0.1);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    for residents in [128u32, 256] {
        let mut b = LiveWorkload::new(residents, 2048, mode);
        for _ in 0..WARM_PASSES {
            b.step();
        }
        let id = |what: &str| BenchmarkId::new(what, format!("{residents}res_2048wait"));
        let mut buf = Vec::new();
        g.bench_function(id("encode_inputs"), |bch| {
            bch.iter(|| {
                buf.clear();
                encode_inputs(&b.inp, &mut buf);
                buf.len()
            })
        });
        let mut into = PassInputs::default();
        g.bench_function(id("decode_inputs"), |bch| {
            bch.iter(|| decode_inputs_into(&buf, &mut into))
        });
        let mut scratch = Vec::new();
        g.bench_function(id("decision_hash"), |bch| {
            bch.iter(|| decision_hash_with(&b.out, &mut scratch))
        });
        // For scale: the same pass unchecked (the leader's part of the line below).
        g.bench_function(id("pass_unchecked"), |bch| bch.iter(|| b.step()));
        // A follower starting from the warmed core's state, as ranks that started together.
        let (ours, theirs) = Link::channel_pair();
        let mut twin = b.core.clone();
        let follower = std::thread::spawn(move || follow(1, &mut twin, theirs));
        let mut group = RankGroup::new(vec![ours]).expect("group");
        g.bench_function(id("pass_checked_against_one_follower"), |bch| {
            bch.iter(|| {
                group.broadcast(&b.inp).expect("broadcast");
                b.step(); // the leader's pass; `b.out` keeps its output
                rt.block_on(group.check(&b.out)).expect("ranks agree");
            })
        });
        drop(group);
        follower.join().expect("follower").expect("follower ran");
    }
    g.finish();
}

criterion_group!(benches, rank_check);
criterion_main!(benches);
