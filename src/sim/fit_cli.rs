//! `genslot fit-step`: reads step-time grids (the JSON `genslot-gpu bench` writes), and
//! optionally a transfer probe's recording, fits the plant's timing (`fit`), prints every
//! residual and the `timing:` section a config (or a preset) takes.

use super::out::{say, sayln};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

use super::fit::{
    fit_steps, fit_transfer, JumpChoice, Residuals, StepFit, StepPoint, TransferFit, TransferPoint,
};
use crate::workload::{load_recording, Outcome};

#[derive(Debug, Clone, clap::Args)]
pub struct FitArgs {
    /// Step-time grids: `genslot-gpu bench --json` output (`steps[]` of batch, context,
    /// graph_ms), or any JSON with `steps[]` of batch, context and ms. Optional
    /// `transfer[]` of context_tokens, ms.
    #[arg(required = true)]
    pub grids: Vec<PathBuf>,
    /// A recording (`serve --record`) whose context arrivals to fit: each line's
    /// `kv_ready_s − admitted_s`, at any load. A recording older than those fields gives
    /// only TTFTs: it must be of requests sent one at a time to an idle server with
    /// `context: transfer` (whose first step then computed the first token), and each TTFT
    /// less the fitted one-row step is read as a transfer time.
    #[arg(long, value_name = "FILE")]
    pub transfer_record: Option<PathBuf>,
    /// Fit a jump above this batch size (default: found in the data when it halves the error).
    #[arg(long, conflicts_with = "no_jump")]
    pub jump_above: Option<u32>,
    /// Fit no jump.
    #[arg(long)]
    pub no_jump: bool,
    /// Keep the steps the bench ran on aliased pages (left out by default: they read the same
    /// pages again and again, not the KV such a batch holds). Fits made before 2026-12-06,
    /// the `h200-llama-8b` preset's among them, kept them.
    #[arg(long)]
    pub keep_aliased: bool,
    /// Tokens per step written into the timing section (speculative decoding: > 1).
    #[arg(long, default_value_t = 1.0)]
    pub tokens_per_step: f64,
    /// Write the fit, every residual and the timing section as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write the `timing:` section alone here (append it to a config without one).
    #[arg(long, value_name = "FILE")]
    pub timing: Option<PathBuf>,
}

#[derive(Deserialize)]
struct GridFile {
    device: Option<String>,
    shape: Option<String>,
    steps: Vec<GridRow>,
    #[serde(default)]
    transfer: Vec<TransferRow>,
}

#[derive(Deserialize)]
struct GridRow {
    batch: u32,
    /// Context tokens of every row.
    context: u64,
    #[serde(alias = "step_ms", alias = "ms")]
    graph_ms: f64,
    /// The bench ran this batch on fewer KV pages than its contexts need, read again and
    /// again (the card holds too little KV for it): not the step such a batch takes.
    #[serde(default)]
    pages_aliased: bool,
}

#[derive(Deserialize)]
struct TransferRow {
    context_tokens: u64,
    ms: f64,
}

#[derive(Serialize)]
struct FitReport {
    sources: Vec<String>,
    step: StepFit,
    step_residuals: Residuals,
    transfer: Option<TransferFit>,
    transfer_residuals: Option<Residuals>,
    timing_yaml: String,
}

fn read_grid(path: &Path) -> anyhow::Result<(GridFile, String)> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let g: GridFile = serde_json::from_str(&text)
        .with_context(|| format!("{}: not a step grid", path.display()))?;
    let what = format!(
        "{} ({} {}, {} steps)",
        path.display(),
        g.device.as_deref().unwrap_or("device ?"),
        g.shape.as_deref().unwrap_or("shape ?"),
        g.steps.len()
    );
    Ok((g, what))
}

/// Transfer times from a recording, and how they were read.
struct RecordedTransfers {
    points: Vec<TransferPoint>,
    /// Requests whose lines carry admission and KV-ready times.
    stamped: usize,
    /// Requests read the old way, TTFT less the one-row step.
    from_ttft: usize,
    /// Context lengths left out: a median not above zero.
    dropped: usize,
}

