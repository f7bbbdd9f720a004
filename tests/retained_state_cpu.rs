//! The retained state made real, proven on the f32 CPU reference backend (no GPU):
//! - prompt-lookup drafting with one-step verification emits exactly the tokens plain
//!   decoding emits (greedy and seeded sampling), on a repetitive and a non-repetitive prompt
//!   set, for `tiny` and for SmolLM2 when its GGUF is installed; on the repetitive set it
//!   emits more than one token per step;
//! - the hybrid shape's recurrence: prefill in one chunk equals token by token, and the state
//!   carries the context;
//! - a request left out of steps (paused or displaced: it keeps its drafter window, its KV or
//!   its recurrent state, and the backend sees no row) gives exactly its solo output, with the
//!   drafter on and with the hybrid shape.

use std::path::PathBuf;
use std::sync::Arc;

use genslot::gpu::cuda::cpu_backend::CpuRefBackend;
use genslot::gpu::cuda::cpu_ref::CpuModel;
use genslot::gpu::cuda::draft::DraftConfig;
use genslot::gpu::cuda::draft_sets::{synthetic, NON_REPETITIVE, REPETITIVE};
use genslot::gpu::cuda::model_files::ModelFiles;
use genslot::gpu::cuda::retained_check::{drafted_vs_plain, mixed_sampling, paused_vs_solo};
use genslot::gpu::cuda::shape::ModelShape;
use genslot::gpu::{BackendCapacity, ContextArrival};
use genslot::sampling::SamplingParams;
use genslot::server::tokenize::ChatTurn;
use genslot::text::ModelText;

const DRAFT: DraftConfig = DraftConfig {
    window: 64,
    max_draft_len: 4,
    max_ngram: 3,
};

fn capacity() -> BackendCapacity {
    BackendCapacity {
        kv_pages: 4096,
        tokens_per_block: 32,
        seq_slots: 16,
    }
}

fn seeded(shape: &str) -> Arc<CpuModel> {
    Arc::new(CpuModel::seeded(&ModelShape::named(shape).unwrap(), 11))
}

fn plain(m: &Arc<CpuModel>, eos: Option<u32>) -> CpuRefBackend {
    CpuRefBackend::new(m.clone(), eos, capacity())
}

fn drafting(m: &Arc<CpuModel>, eos: Option<u32>) -> CpuRefBackend {
    plain(m, eos).with_drafter(DRAFT, 8).unwrap()
}

fn arrival(i: usize, prompt: Vec<u32>, sampling: SamplingParams) -> ContextArrival {
    ContextArrival {
        id: 100 + i as u64,
        slot: i as u32,
        prompt,
        pages: Vec::new(),
        sampling,
        min_tokens: 0,
    }
}

fn no_pages(_: u64) -> Vec<u32> {
    Vec::new()
}

/// Each prompt alone, plain and drafted: the tokens must be equal; returns the drafted
/// backend's tokens per computed step.
fn drafted_equals_plain(
    m: &Arc<CpuModel>,
    prompts: &[Vec<u32>],
    n: usize,
    sampling: SamplingParams,
    label: &str,
) -> f64 {
    let reqs: Vec<ContextArrival> = (prompts.iter().enumerate())
        .map(|(i, p)| arrival(i, p.clone(), sampling))
        .collect();
    let r = drafted_vs_plain(
        label,
        &mut plain(m, None),
        &mut drafting(m, None),
        &reqs,
        n,
        &no_pages,
    )
    .unwrap();
    eprintln!("{}", serde_json::to_string(&r).unwrap());
    assert_eq!(
        r.identical,
        prompts.len(),
        "{label}: {:?}",
        r.first_difference
    );
    assert!(r.drafted_steps <= r.plain_steps);
    r.tokens_per_step
}

#[test]
fn drafted_greedy_decoding_equals_plain_greedy_on_tiny_and_accepts_on_repetition() {
    let m = seeded("tiny");
    let set = |rep| (0..4).map(|i| synthetic(rep, 1024, i)).collect::<Vec<_>>();
    let g = SamplingParams::GREEDY;
    let rep = drafted_equals_plain(&m, &set(true), 48, g, "tiny repetitive");
    let non = drafted_equals_plain(&m, &set(false), 48, g, "tiny non-repetitive");
    assert!(rep > 1.0, "prompt lookup accepts on repetition: {rep}");
    assert!(non >= 1.0);
}

#[test]
fn drafted_seeded_sampling_equals_plain_seeded_sampling() {
    let m = seeded("tiny");
    let p = SamplingParams {
        temperature: 0.8,
        top_p: 0.95,
        top_k: 40,
        seed: Some(5),
    };
    let prompts: Vec<Vec<u32>> = (0..3).map(|i| synthetic(i != 1, 1024, i)).collect();
    drafted_equals_plain(&m, &prompts, 40, p, "tiny seeded");
}

