//! The retained state on the GPU (skipped with a message where CUDA is absent; the same
//! checks, with a checkpoint and the prompt sets, run as `genslot-gpu check-retained`):
//! drafted greedy tokens equal plain ones, paused requests (drafter on; hybrid shape) equal
//! their solo runs, and `tiny-hybrid` matches its f32 CPU reference.

use genslot::gpu::cuda::cpu_ref::CpuModel;
use genslot::gpu::cuda::draft::DraftConfig;
use genslot::gpu::cuda::draft_sets::synthetic;
use genslot::gpu::cuda::parity;
use genslot::gpu::cuda::retained_check::{drafted_vs_plain, mixed_sampling, paused_vs_solo};
use genslot::gpu::cuda::{
    CudaBackend, CudaConfig, Launch, LibraryProbe, ModelShape, ModelSource, StepOptions,
};
use genslot::gpu::ContextArrival;
use genslot::sampling::SamplingParams;

const SEED: u32 = 5;
const DRAFT: DraftConfig = DraftConfig {
    window: 64,
    max_draft_len: 4,
    max_ngram: 3,
};

fn gpu() -> bool {
    if LibraryProbe::run().all_present() {
        return true;
    }
    eprintln!("skipping: no CUDA");
    false
}

fn backend(shape: &str, graphs: bool, draft: Option<DraftConfig>) -> CudaBackend {
    let mut cfg = CudaConfig::new(ModelSource::Seeded {
        shape: shape.into(),
        seed: SEED,
    });
    cfg.max_batch_size = 8;
    cfg.kv_pages = Some(1024);
    cfg.tokens_per_block = 16;
    cfg.max_context = 1024;
    cfg.prefill_chunk = 24;
    cfg.max_resident = 16;
    cfg.cuda_graphs = graphs;
    cfg.drafter = draft;
    // Every check here compares tokens across batches of different sizes.
    cfg.step = Some(StepOptions::invariant());
    CudaBackend::new(cfg).unwrap_or_else(|e| panic!("{shape} CUDA backend: {e}"))
}

/// 64 pages of 16 tokens a request.
fn pages(id: u64) -> Vec<u32> {
    let i = (id % 16) as u32;
    (i * 64..(i + 1) * 64).collect()
}

fn reqs(n: usize, sampling: impl Fn(usize) -> SamplingParams) -> Vec<ContextArrival> {
    (0..n)
        .map(|i| ContextArrival {
            id: i as u64,
            slot: i as u32,
            prompt: synthetic(i % 2 == 0, 1024, i as u32),
            pages: pages(i as u64),
            sampling: sampling(i),
            min_tokens: 0,
        })
        .collect()
}

#[test]
fn drafted_greedy_tokens_equal_plain_greedy_tokens_on_the_gpu() {
    if !gpu() {
        return;
    }
    for graphs in [true, false] {
        let r = drafted_vs_plain(
            "tiny",
            &mut backend("tiny", graphs, None),
            &mut backend("tiny", graphs, Some(DRAFT)),
            &reqs(4, |_| SamplingParams::GREEDY),
            48,
            &pages,
        )
        .unwrap();
        eprintln!("graphs {graphs}: {}", serde_json::to_string(&r).unwrap());
        assert_eq!(r.identical, r.prompts, "{:?}", r.first_difference);
    }
}

#[test]
fn paused_requests_equal_their_solo_runs_with_the_drafter_and_with_the_hybrid_shape() {
    if !gpu() {
        return;
    }
    for (shape, draft) in [("tiny", Some(DRAFT)), ("tiny-hybrid", None)] {
        let r = paused_vs_solo(
            shape,
            &mut backend(shape, true, draft),
            &mut backend(shape, true, None),
            &reqs(6, mixed_sampling),
            40,
            &pages,
        )
        .unwrap();
        eprintln!("{}", serde_json::to_string(&r).unwrap());
        assert_eq!(r.identical, r.requests);
    }
}

#[test]
fn tiny_hybrid_matches_its_f32_cpu_reference_graph_and_eager() {
    if !gpu() {
        return;
    }
    let shape = ModelShape::named("tiny-hybrid").unwrap();
    let cpu = CpuModel::seeded(&shape, SEED);
    let prompts: Vec<Vec<u32>> = (0..4).map(|i| synthetic(i % 2 == 0, 1024, i)).collect();
    let reference = parity::cpu_reference(&cpu, &prompts, 16);
    for (graphs, launch) in [(true, Launch::Graph), (false, Launch::Eager)] {
        let mut b = backend("tiny-hybrid", graphs, None);
        let r = parity::run(&mut b, &reference, launch).unwrap();
        eprintln!("{launch:?}: {}", serde_json::to_string(&r).unwrap());
        assert!(r.max_rel_err < 1e-2, "{r:?}");
    }
}
