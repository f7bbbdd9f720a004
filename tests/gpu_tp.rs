//! NCCL across the GPUs of one host, for the tensor-parallel ranks (SPEC §6.1). Every test
//! prints `skipping:` and returns without CUDA, NCCL or two GPUs (CI, the one-GPU machine);
//! tools/gpu/run_tp.sh runs them on the two-GPU machine.

use genslot::gpu::cuda::tp::nccl;

/// NCCL and at least `n` GPUs, or a `skipping:` line.
fn gpus(n: usize) -> bool {
    match nccl::nccl_version().and_then(|v| Ok((v, nccl::device_count()?))) {
        Ok((_, have)) if have >= n => true,
        Ok((_, have)) => {
            eprintln!("skipping: needs {n} GPUs, found {have}");
            false
        }
        Err(e) => {
            eprintln!("skipping: {e}");
            false
        }
    }
}

#[test]
fn an_in_place_all_reduce_leaves_the_same_sum_on_every_rank() {
    if !gpus(2) {
        return;
    }
    let count = 3 * 4096 + 7; // not a multiple of any chunk size
    let held = nccl::all_reduce_once(2, count).unwrap();
    assert_eq!(held.len(), 2);
    for (rank, v) in held.iter().enumerate() {
        assert_eq!(v.len(), count);
        for (i, &x) in v.iter().enumerate() {
            // Rank 0 gave 1 + i/1000, rank 1 gave 2 + i/1000.
            let want = 3.0 + 2.0 * i as f32 / 1000.0;
            assert!(
                (x - want).abs() <= 1e-4 * want,
                "rank {rank} [{i}]: {x} != {want}"
            );
        }
    }
    assert_eq!(held[0], held[1], "both ranks hold bit-identical sums");
}

#[test]
fn all_reduce_timings_grow_with_size_and_report_bus_bandwidth() {
    if !gpus(2) {
        return;
    }
    let t = nccl::time_all_reduce(2, &[4096, 1 << 24], 20).unwrap();
    assert_eq!(t.len(), 2);
    assert!(t.iter().all(|x| x.secs > 0.0 && x.ranks == 2));
    assert!(t[1].secs > t[0].secs, "{t:?}");
    // With two ranks the bus bandwidth equals the algorithm bandwidth.
    assert!((t[1].bus_bw - t[1].alg_bw).abs() < 1e-6 * t[1].alg_bw);
}
