//! The CUDA backend on a real GPU. Every test prints `skipping: no CUDA` and returns on a
//! host without the CUDA libraries (CI); tools/gpu/run.sh runs them on the H200 machine.

use std::time::Instant;

use genslot::gpu::cuda::cpu_ref::CpuModel;
use genslot::gpu::cuda::model_files::write_hf_checkpoint;
use genslot::gpu::cuda::parity::{cpu_reference, rel_errors, run};
use genslot::gpu::cuda::shape::RopeScaling;
use genslot::gpu::cuda::transfer::{handed_over_token, transfer_bytes, transfer_time};
use genslot::gpu::cuda::{
    all_attn_shapes, AttnGrid, ContextMode, CudaBackend, CudaConfig, Launch, LibraryProbe,
    ModelShape, ModelSource, StepOptions, TcRing,
};
use genslot::gpu::{BackendError, ContextArrival, StepBackend, StepRow};
use genslot::sampling::{sample_row, SamplingParams};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const SEED: u32 = 5;

fn gpu() -> bool {
    if LibraryProbe::run().all_present() {
        return true;
    }
    eprintln!("skipping: no CUDA");
    false
}

fn tiny(graphs: bool) -> CudaBackend {
    tiny_with(graphs, |_| {})
}

/// The launch that promises a request the same tokens whatever its batch
/// (`StepOptions::invariant`): what the paused-or-not checks run on.
fn tiny_invariant() -> CudaBackend {
    tiny_with(true, |c| c.step = Some(StepOptions::invariant()))
}

fn tiny_cfg(source: ModelSource, graphs: bool) -> CudaConfig {
    let mut cfg = CudaConfig::new(source);
    cfg.max_batch_size = 8;
    cfg.kv_pages = Some(96);
    cfg.tokens_per_block = 16;
    cfg.max_context = 1024;
    cfg.prefill_chunk = 24;
    cfg.cuda_graphs = graphs;
    cfg
}

fn tiny_with(graphs: bool, edit: impl FnOnce(&mut CudaConfig)) -> CudaBackend {
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
    edit(&mut cfg);
    match CudaBackend::new(cfg) {
        Ok(b) => b,
        Err(e) => panic!("tiny CUDA backend: {e}"),
    }
}

