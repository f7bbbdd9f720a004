//! The CUDA backend on a real GPU. Every test prints `skipping: no CUDA` and returns on a
//! host without the CUDA libraries (CI); tools/gpu/run.sh runs them on the H200 machine.

use genslot::gpu::cuda::cpu_ref::CpuModel;
use genslot::gpu::cuda::parity::{cpu_reference, rel_errors, run};
use genslot::gpu::cuda::{CudaBackend, CudaConfig, Launch, LibraryProbe, ModelShape, ModelSource};
use genslot::gpu::{BackendError, ContextArrival, StepBackend, StepRow};

const SEED: u32 = 5;

fn gpu() -> bool {
    if LibraryProbe::run().all_present() {
        return true;
    }
    eprintln!("skipping: no CUDA");
    false
}

fn tiny(graphs: bool) -> CudaBackend {
    let mut cfg = CudaConfig::new(ModelSource::Seeded {
        shape: "tiny".into(),
        seed: SEED,
    });
    cfg.max_batch_size = 8;
    cfg.kv_pages = Some(96);
    cfg.tokens_per_block = 16;
    cfg.max_context = 1024;
    cfg.prefill_chunk = 24;
    cfg.cuda_graphs = graphs;
    match CudaBackend::new(cfg) {
        Ok(b) => b,
        Err(e) => panic!("tiny CUDA backend: {e}"),
    }
}

fn prompt(n: usize, salt: usize) -> Vec<u32> {
    (0..n)
        .map(|j| ((j * 313 + salt * 29 + 1) % 1024) as u32)
        .collect()
}

#[test]
fn tiny_model_matches_the_cpu_reference_with_interleaved_pages() {
    if !gpu() {
        return;
    }
    let cpu = CpuModel::seeded(&ModelShape::named("tiny").unwrap(), SEED);
    let prompts = vec![
        prompt(3, 0),
        prompt(40, 1),
        prompt(77, 2),
        prompt(1, 3),
        prompt(16, 4),
    ];
    let r = cpu_reference(&cpu, &prompts, 12);
    for graphs in [true, false] {
        let mut b = tiny(graphs);
        let launch = if graphs { Launch::Graph } else { Launch::Eager };
        let rep = run(&mut b, &r, launch).unwrap();
        eprintln!("{launch:?}: {rep:?}");
        assert!(rep.max_rel_err < 3e-2, "{rep:?}");
        assert!(rep.greedy_agree * 10 >= rep.positions * 9, "{rep:?}");
    }
}

fn row(id: u64, ctx: usize, tok: u32, pages: &[u32]) -> StepRow {
    StepRow {
        id,
        slot: id as u32,
        context_len: ctx as u32,
        last_token: tok,
        pages: pages.to_vec(),
    }
}

/// Greedy decode of `steps` tokens for requests with the given active pattern per step.
fn decode_pattern(b: &mut CudaBackend, active: &[&[bool]]) -> Vec<Vec<u32>> {
    let prompts = [prompt(20, 7), prompt(9, 8)];
    let pages: [Vec<u32>; 2] = [
        (0..8).map(|j| 2 * j).collect(),
        (0..8).map(|j| 2 * j + 1).collect(),
    ];
    let mut last = [0u32; 2];
    let mut ctx = [0usize; 2];
    let mut out = vec![Vec::new(), Vec::new()];
    for i in 0..2 {
        last[i] = b.prefill(i as u64, &prompts[i], &pages[i]).unwrap().0;
        ctx[i] = prompts[i].len();
        out[i].push(last[i]);
    }
    for step in active {
        let ids: Vec<usize> = (0..2).filter(|&i| step[i]).collect();
        let rows: Vec<StepRow> = ids
            .iter()
            .map(|&i| row(i as u64, ctx[i], last[i], &pages[i]))
            .collect();
        let (toks, _) = b.decode(&rows, Launch::Graph, false).unwrap();
        for (&i, t) in ids.iter().zip(toks) {
            last[i] = t;
            ctx[i] += 1;
            out[i].push(t);
        }
    }
    out
}

