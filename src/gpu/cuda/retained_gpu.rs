//! `genslot-gpu check-retained`: the retained-state checks (`retained_check`) on the CUDA
//! backend. With the drafter: plain against drafted greedy tokens on the repetitive and the
//! non-repetitive prompt set (`draft_sets`), tokens per step and the wall time of each, and
//! paused requests against their solo runs; for `tiny` always, for a real checkpoint (its
//! chat template, EOS ignored) when one is given. With the hybrid shape: `tiny-hybrid`
//! against its f32 CPU reference (teacher-forced logits, graph and eager), and paused
//! requests against their solo runs.

use std::path::PathBuf;

use serde::Serialize;

use super::backend::{CudaBackend, CudaConfig, Launch};
use super::cpu_ref::CpuModel;
use super::draft::DraftConfig;
use super::draft_sets::{synthetic, NON_REPETITIVE, REPETITIVE};
use super::parity::{self, ParityReport};
use super::retained_check::{
    drafted_vs_plain, mixed_sampling, paused_vs_solo, DraftedReport, PausedReport,
};
use super::shape::ModelShape;
use super::step_options::StepOptions;
use super::weights::ModelSource;
use crate::gpu::{BackendError, ContextArrival};
use crate::sampling::SamplingParams;
use crate::server::tokenize::ChatTurn;

#[derive(Debug, Clone)]
pub struct RetainedOptions {
    /// Tokens generated per request.
    pub tokens: usize,
    /// A real checkpoint for the drafter's chat prompts (SmolLM2's GGUF, say).
    pub model: Option<PathBuf>,
    pub draft: DraftConfig,
}

#[derive(Debug, Clone, Serialize)]
pub struct RetainedReport {
    pub device: String,
    pub draft: (u32, u32, u32),
    pub drafted: Vec<DraftedReport>,
    pub paused: Vec<PausedReport>,
    /// `tiny-hybrid` on the GPU against its f32 CPU reference, graph then eager.
    pub hybrid_parity: Vec<ParityReport>,
    /// Every drafted set identical and every paused request identical.
    pub identical: bool,
}

const SEED: u32 = 11;
const PAGE: usize = 16;

fn config(source: ModelSource, tokens: usize, draft: Option<DraftConfig>) -> CudaConfig {
    let mut c = CudaConfig::new(source);
    c.max_batch_size = 8;
    c.tokens_per_block = PAGE;
    c.kv_pages = Some(4096);
    c.max_context = 2048 + tokens;
    c.prefill_chunk = 64;
    c.max_resident = 16;
    c.drafter = draft;
    // Every check here compares tokens across batches of different sizes.
    c.step = Some(StepOptions::invariant());
    c
}

/// Request i: id 100 + i, slot i, its own run of pages.
fn arrivals(
    prompts: &[Vec<u32>],
    sampling: &dyn Fn(usize) -> SamplingParams,
) -> Vec<ContextArrival> {
    prompts
        .iter()
        .enumerate()
        .map(|(i, p)| ContextArrival {
            id: 100 + i as u64,
            slot: i as u32,
            prompt: p.clone(),
            pages: pages_of(100 + i as u64),
            sampling: sampling(i),
            min_tokens: 0,
        })
        .collect()
}

/// 128 pages of 16 tokens a request: 2,048 tokens of prompt, output and drafts.
fn pages_of(id: u64) -> Vec<u32> {
    let i = id.saturating_sub(100) as u32;
    (i * 128..(i + 1) * 128).collect()
}