fn arrival(id: u64, prompt: Vec<u32>, pages: Vec<u32>) -> ContextArrival {
    ContextArrival {
        id,
        slot: id as u32,
        prompt,
        pages,
        sampling: Default::default(),
        min_tokens: 0,
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
    let base = decode_pattern(&mut tiny_invariant(), &[both; 6]);
    // Request 1 sits out two steps (absent from the batch, pages untouched), then resumes.
    let paused = decode_pattern(
        &mut tiny_invariant(),
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
fn the_batch_invariant_launch_gives_a_row_the_same_logits_at_every_batch_size() {
    if !gpu() {
        return;
    }
    // Row 0 has 700 tokens, three attention splits; the other rows are short. The default
    // launch would run row 0 alone on the GEMV and split it by the batch's size.
    let mut b = tiny_invariant();
    let p = prompt(700, 9);
    let pages0: Vec<u32> = (0..44).collect();
    let (t0, _) = b.prefill(0, &p, &pages0).unwrap();
    let mut rows = vec![row(0, p.len(), t0, &pages0)];
    for i in 1..8u32 {
        let pg: Vec<u32> = (44 + 4 * i..48 + 4 * i).collect();
        let q = prompt(40, i as usize);
        let (t, _) = b.prefill(i as u64, &q, &pg).unwrap();
        rows.push(row(i as u64, q.len(), t, &pg));
    }
    let (alone_tok, alone) = b.decode(&rows[..1], Launch::Graph, true).unwrap();
    for n in [2, 3, 5, 8] {
        let (toks, logits) = b.decode(&rows[..n], Launch::Graph, true).unwrap();
        assert_eq!(toks[0], alone_tok[0], "batch {n}");
        let same = logits[0]
            .iter()
            .zip(&alone[0])
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "row 0's logits at batch {n} differ from alone");
    }
}

#[test]
fn step_backend_first_step_emits_the_prefill_token_and_decodes_from_it() {
    if !gpu() {
        return;
    }
    let mut b = tiny(true);
    let p = prompt(30, 9);
    let pages: Vec<u32> = (10..14).collect();
    let (want_first, _) = b.prefill(99, &p, &pages).unwrap();
    let arrived = b
        .context_arrival(&arrival(1, p.clone(), pages.clone()))
        .unwrap();
    // The prefill's token is given at arrival and again by the first step, which also
    // decodes it (the executor's first row carries no input token).
    assert_eq!(arrived.first_token, Some(want_first));
    let out = b.step(&[row(1, p.len(), 0, &pages)]).unwrap();
    let (want_second, _) = b
        .decode(&[row(1, p.len(), want_first, &pages)], Launch::Eager, false)
        .unwrap();
    assert_eq!(out.tokens, vec![vec![want_first, want_second[0]]]);
    // Then a row as usual: prompt + 1 cached, the second token as input.
    let next = row(1, p.len() + 1, want_second[0], &pages);
    let out2 = b.step(std::slice::from_ref(&next)).unwrap();
    let (want_third, _) = b.decode(&[next], Launch::Eager, false).unwrap();
    assert_eq!(out2.tokens, vec![want_third]);
    assert!(out2.step_s > 0.0);
    b.release(1);
    assert!(matches!(
        b.step(&[row(1, p.len() + 2, 0, &pages)]),
        Err(BackendError::UnknownRequest(1))
    ));
}

/// `n` tokens of a request alone, its rows as the executor sends them: prompt + tokens out
/// − 1 cached, the last token out as input (none on the first step).
fn generate(b: &mut CudaBackend, id: u64, prompt_len: usize, pages: &[u32], n: usize) -> Vec<u32> {
    let mut out: Vec<u32> = Vec::new();
    while out.len() < n {
        let ctx = prompt_len + out.len().max(1) - 1;
        let last = out.last().copied().unwrap_or(0);
        let step = b.step(&[row(id, ctx, last, pages)]).unwrap();
        out.extend(&step.tokens[0]);
    }
    out.truncate(n);
    out
}

#[test]
fn bad_pages_and_tokens_are_errors_not_panics() {
    if !gpu() {
        return;
    }
    let mut b = tiny(true);
    let outside = b.context_arrival(&arrival(1, vec![1, 2, 3], vec![500]));
    assert!(matches!(outside, Err(BackendError::Failed(m)) if m.contains("outside the KV cache")));
    let short = b.context_arrival(&arrival(2, prompt(40, 0), vec![0]));
    assert!(matches!(short, Err(BackendError::Failed(m)) if m.contains("cannot hold")));
    let vocab = b.context_arrival(&arrival(3, vec![5000], vec![0]));
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
fn every_step_option_computes_the_tokens_the_plain_launch_computes() {
    if !gpu() {
        return;
    }
    // With PDL a kernel's blocks start while its predecessor drains: one that read before its
    // PDL_BEGIN would see a stale residual or q|k|v. One attention block per SM puts the
    // 200-row prefill below in a single split, which the direct path writes without
    // attn_combine.
    let run = |opts: StepOptions| {
        let mut b = tiny_with(true, |c| {
            c.step = Some(opts);
            c.prefill_chunk = 256;
        });
        let both: &[bool] = &[true, true];
        let a_only: &[bool] = &[true, false];
        let toks = decode_pattern(&mut b, &[both, a_only, both, both, both, both]);
        let p = prompt(200, 3);
        let pages: Vec<u32> = (20..33).collect();
        let (t0, prefill_logits) = b.prefill(7, &p, &pages).unwrap();
        let rows: Vec<StepRow> = (0..3).map(|_| row(7, p.len(), t0, &pages)).collect();
        let (_, graph) = b.decode(&rows, Launch::Graph, true).unwrap();
        let (_, eager) = b.decode(&rows, Launch::Eager, true).unwrap();
        (toks, t0, prefill_logits, graph, eager)
    };
    let d = StepOptions::plain();
    let base = run(d);
    for opts in [
        StepOptions::default(),
        StepOptions { pdl: true, ..d },
        StepOptions {
            attn_blocks_per_sm: 1,
            direct_single_split: true,
            ..d
        },
        StepOptions {
            attn_blocks_per_sm: 1,
            direct_single_split: true,
            pdl: true,
            ..d
        },
        // Decode passes of 1 to 3 rows on the GEMV kernels, the 200-row prefill on cuBLAS.
        StepOptions { gemv_rows: 4, ..d },
        StepOptions {
            gemv_rows: 4,
            pdl: true,
            ..d
        },
        StepOptions::invariant(),
        // Products of 2 and 3 rows in K slices (the defaults cut down_proj in 4; here cuBLAS's
        // own down_proj, and other counts): down_proj's and o_proj's parts added into the
        // residual by the next RMSNorm, qkv's summed by RoPE + KV write (the one-row passes
        // keep the GEMV).
        StepOptions {
            down_splits: 0,
            ..StepOptions::default()
        },
        StepOptions {
            down_splits: 2,
            ..d
        },
        StepOptions {
            qkv_splits: 2,
            o_splits: 4,
            down_splits: 4,
            ..StepOptions::default()
        },
        StepOptions {
            qkv_splits: 4,
            o_splits: 2,
            ..d
        },
        // Another tensor-core attention block (two warps of four stages). Its warps take
        // other tokens, so P is rounded to bf16 against other running maxima: the logits
        // move by more than the options above move them, the tokens must not.
        StepOptions {
            attn_ring: TcRing {
                warps: 2,
                stages: 4,
            },
            ..d
        },
    ] {
        let got = run(opts);
        let what = opts.describe();
        let tol = if opts.attn_ring == d.attn_ring {
            1e-3
        } else {
            1e-2
        };
        assert_eq!(got.0, base.0, "decoded tokens, {what}");
        assert_eq!(got.1, base.1, "prefill token, {what}");
        let prefill = rel_errors(&got.2, &base.2).0;
        let decode = got
            .3
            .iter()
            .chain(&got.4)
            .zip(base.3.iter().chain(&base.4))
            .map(|(g, b)| rel_errors(g, b).0)
            .fold(0.0, f64::max);
        eprintln!("{what}: max rel err prefill {prefill:.2e}, decode {decode:.2e}");
        assert!(prefill < tol, "prefill logits {prefill:.2e}, {what}");
        assert!(decode < tol, "decode logits {decode:.2e}, {what}");
    }
}

#[test]
fn rows_sent_longest_first_get_back_their_own_tokens_and_logits() {
    if !gpu() {
        return;
    }
    // Four requests in ascending order of context, so the default launch sends them to the
    // GPU reversed; a token or a row of logits handed to the wrong request would show here.
    let run = |longest_first: bool| {
        let mut b = tiny_with(true, |c| {
            c.step = Some(StepOptions {
                longest_first,
                ..StepOptions::default()
            })
        });
        let lens = [9usize, 40, 77, 130];
        let mut state: Vec<(Vec<u32>, usize, u32)> = Vec::new();
        let mut next_page = 0u32;
        for (i, &n) in lens.iter().enumerate() {
            // 10 pages of 16 tokens: room for 130 + 4 tokens.
            let pages: Vec<u32> = (next_page..next_page + 10).collect();
            next_page += 10;
            let (t, _) = b.prefill(i as u64, &prompt(n, 20 + i), &pages).unwrap();
            state.push((pages, n, t));
        }
        let mut tokens = vec![Vec::new(); lens.len()];
        let mut logits = Vec::new();
        for _ in 0..4 {
            let rows: Vec<StepRow> = (state.iter().enumerate())
                .map(|(i, (pages, ctx, last))| row(i as u64, *ctx, *last, pages))
                .collect();
            let (toks, lg) = b.decode(&rows, Launch::Graph, true).unwrap();
            for (i, t) in toks.into_iter().enumerate() {
                tokens[i].push(t);
                state[i].1 += 1;
                state[i].2 = t;
            }
            logits.push(lg);
        }
        (tokens, logits)
    };
    let (sent_longest_first, in_order) = (run(true), run(false));
    assert_eq!(sent_longest_first.0, in_order.0, "tokens per request");
    for (step, (a, b)) in sent_longest_first.1.iter().zip(&in_order.1).enumerate() {
        for (r, (x, y)) in a.iter().zip(b).enumerate() {
            let err = rel_errors(x, y).0;
            assert!(
                err < 1e-3,
                "step {step} row {r}: logits differ by {err:.2e}"
            );
        }
    }
    // The rows do differ, so a swap could not pass unseen.
    let first = &in_order.1[0];
    assert!(rel_errors(&first[0], &first[3]).0 > 1e-2);
}

#[test]
fn the_balanced_attention_computes_what_the_split_grid_computes() {
    if !gpu() {
        return;
    }
    // 72 rows of 1 to 600 tokens. With one attention block per SM a pass of 66 rows or more
    // runs one split a row, which the balanced grid takes: its warps' runs of 32 or more
    // tiles hold some (row, kv head) pairs whole and cut others into two or three pieces
    // merged by the last, rows end mid-tile and mid-page, and a graph of 80 rows has 8 empty
    // ones. Pages of 16 and 32 tokens (a tile on either half of a page).
    let n = 72;
    let prompts: Vec<Vec<u32>> = (0..n)
        .map(|i| {
            let len = match i % 9 {
                0 => 600,
                1 => 1,
                2 => 16,
                _ => 20 + (37 * i) % 400,
            };
            prompt(len, i)
        })
        .collect();
    let steps = 3;
    let cpu = CpuModel::seeded(&ModelShape::named("tiny").unwrap(), SEED);
    let r = cpu_reference(&cpu, &prompts, steps);
    for page in [16usize, 32] {
        let make = |grid: AttnGrid| {
            tiny_with(true, |c| {
                c.max_batch_size = 80;
                c.tokens_per_block = page;
                c.kv_pages = Some(6000);
                c.prefill_chunk = 256;
                c.step = Some(StepOptions {
                    attn_blocks_per_sm: 1,
                    attn_grid: grid,
                    ..StepOptions::default()
                });
            })
        };
        let mut split = make(AttnGrid::Split);
        let mut bal = make(AttnGrid::Balanced);
        let mut auto = make(AttnGrid::Auto);
        assert!(bal.step_options().describe().contains("balanced"));
        // Against the f32 CPU model, as every launch is checked.
        for launch in [Launch::Graph, Launch::Eager] {
            let rep = run(&mut bal, &r, launch).unwrap();
            eprintln!("balanced, pages of {page}, {launch:?}: {rep:?}");
            assert!(rep.max_rel_err < 3e-2, "{rep:?}");
            assert!(rep.greedy_agree * 10 >= rep.positions * 9, "{rep:?}");
        }
        // Against the split grid, step by step from the same caches: only the order of the
        // softmax merges differs.
        let pages: Vec<Vec<u32>> = (0..n)
            .map(|i| {
                let per = (prompts[i].len() + steps + 1).div_ceil(page);
                (0..per).map(|j| (j * n + i) as u32).collect()
            })
            .collect();
        for (i, p) in prompts.iter().enumerate() {
            let a = split.prefill(i as u64, p, &pages[i]).unwrap();
            let b = bal.prefill(i as u64, p, &pages[i]).unwrap();
            auto.prefill(i as u64, p, &pages[i]).unwrap();
            assert_eq!(a.0, b.0, "prefill token of row {i}");
        }
        let (mut worst, mut differ, mut compared) = (0f64, 0, 0);
        for s in 0..steps {
            let rows: Vec<StepRow> = (0..n)
                .map(|i| {
                    row(
                        i as u64,
                        prompts[i].len() + s,
                        r.meta.tokens[i][s],
                        &pages[i],
                    )
                })
                .collect();
            for launch in [Launch::Graph, Launch::Eager] {
                let (ta, la) = split.decode(&rows, launch, true).unwrap();
                let (tb, lb) = bal.decode(&rows, launch, true).unwrap();
                // One row of 600 tokens among rows of 1 to 420: uneven, so the per-pass
                // choice takes the balanced grid, its graph or its eager launch.
                let (tc, lc) = auto.decode(&rows, launch, true).unwrap();
                assert_eq!((&tc, &lc), (&tb, &lb), "auto on uneven rows, {launch:?}");
                for (i, (x, y)) in lb.iter().zip(&la).enumerate() {
                    worst = worst.max(rel_errors(x, y).0);
                    if ta[i] != tb[i] {
                        eprintln!(
                            "step {s} {launch:?} row {i}: token {} against {}",
                            tb[i], ta[i]
                        );
                        differ += 1;
                    }
                }
                compared += ta.len();
            }
        }
        eprintln!(
            "pages of {page}: balanced against split, max rel err {worst:.2e}, {differ} of \
             {compared} greedy tokens differ"
        );
        assert!(worst < 1e-2, "{worst:.2e}");
        // A greedy choice between two logits closer than the merges' rounding may flip (the
        // CPU reference above disagrees with the GPU at one such position); no more than that.
        assert!(differ * 100 <= compared, "{differ} of {compared}");
        // Rows of one length: the choice keeps the split grid, bit for bit.
        let even: Vec<(u64, Vec<u32>, Vec<u32>)> = (0..n)
            .map(|i| {
                let id = (1000 + i) as u64;
                let first = (n * (600 + steps + 1).div_ceil(page) + i * 8) as u32;
                (id, prompt(100, i), (first..first + 8).collect())
            })
            .collect();
        for (id, p, pg) in &even {
            split.prefill(*id, p, pg).unwrap();
            auto.prefill(*id, p, pg).unwrap();
        }
        let rows: Vec<StepRow> = even
            .iter()
            .map(|(id, p, pg)| row(*id, p.len(), 1, pg))
            .collect();
        for launch in [Launch::Graph, Launch::Eager] {
            let a = split.decode(&rows, launch, true).unwrap();
            let c = auto.decode(&rows, launch, true).unwrap();
            assert_eq!(a, c, "auto on even rows, {launch:?}");
        }
    }
}

#[test]
fn kernels_compile_with_nvrtc_for_sm_90_for_every_head_dim_and_group() {
    if !LibraryProbe::run().nvrtc {
        eprintln!("skipping: no CUDA (libnvrtc)");
        return;
    }
    let opts = cudarc::nvrtc::CompileOptions {
        arch: Some("sm_90"),
        options: vec!["--std=c++17".into()],
        ..Default::default()
    };
    let shapes = all_attn_shapes();
    let ptx =
        cudarc::nvrtc::compile_ptx_with_opts(genslot::gpu::cuda::kernel_source(&shapes), opts)
            .unwrap_or_else(|e| panic!("NVRTC: {e:?}"));
    let text = ptx.to_src();
    for name in genslot::gpu::cuda::kernel_names(&shapes) {
        assert!(
            text.contains(&format!(".entry {name}(")),
            "{name} missing from the PTX"
        );
    }
}

/// A seeded checkpoint of `tiny`'s size with `heads` over `kv_heads` of width `hd`.
fn gqa_checkpoint(heads: usize, kv_heads: usize, hd: usize) -> (tempfile::TempDir, ModelShape) {
    let shape = ModelShape {
        heads,
        kv_heads,
        head_dim: hd,
        tied_embeddings: true,
        rope_scaling: RopeScaling::llama3(8.0),
        rope_theta: 500_000.0,
        ..ModelShape::named("tiny").unwrap()
    };
    let dir = tempfile::tempdir().unwrap();
    write_hf_checkpoint(dir.path(), &shape, SEED).unwrap();
    (dir, shape)
}

/// SmolLM2's grouping (9 heads over 3), Qwen2-7B's (28 over 4, head_dim 128), 16 and 12
/// (the MMA's bottom rows in use) and 5, each with llama3 RoPE scaling and tied embeddings,
/// against the f32 CPU reference, graph and eager.
#[test]
fn every_group_size_matches_the_cpu_reference() {
    if !gpu() {
        return;
    }
    let prompts = vec![prompt(3, 0), prompt(40, 1), prompt(77, 2), prompt(300, 4)];
    for (heads, kv, hd) in [
        (9, 3, 64),
        (28, 4, 128),
        (16, 1, 64),
        (16, 1, 128),
        (12, 1, 64),
        (10, 2, 64),
    ] {
        let (dir, shape) = gqa_checkpoint(heads, kv, hd);
        let cpu = CpuModel::from_fn(&shape, |t| {
            genslot::gpu::cuda::init::init_tensor_f32(&shape, SEED, t)
        });
        let r = cpu_reference(&cpu, &prompts, 8);
        for graphs in [true, false] {
            let mut b = match CudaBackend::new(tiny_cfg(
                ModelSource::Checkpoint(dir.path().to_path_buf()),
                graphs,
            )) {
                Ok(b) => b,
                Err(e) => panic!("{heads}/{kv} heads, head_dim {hd}: {e}"),
            };
            let launch = if graphs { Launch::Graph } else { Launch::Eager };
            let rep = run(&mut b, &r, launch).unwrap();
            eprintln!("{heads}/{kv} heads, head_dim {hd}, {launch:?}: {rep:?}");
            assert!(rep.max_rel_err < 3e-2, "{heads}/{kv}/{hd}: {rep:?}");
            assert!(rep.greedy_agree * 10 >= rep.positions * 9, "{rep:?}");
        }
    }
}

fn sampled(temperature: f32, top_p: f32, top_k: u32, seed: u64) -> SamplingParams {
    SamplingParams {
        temperature,
        top_p,
        top_k,
        seed: Some(seed),
    }
}

/// One row of each sampling mode: greedy (rows 0 and 7, the second as top-k 1), temperature,
/// top-p, top-k, both, top-p 0.01.
fn sampling_modes() -> [SamplingParams; 8] {
    [
        SamplingParams::GREEDY,
        sampled(1.0, 1.0, 0, 1),
        sampled(0.7, 0.9, 0, 2),
        sampled(1.3, 1.0, 40, 3),
        sampled(1.0, 0.5, 20, 4),
        sampled(2.0, 0.95, 0, 5),
        sampled(1.0, 0.01, 0, 6),
        sampled(0.5, 1.0, 1, 7),
    ]
}

/// The device sampler against `sampling::sample_row` on the same logits (read back from the
/// device): greedy, temperature, top-k, top-p, a banned token.
#[test]
fn device_sampling_draws_what_the_cpu_sampler_draws_on_the_same_logits() {
    if !gpu() {
        return;
    }
    let mut b = tiny(true);
    let pages: Vec<Vec<u32>> = (0..8u32).map(|i| (i * 4..i * 4 + 4).collect()).collect();
    let mut last = Vec::new();
    for (i, pg) in pages.iter().enumerate() {
        last.push(b.prefill(i as u64, &prompt(20 + i, i), pg).unwrap().0);
    }
    let params = sampling_modes();
    let (mut agree, mut total) = (0, 0);
    for step in 0..6u32 {
        let rows: Vec<StepRow> = (0..8)
            .map(|i| row(i as u64, 20 + i + step as usize, last[i], &pages[i]))
            .collect();
        let samp: Vec<_> = params
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let banned = (i == 1).then_some(last[i]);
                p.device_row(p.seed_for(i as u64), 100 + u64::from(step), banned)
            })
            .collect();
        let (toks, logits) = b.decode_sampled(&rows, &samp, Launch::Graph, true).unwrap();
        for i in 0..8 {
            let want = sample_row(&logits[i], &samp[i]);
            agree += (toks[i] == want) as usize;
            total += 1;
            if toks[i] != want {
                eprintln!("step {step} row {i}: device {} cpu {want}", toks[i]);
            }
            if i == 1 {
                assert_ne!(toks[i], last[i], "the banned token was drawn");
            }
            last[i] = toks[i];
        }
    }
    eprintln!("device vs CPU sampler: {agree}/{total}");
    assert!(agree * 20 >= total * 19, "{agree}/{total}");
}

/// The device sampler alone against `sampling::sample_row` on the same logits, at a
/// vocabulary of 128256 (rows of whole float4s: the vector loads) and of 1027 (rows off
/// 16-byte alignment: the scalar loads): every mode, a banned token, a NaN, and a maximum
/// held by two tokens (the first index wins).
#[test]
fn the_device_sampler_draws_what_the_cpu_sampler_draws_at_any_vocabulary_size() {
    if !gpu() {
        return;
    }
    let b = tiny(false);
    // The step's modes, then top-k's paths through the device sampler (sample.cu): k 50 with
    // 60 logits tied at the k-th (the candidates in shared memory), k 3000 (more than it
    // keeps there: the whole-row path), k 2048 with top-p (the largest sort), k 50 under a
    // tie of thousands (more candidates than it keeps: the whole-row path again), k 40 with
    // the maximum banned. Then top-p alone: on logits four times as wide, whose nucleus is a
    // few tokens (its candidates in shared memory), the same with the maximum banned, with the
    // target reached inside 60 tied logits, and on the plain logits (at vocabulary 128256 a
    // nucleus of tens of thousands: the whole-row path; at 1027 nearly the whole row, gathered).
    let modes: Vec<SamplingParams> = sampling_modes()
        .into_iter()
        .chain([
            sampled(0.8, 0.95, 50, 8),
            sampled(1.0, 1.0, 3000, 9),
            sampled(1.0, 0.9, 2048, 10),
            sampled(1.0, 0.95, 50, 11),
            sampled(0.7, 1.0, 40, 12),
            sampled(0.8, 0.95, 0, 13),
            sampled(0.7, 0.95, 0, 14),
            sampled(1.0, 0.9, 0, 15),
            sampled(1.0, 0.95, 0, 16),
        ])
        .collect();
    for vocab in [128_256usize, 1027] {
        let (mut agree, mut total) = (0, 0);
        for round in 0..4u64 {
            // Seeded logits, a few standard deviations wide, with a tie for the maximum in
            // row 0, a NaN in row 2, the ties above, rows 13 and 14 four times as wide, and a
            // banned token in rows 3, 12 and 14.
            let mut rng = SmallRng::seed_from_u64((round << 32) ^ vocab as u64);
            let mut logits: Vec<f32> = (0..modes.len() * vocab)
                .map(|_| rng.random_range(-6.0f32..6.0))
                .collect();
            logits[17] = 50.0;
            logits[vocab - 3] = 50.0;
            logits[2 * vocab + 5] = f32::NAN;
            for v in &mut logits[13 * vocab..15 * vocab] {
                *v *= 4.0;
            }
            for row in [8, 15] {
                for j in 0..60 {
                    logits[row * vocab + 11 + 13 * j] = 30.0;
                }
            }
            let tied = 3000.min(vocab - 27);
            for j in 0..tied {
                logits[11 * vocab + 27 + j * (vocab - 27) / tied] = 20.0;
            }
            let samp: Vec<_> = modes
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    let row = &logits[i * vocab..(i + 1) * vocab];
                    let top = row
                        .iter()
                        .enumerate()
                        .filter(|(_, v)| !v.is_nan())
                        .max_by(|a, b| a.1.total_cmp(b.1))
                        .map(|(j, _)| j as u32);
                    let banned = if [3, 12, 14].contains(&i) { top } else { None };
                    p.device_row(p.seed_for(i as u64), 10 + round, banned)
                })
                .collect();
            let toks = b.sample_logits(&logits, vocab, &samp).unwrap();
            assert_eq!(toks[0], 17, "greedy takes the first of two equal maxima");
            for (i, s) in samp.iter().enumerate() {
                let want = sample_row(&logits[i * vocab..(i + 1) * vocab], s);
                // Without top-p no float sum enters the draw: the device must agree exactly.
                if s.top_p >= 1.0 {
                    assert_eq!(toks[i], want, "vocab {vocab} round {round}: row {i}, {s:?}");
                }
                if s.banned >= 0 {
                    assert_ne!(toks[i] as i32, s.banned, "the banned token was drawn");
                }
                agree += (toks[i] == want) as usize;
                total += 1;
            }
        }
        eprintln!("vocab {vocab}: device vs CPU sampler {agree}/{total}");
        assert!(agree * 20 >= total * 19, "vocab {vocab}: {agree}/{total}");
    }
}