#[test]
fn a_request_paused_in_place_resumes_with_the_same_tokens() {
    if !gpu() {
        return;
    }
    let both: &[bool] = &[true, true];
    let a_only: &[bool] = &[true, false];
    let base = decode_pattern(&mut tiny(true), &[both; 6]);
    // Request 1 sits out two steps (absent from the batch, pages untouched), then resumes.
    let paused = decode_pattern(
        &mut tiny(true),
        &[both, both, a_only, a_only, both, both, both, both],
    );
    assert_eq!(
        paused[1][..7],
        base[1][..7],
        "paused request diverged after resume"
    );
    assert_eq!(
        paused[0][..7],
        base[0][..7],
        "the request that kept running diverged"
    );
}

#[test]
fn step_backend_emits_the_prefill_token_then_decodes() {
    if !gpu() {
        return;
    }
    let mut b = tiny(true);
    let p = prompt(30, 9);
    let pages: Vec<u32> = (10..14).collect();
    let (want_first, _) = b.prefill(99, &p, &pages).unwrap();
    b.context_arrival(&ContextArrival {
        id: 1,
        prompt: p.clone(),
        pages: pages.clone(),
        sampling: Default::default(),
    })
    .unwrap();
    let out = b.step(&[row(1, p.len(), 0, &pages)]).unwrap();
    assert_eq!(out.tokens, vec![vec![want_first]]);
    let out2 = b.step(&[row(1, p.len(), want_first, &pages)]).unwrap();
    let (want_second, _) = b
        .decode(&[row(1, p.len(), want_first, &pages)], Launch::Eager, false)
        .unwrap();
    assert_eq!(out2.tokens, vec![want_second]);
    assert!(out2.step_s > 0.0);
    b.release(1);
    assert!(matches!(
        b.step(&[row(1, p.len() + 1, 0, &pages)]),
        Err(BackendError::UnknownRequest(1))
    ));
}

#[test]
fn bad_pages_and_tokens_are_errors_not_panics() {
    if !gpu() {
        return;
    }
    let mut b = tiny(true);
    let outside = b.context_arrival(&ContextArrival {
        id: 1,
        prompt: vec![1, 2, 3],
        pages: vec![500],
        sampling: Default::default(),
    });
    assert!(matches!(outside, Err(BackendError::Failed(m)) if m.contains("outside the KV cache")));
    let short = b.context_arrival(&ContextArrival {
        id: 2,
        prompt: prompt(40, 0),
        pages: vec![0],
        sampling: Default::default(),
    });
    assert!(matches!(short, Err(BackendError::Failed(m)) if m.contains("cannot hold")));
    let vocab = b.context_arrival(&ContextArrival {
        id: 3,
        prompt: vec![5000],
        pages: vec![0],
        sampling: Default::default(),
    });
    assert!(matches!(vocab, Err(BackendError::Failed(m)) if m.contains("vocabulary")));
    let too_many: Vec<StepRow> = (0..9).map(|i| row(i, 1, 1, &[i as u32])).collect();
    assert!(b.decode(&too_many, Launch::Graph, false).is_err());
}

#[test]
fn graph_replay_and_eager_launch_compute_the_same_step() {
    if !gpu() {
        return;
    }
    let mut b = tiny(true);
    let p = prompt(50, 3);
    let pages: Vec<u32> = (20..24).collect();
    let (t0, _) = b.prefill(1, &p, &pages).unwrap();
    // 3 rows run in the bucket of 4 (one padding row) when replayed from the graph.
    let rows: Vec<StepRow> = (0..3).map(|_| row(1, p.len(), t0, &pages)).collect();
    let (tg, lg) = b.decode(&rows, Launch::Graph, true).unwrap();
    let (te, le) = b.decode(&rows, Launch::Eager, true).unwrap();
    assert_eq!(tg, te);
    for (g, e) in lg.iter().zip(&le) {
        assert!(rel_errors(g, e).0 < 1e-2);
    }
}

#[test]
fn kernels_compile_with_nvrtc_for_sm_90() {
    if !LibraryProbe::run().nvrtc {
        eprintln!("skipping: no CUDA (libnvrtc)");
        return;
    }
    let opts = cudarc::nvrtc::CompileOptions {
        arch: Some("sm_90"),
        options: vec!["--std=c++17".into()],
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(genslot::gpu::cuda::kernel_source(), opts)
        .unwrap_or_else(|e| panic!("NVRTC: {e:?}"));
    let text = ptx.to_src();
    for name in genslot::gpu::cuda::kernel_names() {
        assert!(
            text.contains(&format!(".entry {name}(")),
            "{name} missing from the PTX"
        );
    }
}