pub fn run(o: &RetainedOptions) -> Result<RetainedReport, BackendError> {
    let n = o.tokens;
    let d = o.draft;
    let pages = |id: u64| pages_of(id);
    let tiny = || ModelSource::Seeded {
        shape: "tiny".into(),
        seed: SEED,
    };
    let mut plain = CudaBackend::new(config(tiny(), n, None))?;
    let mut drafted = CudaBackend::new(config(tiny(), n, Some(d)))?;
    let device = plain.device_name().to_owned();
    let greedy = |_| SamplingParams::GREEDY;
    let set = |rep| (0..4).map(|i| synthetic(rep, 1024, i)).collect::<Vec<_>>();
    let mut rep = RetainedReport {
        device,
        draft: (d.window, d.max_draft_len, d.max_ngram),
        drafted: Vec::new(),
        paused: Vec::new(),
        hybrid_parity: Vec::new(),
        identical: false,
    };
    for (name, r) in [("tiny repetitive", true), ("tiny non-repetitive", false)] {
        let reqs = arrivals(&set(r), &greedy);
        rep.drafted.push(drafted_vs_plain(
            name,
            &mut plain,
            &mut drafted,
            &reqs,
            n,
            &pages,
        )?);
    }
    let six: Vec<Vec<u32>> = (0..6).map(|i| synthetic(i % 2 == 0, 1024, i)).collect();
    rep.paused.push(paused_vs_solo(
        "tiny drafted",
        &mut drafted,
        &mut plain,
        &arrivals(&six, &mixed_sampling),
        n,
        &pages,
    )?);
    drop((plain, drafted));

    if let Some(path) = &o.model {
        let text = crate::text::ModelText::load(path)
            .map_err(|e| BackendError::Failed(format!("{}: {e}", path.display())))?;
        let tok = text.server_tokenizer();
        let chat = |q: &&str| -> Result<Vec<u32>, BackendError> {
            let turn = ChatTurn {
                role: "user".into(),
                content: (*q).into(),
            };
            let s = tok.try_render_chat(&[turn]).map_err(BackendError::Failed)?;
            Ok(tok.encode(&s))
        };
        let src = || ModelSource::Checkpoint(path.clone());
        let mut plain = CudaBackend::new(config(src(), n, None))?;
        let mut drafted = CudaBackend::new(config(src(), n, Some(d)))?;
        let name = plain.shape().name.clone();
        for (label, qs) in [
            ("repetitive", REPETITIVE),
            ("non-repetitive", NON_REPETITIVE),
        ] {
            let prompts = qs.iter().map(chat).collect::<Result<Vec<_>, _>>()?;
            let reqs = arrivals(&prompts, &greedy);
            rep.drafted.push(drafted_vs_plain(
                &format!("{name} {label}"),
                &mut plain,
                &mut drafted,
                &reqs,
                n,
                &pages,
            )?);
        }
        let prompts = REPETITIVE
            .iter()
            .chain(NON_REPETITIVE)
            .take(6)
            .map(chat)
            .collect::<Result<Vec<_>, _>>()?;
        rep.paused.push(paused_vs_solo(
            &format!("{name} drafted"),
            &mut drafted,
            &mut plain,
            &arrivals(&prompts, &mixed_sampling),
            n,
            &pages,
        )?);
    }

    let hybrid = || ModelSource::Seeded {
        shape: "tiny-hybrid".into(),
        seed: SEED,
    };
    let shape =
        ModelShape::named("tiny-hybrid").map_err(|e| BackendError::Failed(e.to_string()))?;
    let cpu = CpuModel::seeded(&shape, SEED);
    let prompts: Vec<Vec<u32>> = [5usize, 33, 70, 1]
        .iter()
        .enumerate()
        .map(|(i, &len)| {
            (0..len)
                .map(|j| ((j * 131 + i * 17 + 3) % 1024) as u32)
                .collect()
        })
        .collect();
    let reference = parity::cpu_reference(&cpu, &prompts, 16);
    for launch in [Launch::Graph, Launch::Eager] {
        let mut c = config(hybrid(), n, None);
        c.cuda_graphs = launch == Launch::Graph;
        c.prefill_chunk = 32; // several chunks for the 70-token prompt
        let mut b = CudaBackend::new(c)?;
        rep.hybrid_parity
            .push(parity::run(&mut b, &reference, launch)?);
    }
    let mut b = CudaBackend::new(config(hybrid(), n, None))?;
    let mut alone = CudaBackend::new(config(hybrid(), n, None))?;
    rep.paused.push(paused_vs_solo(
        "tiny-hybrid",
        &mut b,
        &mut alone,
        &arrivals(&six, &mixed_sampling),
        n,
        &pages,
    )?);
    rep.identical = rep.drafted.iter().all(|r| r.identical == r.prompts)
        && rep.paused.iter().all(|r| r.identical == r.requests);
    Ok(rep)
}