/// A seeded sampled request draws the same tokens alone, in a batch with others, and when
/// it sits out steps (paused in place) in between.
#[test]
fn a_seeded_request_draws_the_same_tokens_alone_batched_and_paused() {
    if !gpu() {
        return;
    }
    let p = sampled(1.0, 0.9, 50, 77);
    let gen = |batch: usize, pause_at: Option<u32>| -> Vec<u32> {
        let mut b = tiny_invariant();
        let pages: Vec<Vec<u32>> = (0..batch as u32)
            .map(|i| (i * 8..i * 8 + 8).collect())
            .collect();
        let mut last = Vec::new();
        let mut ctx = Vec::new();
        for (i, pg) in pages.iter().enumerate() {
            let pr = prompt(30, i);
            let row0 = p.device_row(p.seed_for(0), pr.len() as u64, None);
            last.push(b.prefill_sampled(i as u64, &pr, pg, row0).unwrap().0);
            ctx.push(pr.len());
        }
        let mut out = vec![last[0]];
        let mut step = 0u32;
        while out.len() < 12 {
            step += 1;
            let paused = pause_at.is_some_and(|s| step == s || step == s + 1);
            let ids: Vec<usize> = (0..batch).filter(|&i| i != 0 || !paused).collect();
            let rows: Vec<StepRow> = ids
                .iter()
                .map(|&i| row(i as u64, ctx[i], last[i], &pages[i]))
                .collect();
            let samp: Vec<_> = ids
                .iter()
                .map(|&i| p.device_row(p.seed_for(0), ctx[i] as u64 + 1, None))
                .collect();
            let (toks, _) = b
                .decode_sampled(&rows, &samp, Launch::Graph, false)
                .unwrap();
            for (&i, t) in ids.iter().zip(toks) {
                last[i] = t;
                ctx[i] += 1;
                if i == 0 {
                    out.push(t);
                }
            }
        }
        out
    };
    let alone = gen(1, None);
    assert_eq!(gen(1, None), alone, "run to run");
    assert_eq!(gen(5, None), alone, "in a batch of 5");
    assert_eq!(gen(5, Some(3)), alone, "paused for two steps");
}

