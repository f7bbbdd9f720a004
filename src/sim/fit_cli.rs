//! `genslot fit-step`: reads step-time grids (the JSON `genslot-gpu bench` writes), and
//! optionally a transfer probe's recording, fits the plant's timing (`fit`), prints every
//! residual and the `timing:` section a config (or a preset) takes.

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
    /// A recording (`serve --record`) of requests sent one at a time to an idle server with
    /// `context: transfer`, whose first step computes the first token: each one's TTFT less
    /// the fitted one-row step is a transfer time. (A backend that has the first token at
    /// arrival streams it at scheduling, with no step in its TTFT: not a probe for this.)
    #[arg(long, value_name = "FILE")]
    pub transfer_record: Option<PathBuf>,
    /// Fit a jump above this batch size (default: found in the data when it halves the error).
    #[arg(long, conflicts_with = "no_jump")]
    pub jump_above: Option<u32>,
    /// Fit no jump.
    #[arg(long)]
    pub no_jump: bool,
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

/// Transfer times from a probe's recording: per context length, the median TTFT less the
/// fitted step of one row (the median, so a cold first request does not pull the line).
fn probe_points(path: &Path, step: &StepFit) -> anyhow::Result<(Vec<TransferPoint>, usize)> {
    let rec = load_recording(path)?;
    let mut by_len: std::collections::BTreeMap<u32, Vec<f64>> = Default::default();
    for r in rec
        .records
        .iter()
        .filter(|r| r.outcome == Outcome::Completed)
    {
        if let Some(ttft) = r.ttft_s() {
            by_len.entry(r.context_tokens).or_default().push(ttft * 1e3);
        }
    }
    let mut points = Vec::new();
    let mut dropped = 0;
    for (len, mut ttfts) in by_len {
        ttfts.sort_by(f64::total_cmp);
        let median = ttfts[ttfts.len() / 2];
        let ms = median - step.ms(1, u64::from(len));
        if ms > 0.0 {
            points.push(TransferPoint {
                context_tokens: u64::from(len),
                ms,
            });
        } else {
            dropped += 1;
        }
    }
    Ok((points, dropped))
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
    if !(args.tokens_per_step.is_finite() && args.tokens_per_step >= 1.0) {
        bail!("--tokens-per-step must be at least 1");
    }
    let mut steps = Vec::new();
    let mut transfer = Vec::new();
    let mut sources = Vec::new();
    for path in &args.grids {
        let (g, what) = read_grid(path)?;
        println!("grid: {what}");
        sources.push(what);
        steps.extend(g.steps.iter().map(|r| StepPoint {
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
    print!(
        "step model: t(B, ΣL) = {:.4} ms + B·{:.5} ms + ΣL·{:.4} ns",
        step.base_ms, step.per_request_ms, step.per_kv_token_ns
    );
    match step.jump {
        Some(j) => println!(
            " + [B > {}] ({:.4} ms + (B − {})·{:.5} ms)",
            j.above, j.jump_ms, j.above, j.per_request_above_ms
        ),
        None => println!(),
    }
    print!("{}", residual_table(&step_res, "step", "ΣL"));
    if let Some(path) = &args.transfer_record {
        let (points, dropped) = probe_points(path, &step)?;
        println!(
            "transfer probe: {} context lengths (median TTFT each) from {}{}",
            points.len(),
            path.display(),
            if dropped > 0 {
                format!(" ({dropped} dropped: median TTFT not above the one-row step)")
            } else {
                String::new()
            }
        );
        transfer.extend(points);
    }
    let transfer_fit = if transfer.is_empty() {
        None
    } else {
        let (t, r) = fit_transfer(&transfer).context("fitting the transfer model")?;
        println!(
            "transfer model: {:.4} ms + context·{:.5} µs",
            t.base_ms, t.per_token_us
        );
        print!("{}", residual_table(&r, "transfer", "context"));
        Some((t, r))
    };
    let yaml = timing_yaml(
        &step,
        transfer_fit.as_ref().map(|(t, _)| t),
        args.tokens_per_step,
    );
    print!("\n{yaml}");
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
}