/// Transfer times from a recording: per context length, the median of its requests'
/// transfers (the median, so a cold first request does not pull the line). A line with
/// `admitted_s` and `kv_ready_s` gives its transfer directly, at any load. An older line
/// has only its TTFT, which for a serial `context: transfer` probe is the transfer plus the
/// one-row step that computed the first token: that step is taken off.
fn transfer_points(path: &Path, step: &StepFit) -> anyhow::Result<RecordedTransfers> {
    let rec = load_recording(path)?;
    let mut by_len: std::collections::BTreeMap<u32, Vec<f64>> = Default::default();
    let (mut stamped, mut from_ttft) = (0, 0);
    for r in &rec.records {
        let ms = match (r.admitted_s, r.kv_ready_s, r.ttft_s()) {
            (Some(a), Some(k), _) => {
                stamped += 1;
                (k - a) * 1e3
            }
            (_, _, Some(ttft)) if r.outcome == Outcome::Completed => {
                from_ttft += 1;
                ttft * 1e3 - step.ms(1, u64::from(r.context_tokens))
            }
            _ => continue,
        };
        by_len.entry(r.context_tokens).or_default().push(ms);
    }
    let mut out = RecordedTransfers {
        points: Vec::new(),
        stamped,
        from_ttft,
        dropped: 0,
    };
    for (len, mut ms) in by_len {
        ms.sort_by(f64::total_cmp);
        let median = ms[ms.len() / 2];
        if median > 0.0 {
            out.points.push(TransferPoint {
                context_tokens: u64::from(len),
                ms: median,
            });
        } else {
            out.dropped += 1;
        }
    }
    Ok(out)
}

fn residual_table(r: &Residuals, what: &str, tokens: &str) -> String {
    let mut s = format!(
        "{what}: {:>5} {:>10} {:>10} {:>10} {:>8}\n",
        "batch", tokens, "measured", "fitted", "resid"
    );
    for p in &r.points {
        s += &format!(
            "{:w$}  {:>5} {:>10} {:>10.3} {:>10.3} {:>+7.1}%\n",
            "",
            p.batch,
            p.tokens,
            p.measured_ms,
            p.fitted_ms,
            100.0 * p.rel,
            w = what.len()
        );
    }
    if let Some(w) = r.worst {
        s += &format!(
            "worst residual {:+.1}% (batch {}, {tokens} {}: measured {:.3} ms, fitted {:.3} ms); rms {:.1}%\n",
            100.0 * w.rel,
            w.batch,
            w.tokens,
            w.measured_ms,
            w.fitted_ms,
            100.0 * r.rms_rel
        );
    }
    s
}

/// The `timing:` section of a config for the fit.
fn timing_yaml(step: &StepFit, transfer: Option<&TransferFit>, tokens_per_step: f64) -> String {
    let model = step.to_step_model(tokens_per_step);
    let mut s = format!(
        "timing:\n  base_ms: {:.4}\n  per_request_ms: {:.5}\n  per_kv_token_ns: {:.4}\n",
        model.base_ms, model.per_request_ms, model.per_kv_token_ns
    );
    match model.jump_above {
        Some(j) => {
            s += &format!(
                "  jump_above: {j}\n  jump_ms: {:.4}\n  per_request_above_ms: {:.5}\n",
                model.jump_ms, model.per_request_above_ms
            )
        }
        None => s += "  jump_above: null\n  jump_ms: 0.0\n  per_request_above_ms: 0.0\n",
    }
    s += &format!("  tokens_per_step: {}\n", model.tokens_per_step);
    if let Some(t) = transfer {
        s += &format!(
            "  transfer_base_ms: {:.4}\n  transfer_per_token_us: {:.5}\n",
            t.base_ms, t.per_token_us
        );
    }
    s
}