/// With the model's EOS set to the token greedy decoding produces, `min_tokens` 3 keeps it
/// out of the first three tokens and lets it through after.
#[test]
fn min_tokens_keeps_the_eos_token_out_until_enough_tokens_were_produced() {
    if !gpu() {
        return;
    }
    let p = prompt(25, 5);
    let pages: Vec<u32> = (0..8).collect();
    let (greedy_first, _) = tiny(true).prefill(1, &p, &pages).unwrap();
    let mut b = tiny_with(true, |c| c.eos_token = Some(greedy_first));
    let mut a = arrival(9, p.clone(), pages.clone());
    a.min_tokens = 3;
    b.context_arrival(&a).unwrap();
    let out = generate(&mut b, 9, p.len(), &pages, 6);
    assert!(!out[..3].contains(&greedy_first), "{out:?}");
    // Without min_tokens the first token is EOS.
    let mut c = tiny_with(true, |c| c.eos_token = Some(greedy_first));
    c.context_arrival(&arrival(9, p.clone(), pages.clone()))
        .unwrap();
    let first = c.step(&[row(9, p.len(), 0, &pages)]).unwrap();
    assert_eq!(first.tokens[0][0], greedy_first);
}

/// `context: transfer`: the arrival takes at least the configured bandwidth's time, runs
/// on the lane beside the steps and hands the first token over with the KV; the first step
/// emits it and decodes from it.
#[test]
fn transfer_arrival_takes_the_bandwidth_time_and_hands_over_the_first_token() {
    if !gpu() {
        return;
    }
    let gbps = 0.25;
    let b = tiny_with(true, |c| {
        c.context = ContextMode::Transfer { gbps };
        c.max_context = 2048;
        c.kv_pages = Some(160);
    });
    let mut b = b;
    let lane = b.context_lane().expect("transfer mode has a lane");
    let p = prompt(1500, 1);
    let pages: Vec<u32> = (0..95).collect();
    let req = arrival(3, p.clone(), pages.clone());
    let t0 = Instant::now();
    let arrived = lane.context_arrival(&req).unwrap();
    let handed = handed_over_token(&req, b.shape().vocab, None);
    assert_eq!(arrived.first_token, Some(handed));
    let s = arrived.seconds;
    let want = transfer_time(
        transfer_bytes(p.len(), b.shape().kv_bytes_per_token()),
        gbps,
    );
    eprintln!(
        "transfer of {} tokens: {s:.4} s (at least {want:?})",
        p.len()
    );
    assert!(s >= want.as_secs_f64() && t0.elapsed() >= want);
    let first = b.step(&[row(3, p.len(), 0, &pages)]).unwrap();
    assert_eq!(first.tokens[0].len(), 2, "{:?}", first.tokens);
    assert_eq!(first.tokens[0][0], handed);
    // Greedy on the same KV and the handed-over token decodes the same second token.
    let (again, _) = b
        .decode(&[row(3, p.len(), handed, &pages)], Launch::Eager, false)
        .unwrap();
    assert_eq!(again[0], first.tokens[0][1]);
    let second = b
        .step(&[row(3, p.len() + 1, first.tokens[0][1], &pages)])
        .unwrap();
    assert!(second.tokens[0][0] < 1024);
    b.release(3);
    assert!(matches!(
        b.step(&[row(3, p.len() + 2, 0, &pages)]),
        Err(BackendError::UnknownRequest(3))
    ));
}