/// Six requests (greedy and seeded, repetitive and not) interleaved on `b`, each left out
/// of two steps in five, against each alone on a plain backend.
fn interleaving_keeps_solo_outputs(m: &Arc<CpuModel>, b: &mut CpuRefBackend) {
    let reqs: Vec<ContextArrival> = (0..6)
        .map(|i| arrival(i, synthetic(i % 2 == 0, 1024, i as u32), mixed_sampling(i)))
        .collect();
    let r = paused_vs_solo("cpu", b, &mut plain(m, None), &reqs, 40, &no_pages).unwrap();
    eprintln!("{}", serde_json::to_string(&r).unwrap());
    assert_eq!(r.identical, reqs.len());
    assert!(
        r.left_out > 6 * 10,
        "every request is left out many times: {r:?}"
    );
}

#[test]
fn paused_and_displaced_requests_keep_their_drafter_window_and_their_output() {
    let m = seeded("tiny");
    let mut b = drafting(&m, None);
    interleaving_keeps_solo_outputs(&m, &mut b);
    let s = b.draft_stats();
    assert!(
        s.emitted > s.rows,
        "drafts were accepted around the pauses: {s:?}"
    );
}

#[test]
fn paused_and_displaced_hybrid_requests_keep_their_recurrent_state_and_their_output() {
    let m = seeded("tiny-hybrid");
    interleaving_keeps_solo_outputs(&m, &mut plain(&m, None));
}

#[test]
fn the_hybrid_recurrence_prefills_in_one_chunk_as_token_by_token_and_carries_context() {
    let m = seeded("tiny-hybrid");
    let s = &m.shape;
    assert_eq!(s.recurrent_layers(), 2);
    let prompt = [5u32, 900, 17, 3, 256, 1000, 42, 42, 7];
    let mut one = m.new_cache();
    let all = m.forward(&mut one, &prompt);
    let mut step = m.new_cache();
    for (i, &t) in prompt.iter().enumerate() {
        let l = m.forward(&mut step, &[t]);
        let e = max_rel(&l[0], &all[i]);
        assert!(e < 1e-5, "position {i}: {e}");
    }
    let states: Vec<&[f32]> = one.states().collect();
    assert_eq!(states.len(), 2);
    assert_eq!(
        states.iter().map(|x| x.len() * 4).sum::<usize>() as u64,
        s.recurrent_state_bytes()
    );
    for (a, b) in states.iter().zip(step.states()) {
        assert!(max_rel(a, b) < 1e-5);
    }
    // Another first token changes the last position's logits.
    let mut other = m.new_cache();
    let diff = m.forward(&mut other, &[6, 900, 17, 3, 256, 1000, 42, 42, 7]);
    assert!(max_rel(&diff[8], &all[8]) > 1e-4);
    // A cache with a recurrent state cannot drop positions (drafting is refused there).
    assert!(!one.truncate(5));
    assert_eq!(one.len, prompt.len());
}

fn max_rel(a: &[f32], b: &[f32]) -> f32 {
    let m = b.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(1e-30);
    a.iter()
        .zip(b)
        .fold(0.0f32, |e, (x, y)| e.max((x - y).abs()))
        / m
}

fn gguf_path() -> Option<PathBuf> {
    genslot::gguf::smollm2_gguf()
}

/// SmolLM2 through the loader the GPU uses, with its chat template: drafted greedy answers
/// equal plain greedy ones for the first question of each prompt set (12 tokens, EOS ignored;
/// the whole sets run in `examples/draft_acceptance.rs`, in release: the 135M-parameter model
/// takes about a second a token in a debug test).
#[test]
fn smollm2_drafted_greedy_equals_plain_greedy_on_both_prompt_sets() {
    let Some(path) = gguf_path() else {
        eprintln!("skipping: SmolLM2-135M-Instruct.Q4_1.gguf not found");
        return;
    };
    let text = ModelText::load(&path).unwrap_or_else(|e| panic!("{e}"));
    let tok = text.server_tokenizer();
    let m = Arc::new(
        ModelFiles::open(&path)
            .and_then(|f| f.cpu_model(true))
            .unwrap_or_else(|e| panic!("{e}")),
    );
    let chat = |q: &str| {
        let turn = ChatTurn {
            role: "user".into(),
            content: q.into(),
        };
        tok.encode(&tok.try_render_chat(&[turn]).unwrap())
    };
    let g = SamplingParams::GREEDY;
    let r = drafted_equals_plain(&m, &[chat(REPETITIVE[0])], 12, g, "SmolLM2 repetitive");
    let n = drafted_equals_plain(&m, &[chat(NON_REPETITIVE[0])], 12, g, "SmolLM2 non-rep.");
    assert!(r > 1.0, "{r}");
    assert!(n >= 1.0, "{n}");
}