pub fn run(args: FitArgs) -> anyhow::Result<()> {
    // The config's bounds on timing.tokens_per_step.
    if !(args.tokens_per_step.is_finite() && (1.0..=1024.0).contains(&args.tokens_per_step)) {
        bail!("--tokens-per-step must be in [1, 1024]");
    }
    let mut steps = Vec::new();
    let mut transfer = Vec::new();
    let mut sources = Vec::new();
    // One step model is one model on one card: grids that say otherwise are refused.
    let mut first: Option<(PathBuf, Option<String>, Option<String>)> = None;
    for path in &args.grids {
        let (g, what) = read_grid(path)?;
        match &first {
            None => first = Some((path.clone(), g.shape.clone(), g.device.clone())),
            Some((p0, shape, device)) => {
                let differs = |a: &Option<String>, b: &Option<String>| matches!((a, b), (Some(a), Some(b)) if a != b);
                if differs(shape, &g.shape) || differs(device, &g.device) {
                    bail!(
                        "{} is of {} on {}, {} of {} on {}: one step model fits one model on \
                         one card",
                        path.display(),
                        g.shape.as_deref().unwrap_or("?"),
                        g.device.as_deref().unwrap_or("?"),
                        p0.display(),
                        shape.as_deref().unwrap_or("?"),
                        device.as_deref().unwrap_or("?"),
                    );
                }
            }
        }
        sayln!("grid: {what}");
        let left_out = |r: &GridRow| r.pages_aliased && !args.keep_aliased;
        let aliased: Vec<String> = g
            .steps
            .iter()
            .filter(|r| left_out(r))
            .map(|r| format!("batch {} at {}", r.batch, r.context))
            .collect();
        if !aliased.is_empty() {
            sayln!(
                "left out: {} (pages aliased: the card holds too little KV for them)",
                aliased.join(", ")
            );
        }
        sources.push(what);
        steps.extend(g.steps.iter().filter(|r| !left_out(r)).map(|r| StepPoint {
            batch: r.batch,
            kv_tokens: u64::from(r.batch) * r.context,
            ms: r.graph_ms,
        }));
        transfer.extend(g.transfer.iter().map(|t| TransferPoint {
            context_tokens: t.context_tokens,
            ms: t.ms,
        }));
    }
    let jump = match (args.no_jump, args.jump_above) {
        (true, _) => JumpChoice::None,
        (false, Some(j)) => JumpChoice::Above(j),
        (false, None) => JumpChoice::Auto,
    };
    let (step, step_res) = fit_steps(&steps, jump).context("fitting the step model")?;
    say!(
        "step model: t(B, ΣL) = {:.4} ms + B·{:.5} ms + ΣL·{:.4} ns",
        step.base_ms,
        step.per_request_ms,
        step.per_kv_token_ns
    );
    match step.jump {
        Some(j) => sayln!(
            " + [B > {}] ({:.4} ms + (B − {})·{:.5} ms)",
            j.above,
            j.jump_ms,
            j.above,
            j.per_request_above_ms
        ),
        None => sayln!(),
    }
    say!("{}", residual_table(&step_res, "step", "ΣL"));
    if let Some(path) = &args.transfer_record {
        let t = transfer_points(path, &step)?;
        if t.points.is_empty() {
            bail!(
                "--transfer-record {}: no request in it gives a transfer time (none completed \
                 with its admission and KV-ready times, or a TTFT above the one-row step)",
                path.display()
            );
        }
        let mut how = Vec::new();
        if t.stamped > 0 {
            how.push(format!("{} admitted → KV-ready times", t.stamped));
        }
        if t.from_ttft > 0 {
            how.push(format!("{} TTFTs less the one-row step", t.from_ttft));
        }
        if t.dropped > 0 {
            how.push(format!("{} lengths dropped: median not above 0", t.dropped));
        }
        sayln!(
            "recorded transfers: {} context lengths (the median of each) from {} ({})",
            t.points.len(),
            path.display(),
            how.join("; ")
        );
        transfer.extend(t.points);
    }
    let transfer_fit = if transfer.is_empty() {
        None
    } else {
        let (t, r) = fit_transfer(&transfer).context("fitting the transfer model")?;
        sayln!(
            "transfer model: {:.4} ms + context·{:.5} µs",
            t.base_ms,
            t.per_token_us
        );
        say!("{}", residual_table(&r, "transfer", "context"));
        Some((t, r))
    };
    let yaml = timing_yaml(
        &step,
        transfer_fit.as_ref().map(|(t, _)| t),
        args.tokens_per_step,
    );
    say!("\n{yaml}");
    // A fit that a config refuses (a step time falling with context gives a negative
    // per_kv_token_ns) is an error here, not a file that `serve` refuses later.
    if let Err(e) = crate::config::Config::from_yaml_str(&yaml, "the fitted timing section") {
        bail!(
            "the fit is not a usable timing section ({e}); look at the residuals above: grids \
             of one model and one card, with step time growing with batch and context, fit"
        );
    }
    if let Some(path) = &args.timing {
        std::fs::write(path, &yaml).with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.json {
        let (transfer, transfer_residuals) = match transfer_fit {
            Some((t, r)) => (Some(t), Some(r)),
            None => (None, None),
        };
        let report = FitReport {
            sources,
            step,
            step_residuals: step_res,
            transfer,
            transfer_residuals,
            timing_yaml: yaml,
        };
        std::fs::write(path, serde_json::to_string_pretty(&report)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timing_section_is_a_valid_config_that_reproduces_the_fit() {
        let step = StepFit {
            base_ms: 5.9,
            per_request_ms: 0.008,
            per_kv_token_ns: 31.0,
            jump: None,
        };
        let t = TransferFit {
            base_ms: 0.5,
            per_token_us: 0.03,
        };
        let yaml = timing_yaml(&step, Some(&t), 1.0);
        let cfg = crate::config::Config::from_yaml_str(&yaml, "fit").unwrap();
        assert_eq!(cfg.timing.per_kv_token_ns, 31.0);
        assert_eq!(cfg.timing.transfer_per_token_us, 0.03);
        assert_eq!(cfg.timing.jump_above, None);
    }

    #[test]
    fn recorded_transfers_come_from_the_stamps_where_a_line_has_them_else_from_the_ttft() {
        let step = StepFit {
            base_ms: 5.0,
            per_request_ms: 0.0,
            per_kv_token_ns: 0.0,
            jump: None,
        };
        let line = |id: u64, ctx: u32, stamps: Option<(f64, f64)>, ttft: f64| {
            let mut v = serde_json::json!({
                "id": id, "run_start_unix": 0.0, "arrival_s": 1.0, "context_tokens": ctx,
                "max_tokens": 4, "output_tokens": 4, "first_token_s": 1.0 + ttft,
                "finish_s": 2.0 + ttft, "pauses": 0, "outcome": "completed",
            });
            if let Some((a, k)) = stamps {
                v["admitted_s"] = a.into();
                v["kv_ready_s"] = k.into();
            }
            v.to_string()
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.jsonl");
        let lines = [
            // Stamped, under load: a long queue wait in the TTFT does not matter.
            line(0, 1000, Some((3.0, 3.010)), 9.0),
            line(1, 1000, Some((4.0, 4.012)), 9.0),
            line(2, 1000, Some((5.0, 5.011)), 9.0),
            // Unstamped (an older serial probe): TTFT 25 ms less the 5 ms step.
            line(3, 4000, None, 0.025),
            // A transfer the one-row step covers: dropped.
            line(4, 8000, None, 0.004),
        ];
        std::fs::write(&path, lines.join("\n") + "\n").unwrap();
        let t = transfer_points(&path, &step).unwrap();
        assert_eq!((t.stamped, t.from_ttft, t.dropped), (3, 2, 1));
        assert_eq!(t.points.len(), 2);
        assert_eq!(t.points[0].context_tokens, 1000);
        assert!((t.points[0].ms - 11.0).abs() < 1e-6, "{}", t.points[0].ms);
        assert_eq!(t.points[1].context_tokens, 4000);
        assert!((t.points[1].ms - 20.0).abs() < 1e-6, "{}", t.points[1].ms);
    }
}