/// SmolLM2 from its GGUF on the GPU (set GENSLOT_SMOLLM2_GGUF; tools/gpu/run.sh assembles
/// the file on the H200 machine): greedy tokens of the chat prompt equal the CPU reference's
/// (bf16 weights) for 32 steps, EOS ignored.
#[test]
fn smollm2_gguf_greedy_tokens_equal_the_cpu_reference_for_32_steps() {
    if !gpu() {
        return;
    }
    let Some(path) = std::env::var_os("GENSLOT_SMOLLM2_GGUF") else {
        eprintln!("skipping: GENSLOT_SMOLLM2_GGUF not set");
        return;
    };
    let path = std::path::PathBuf::from(path);
    let files = genslot::gpu::cuda::model_files::ModelFiles::open(&path).unwrap();
    let cpu = files.cpu_model(true).unwrap();
    let text = genslot::text::ModelText::load(&path).unwrap();
    let chat = genslot::server::tokenize::Tokenizer::try_render_chat(
        text.tokenizer.as_ref(),
        &[genslot::server::tokenize::ChatTurn {
            role: "user".into(),
            content: "What is the capital of France?".into(),
        }],
    )
    .unwrap();
    let ids = text.tokenizer.try_encode(&chat).unwrap();
    let r = cpu_reference(&cpu, std::slice::from_ref(&ids), 32);
    let mut cfg = CudaConfig::new(ModelSource::Checkpoint(path));
    cfg.max_batch_size = 4;
    cfg.kv_pages = Some(64);
    cfg.max_context = 1024;
    let mut b = CudaBackend::new(cfg).unwrap();
    let rep = run(&mut b, &r, Launch::Graph).unwrap();
    eprintln!("SmolLM2 vs CPU reference (teacher-forced): {rep:?}");
    // Free-running greedy on the GPU against the CPU's tokens.
    let pages: Vec<u32> = (0..8).collect();
    let (mut t, _) = b.prefill(50, &ids, &pages).unwrap();
    let mut gpu_toks = vec![t];
    for s in 0..32 {
        let (o, _) = b
            .decode(&[row(50, ids.len() + s, t, &pages)], Launch::Graph, false)
            .unwrap();
        t = o[0];
        gpu_toks.push(t);
    }
    let cpu_toks = &r.meta.tokens[0];
    let same = gpu_toks
        .iter()
        .zip(cpu_toks)
        .take_while(|(a, b)| a == b)
        .count();
    eprintln!(
        "GPU {:?}\nCPU {:?}\n{same} equal",
        text.tokenizer.try_decode(&gpu_toks),
        text.tokenizer.try_decode(cpu_toks)
    );
    assert!(same >= 33, "greedy tokens diverge after {same}");
}
