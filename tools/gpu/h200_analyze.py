#!/usr/bin/env python3
"""The served H200 experiment's analysis, on the CPU machine, over what the commands of
tools/gpu/h200_experiment.sh returned: fits the step and transfer models (`genslot fit-step`),
summarises every served run over its measured window from its recording (`genslot sim
--replay`, which also gives the simulator's replay of that run under the control and the
preemption configs, on the grid's fit and on it with the step scaled to each start's control
run), runs the closed-loop simulator on the same load (over several seeds, and on loadgen's
seed alone with that start's step: the run's twin), and prints the tables for
docs/results.md and BENCHMARKS.md as markdown (and `--json`).

    python3 tools/gpu/h200_analyze.py RESULTS_DIR [--grid GRID.json] [--probe PROBE.jsonl]
        [--genslot BIN]

RESULTS_DIR holds grid-llama-8b.json, probe.jsonl and run-REP-ARM.tar.gz files (any subset).
"""

import argparse
import json
import re
import statistics
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONTROL_YAML = ROOT / "tools/gpu/h200-llama-8b-control.yaml"
TRACE = ROOT / "../shared/traces/weka_cc_agentic/weka_traces_runs.jsonl.gz"
PREEMPT_ARM = "tpot_budget=0.10"
# A preemption run's arm (h200_experiment.sh) -> the simulator's arm of the same setting and
# what it adds to the default in the prediction table: the tpot-g05 runs' config starts the
# window gain at 0.5 (`initial_gain`), the -held ones hold it until a paused request
# completes (`gain_from: paused`).
PREEMPT_ARMS = {
    "tpot": (PREEMPT_ARM, ""),
    "tpot-g05": (PREEMPT_ARM + "+g0=0.5", ", g0 0.5"),
    "tpot-held": (PREEMPT_ARM + "+g_from=paused", ", held"),
    "tpot-g05-held": (PREEMPT_ARM + "+g0=0.5+g_from=paused", ", g0 0.5, held"),
}
ARM_OF = {"control": "control", **{k: v[0] for k, v in PREEMPT_ARMS.items()}}
SIM_ARMS = ",".join(["control"] + [v[0] for v in PREEMPT_ARMS.values()])


def sh(cmd, **kw):
    print("$ " + " ".join(str(c) for c in cmd), file=sys.stderr)
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(map(str, cmd))}\n{r.stdout}\n{r.stderr}")
    return r.stdout


def metric(text, name, labels=""):
    """Sum of a Prometheus counter's samples whose labels contain `labels`."""
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}(\{{[^}}]*\}})?\s+([0-9.eE+-]+)$", line)
        if m and labels in (m.group(1) or ""):
            total += float(m.group(2))
    return total


def fitted_config(genslot, grid, probe, work):
    """The control config with the timing section fitted to the grid (and the probe)."""
    cmd = [genslot, "fit-step", grid, "--json", work / "fit.json", "--timing", work / "timing.yaml"]
    if probe and probe.exists():
        cmd += ["--transfer-record", probe]
    fit_text = sh(cmd)
    head = CONTROL_YAML.read_text().split("\ntiming:")[0]
    cfg = work / "fitted.yaml"
    cfg.write_text(head + "\n" + (work / "timing.yaml").read_text())
    return cfg, fit_text, json.loads((work / "fit.json").read_text())


def replay(genslot, d, run, cfg, out, *extra):
    """`genslot sim --replay` of the recording in `d` over the run's measured window under
    every arm (`extra`: more flags), written to `out` and returned parsed."""
    w, m = run["warmup_s"], run["measure_s"]
    sh([genslot, "sim", "--quiet", "--replay", d / "served.jsonl", "--config", cfg,
        "--warmup", w, "--duration", w + m, "--arms", SIM_ARMS, *extra, "--json", out])
    return json.loads(out.read_text())


def closed_loop(a, cfg, run, out, *extra):
    """The closed-loop simulator on the run's load (its context transform, lanes and
    window) under every arm (`extra`: the seeds and more), written to `out`, parsed."""
    w, m = run["warmup_s"], run["measure_s"]
    sh([a.genslot, "sim", "--quiet", "--config", cfg, "--trace", a.trace,
        "--context-scale", run["context_scale"], "--max-context", run["max_context"],
        "--concurrency", run["concurrency"], "--duration", w + m, "--warmup", w,
        *extra, "--arms", SIM_ARMS, "--json", out])
    return json.loads(out.read_text())


def served_run(genslot, tarball, cfg, work):
    d = work / tarball.name.replace(".tar.gz", "")
    d.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tarball) as t:
        t.extractall(d, filter="data")
    run = json.loads((d / "run.json").read_text())
    rep = replay(genslot, d, run, cfg, d / "replay.json")
    # The counters' snapshots a run kept ("" where it has none): at the end of the warm-up,
    # at the end of the measured window (h200_experiment.sh since 2026-12-04), and after the
    # grace, when the batch drains and steps are shorter.
    def snapshot(name):
        f = d / name
        return f.read_text() if f.exists() else ""
    warm, window_end, end = (snapshot(f"metrics-{s}.txt") for s in ("warm", "window", "end"))
    counts = {
        "pauses": metric(end, "genslot_pauses_total") - metric(warm, "genslot_pauses_total"),
        "resumes": metric(end, "genslot_resumes_total", 'forced="false"')
        - metric(warm, "genslot_resumes_total", 'forced="false"'),
        "forced": metric(end, "genslot_resumes_total", 'forced="true"')
        - metric(warm, "genslot_resumes_total", 'forced="true"'),
    }
    # The mean step (as the backend timed it) and mean gap between steps (the executor's
    # share of the inter-token interval) from the end of the warm-up to the end of the
    # measured window, or, in recordings without that snapshot, to the end of the grace
    # (`step_span` says which); absent from older recordings.
    counts["step_span"] = "window" if window_end else "window + grace"
    upto = window_end or end
    for key, name in (("step_ms", "genslot_step_seconds"), ("gap_ms", "genslot_step_gap_seconds")):
        n = metric(upto, name + "_count") - metric(warm, name + "_count")
        total = metric(upto, name + "_sum") - metric(warm, name + "_sum")
        counts[key] = 1e3 * total / n if n > 0 else None
    return {"run": run, "served": rep["served"], "counters": counts,
            "replay": {a["name"]: a for a in rep["arms"]}, "name": d.name}


def calibrated_replay(genslot, r, cfg, work, scale):
    """The run's recording replayed under every arm on the plant with its step scaled:
    `scale` "auto" (a control run) finds the factor at which the replayed control decodes at
    the served control's mean TPOT; a number applies the factor the control of the same
    machine start found. Returns (the factor, the arms by name)."""
    d = work / r["name"]
    rep = replay(genslot, d, r["run"], cfg, d / "replay-calibrated.json", "--step-scale", scale)
    return rep["plant_overrides"]["step_scale"], {a["name"]: a for a in rep["arms"]}


def recorded(recording):
    """A recording's requests that have a first token and a finish, and its first arrival of
    any request (the origin of the measured window)."""
    reqs = [json.loads(line) for line in recording.read_text().splitlines() if line.strip()]
    t0 = min((r["arrival_s"] for r in reqs), default=None)
    return [r for r in reqs if r.get("first_token_s") is not None
            and r.get("finish_s") is not None], t0


def served_batch(reqs, t0, warmup_s, measure_s, every_s=0.25):
    """The decode batch of a run without pauses, rebuilt from its recorded requests
    (`recorded`) every `every_s` over the measured window (from the first arrival `t0`): the
    requests between their first token and their finish, each at its prompt plus the share
    of its output produced by then. Returns per-sample lists of (rows, summed context,
    context CV, longest / mean)."""
    if not reqs:
        return []
    out = []
    t = t0 + warmup_s
    while t < t0 + warmup_s + measure_s:
        ctx = []
        for r in reqs:
            f, e = r["first_token_s"], r["finish_s"]
            if f <= t < e:
                ctx.append(r["context_tokens"] + (t - f) / (e - f) * r["output_tokens"])
        if ctx:
            mean = sum(ctx) / len(ctx)
            out.append((len(ctx), sum(ctx), statistics.pstdev(ctx) / mean, max(ctx) / mean))
        t += every_s
    return out


def token_interval(reqs, t0, warmup_s, measure_s):
    """The mean interval between a request's tokens over the measured window (from the first
    arrival `t0`), from the recorded requests alone (`recorded`): the time they spent between
    their first token and their finish inside the window over the tokens they produced there
    (each at its own mean rate). In a run without pauses every such request gets one token a
    step, so this is the window's step plus gap, however the step counters were windowed."""
    lo_w, hi_w = t0 + warmup_s, t0 + warmup_s + measure_s
    alive = tokens = 0.0
    for r in reqs:
        f, e = r["first_token_s"], r["finish_s"]
        lo, hi = max(lo_w, f), min(hi_w, e)
        if hi > lo and r["output_tokens"] > 1:
            alive += hi - lo
            tokens += (hi - lo) * (r["output_tokens"] - 1) / (e - f)
    return 1e3 * alive / tokens if tokens > 0 else None


def spread(v):
    return (statistics.fmean(v), min(v), max(v)) if v else (float("nan"),) * 3


def fmt_spread(v, unit):
    m, lo, hi = spread(v)
    return f"{m:+.2f}{unit} [{lo:+.2f}, {hi:+.2f}]"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("--grid", type=Path, help="step grid (default RESULTS/grid-llama-8b.json)")
    ap.add_argument("--probe", type=Path, help="transfer probe (default RESULTS/probe.jsonl)")
    ap.add_argument("--genslot", type=Path, default=ROOT / "target/release/genslot")
    ap.add_argument("--trace", type=Path, default=TRACE)
    ap.add_argument("--seeds", type=int, default=16, help="closed-loop simulator seeds")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    work = a.results / "analysis"
    work.mkdir(parents=True, exist_ok=True)
    grid = a.grid or a.results / "grid-llama-8b.json"
    probe = a.probe or a.results / "probe.jsonl"
    cfg, fit_text, fit = fitted_config(a.genslot, grid, probe, work)
    print("## Step-time fit\n\n```\n" + fit_text.strip() + "\n```\n")

    runs = [served_run(a.genslot, t, cfg, work) for t in sorted(a.results.glob("run-*.tar.gz"))]
    if not runs:
        print("no run-*.tar.gz in", a.results)
        return
    print("## Served runs (measured window)\n")
    print("| run | arm | requests | TTFT p50 | p90 | p99 | mean | mean TPOT ms | E2E p90 | "
          "total tok/s | pauses | resumes | forced |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        s, c = r["served"], r["counters"]
        print(f"| {r['name']} | {r['run']['arm']} | {s['completed']} | {s['ttft_p50_s']:.2f} | "
              f"{s['ttft_p90_s']:.2f} | {s['ttft_p99_s']:.2f} | {s['ttft_mean_s']:.2f} | "
              f"{s['mean_tpot_ms']:.2f} | {s['e2e_p90_s']:.2f} | {s['total_tps']:.0f} | "
              f"{c['pauses']:.0f} | {c['resumes']:.0f} | {c['forced']:.0f} |")
    split = [r for r in runs if r["served"].get("mean_queue_s") is not None
             and ARM_OF.get(r["run"]["arm"]) in r["replay"]]
    if split:
        print("\nWhere the mean TTFT goes (measured window; recordings with admission and "
              "KV-ready stamps): the wait for a slot, the context's arrival, and the wait for "
              "the pass that first schedules the request; served, then the replay's arm of "
              "the same setting.\n")
        print("| run | TTFT mean | queue | context | first pass | replay: queue | context | "
              "first pass |")
        print("|---|---|---|---|---|---|---|---|")
        for r in split:
            s = r["served"]
            sim = r["replay"][ARM_OF[r["run"]["arm"]]]
            parts = lambda x, q, c: (q, c, x - q - c)
            served_parts = parts(s["ttft_mean_s"], s["mean_queue_s"], s["mean_context_s"])
            sim_parts = parts(sim["ttft_mean_s"], sim["mean_queue_s"], sim["mean_context_s"])
            print(f"| {r['name']} | {s['ttft_mean_s']:.3f} | "
                  + " | ".join(f"{v:.3f}" for v in served_parts + sim_parts) + " |")
    timed = [r for r in runs if r["counters"].get("step_ms") is not None]
    if timed:
        print("\nThe inter-token interval split (measured window, means): the backend's step, "
              "and the executor's gap before the next one.\n")
        print("| run | mean TPOT ms | step ms | gap ms |")
        print("|---|---|---|---|")
        for r in timed:
            c = r["counters"]
            gap = f"{c['gap_ms']:.3f}" if c.get("gap_ms") is not None else "-"
            print(f"| {r['name']} | {r['served']['mean_tpot_ms']:.2f} | {c['step_ms']:.3f} | {gap} |")
        # Control runs only: a paused request sits between its first token and its finish
        # without being in the batch, which the rebuilt batch cannot tell.
        controls = [r for r in timed if r["run"]["arm"] == "control"]
        recordings = {r["name"]: recorded(work / r["name"] / "served.jsonl") for r in controls}
        batches = {r["name"]: served_batch(*recordings[r["name"]], r["run"]["warmup_s"],
                                           r["run"]["measure_s"]) for r in controls}
        plain = [r for r in timed if batches.get(r["name"])]
        if plain:
            st = fit["step"]
            print("\nThe control runs' decode batch, rebuilt from the recording every 0.25 s of the "
                  "measured window, and the step the fit gives it (mean over the samples); "
                  "the window's interval between a request's tokens from the recording "
                  "(`token_interval`), less the mean gap, against it; and the step counters' "
                  "mean over the span they cover.\n")
            print("| run | rows | tokens a row | context CV | longest / mean | fitted step ms | "
                  "token interval − gap ms | fit error | counters' step ms (span) |")
            print("|---|---|---|---|---|---|---|---|---|")
            for r in plain:
                b = batches[r["name"]]
                rows = statistics.fmean(x[0] for x in b)
                per_row = statistics.fmean(x[1] for x in b) / rows
                fitted = statistics.fmean(st["base_ms"] + x[0] * st["per_request_ms"]
                                          + x[1] * st["per_kv_token_ns"] * 1e-6 for x in b)
                c = r["counters"]
                ti = token_interval(*recordings[r["name"]],
                                    r["run"]["warmup_s"], r["run"]["measure_s"])
                step = ti - (c.get("gap_ms") or 0.0) if ti is not None else None
                r["window_step_ms"], r["fitted_step_ms"] = step, fitted
                err = f"{100 * (fitted / step - 1):+.1f}%" if step else "-"
                print(f"| {r['name']} | {rows:.1f} | {per_row:.0f} | "
                      f"{statistics.fmean(x[2] for x in b):.2f} | "
                      f"{statistics.fmean(x[3] for x in b):.2f} | {fitted:.2f} | "
                      f"{f'{step:.2f}' if step is not None else '-'} | {err} | "
                      f"{c['step_ms']:.2f} ({c['step_span']}) |")

    by = {(r["run"]["repeat"], r["run"]["arm"]): r for r in runs}
    paired = {}
    for arm in PREEMPT_ARMS:
        pairs = [(by[(k, "control")], by[(k, arm)])
                 for k in sorted({k for k, _ in by}) if (k, "control") in by and (k, arm) in by]
        d90, d50, dtpot, dtps = [], [], [], []
        for c, b in pairs:
            sc, sb = c["served"], b["served"]
            d90.append(sb["ttft_p90_s"] - sc["ttft_p90_s"])
            d50.append(sb["ttft_p50_s"] - sc["ttft_p50_s"])
            dtpot.append(100 * (sb["mean_tpot_ms"] / sc["mean_tpot_ms"] - 1))
            dtps.append(100 * (sb["total_tps"] / sc["total_tps"] - 1))
        if pairs:
            print(f"\nPaired deltas, {ARM_OF[arm]} − control, mean [min, max] over {len(pairs)} "
                  f"repeat(s): TTFT p90 {fmt_spread(d90, ' s')}, TTFT p50 "
                  f"{fmt_spread(d50, ' s')}, mean TPOT {fmt_spread(dtpot, '%')}, total tok/s "
                  f"{fmt_spread(dtps, '%')}")
        paired[arm] = {"ttft_p90_s": d90, "ttft_p50_s": d50, "mean_tpot_pct": dtpot,
                       "total_tps_pct": dtps}

    # Each start's step, from its control run: the factor on the grid's fit at which the
    # replayed control decodes at the served TPOT (`sim --step-scale auto`), then every run
    # of that start replayed on that plant under its own arm.
    scale_of = {}
    for r in runs:
        if r["run"]["arm"] == "control":
            scale_of[r["run"]["repeat"]], r["calibrated"] = calibrated_replay(
                a.genslot, r, cfg, work, "auto")
    for r in runs:
        k = r["run"]["repeat"]
        if r["run"]["arm"] != "control" and k in scale_of:
            _, r["calibrated"] = calibrated_replay(a.genslot, r, cfg, work, str(scale_of[k]))
    checked = [r for r in runs if "calibrated" in r and ARM_OF.get(r["run"]["arm"])]
    if checked:
        print("\nEach run's recording replayed under its own arm on the grid's fit with the step "
              "scaled to that start's control (`--step-scale`: the factor at which the "
              "replayed control's mean TPOT equals the served one), against the served "
              "run:\n")
        print("| run | arm | step x | served TTFT p50 / p90 / p99 | mean TPOT ms | replay TTFT "
              "p50 / p90 / p99 | mean TPOT ms | replay vs served: p90 / TPOT |")
        print("|---|---|---|---|---|---|---|---|")
        for r in checked:
            s_, sim = r["served"], r["calibrated"][ARM_OF[r["run"]["arm"]]]
            ttft = lambda x: " / ".join(f"{x[k]:.2f}" for k in
                                        ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s"))
            print(f"| {r['name']} | {r['run']['arm']} | {scale_of[r['run']['repeat']]:.4f} | "
                  f"{ttft(s_)} | {s_['mean_tpot_ms']:.2f} | {ttft(sim)} | "
                  f"{sim['mean_tpot_ms']:.2f} | "
                  f"{100 * (sim['ttft_p90_s'] / s_['ttft_p90_s'] - 1):+.0f}% / "
                  f"{100 * (sim['mean_tpot_ms'] / s_['mean_tpot_ms'] - 1):+.1f}% |")

    # The simulator, four ways.
    print("\n## Simulator prediction\n")
    controls = [r for r in runs if r["run"]["arm"] == "control"]
    rows = []
    for r in controls:
        p = r["replay"]
        rows += [("replay of " + r["name"] + label, p["control"], p[sim], r["served"])
                 for sim, label in PREEMPT_ARMS.values()]
        p, f = r["calibrated"], scale_of[r["run"]["repeat"]]
        rows += [(f"replay of {r['name']}, step x{f:.4f}{label}", p["control"], p[sim],
                  r["served"]) for sim, label in PREEMPT_ARMS.values()]
    if controls:
        r0 = controls[0]["run"]
        closed = closed_loop(a, cfg, r0, work / "closed.json", "--seeds", a.seeds)
        arms = {x["name"]: x for x in closed["arms"]}
        closed_name = f"closed loop c{r0['concurrency']}, {a.seeds} seeds"
        twins = []
        # Each start's twin: the closed loop on loadgen's seed alone (the same lanes) with
        # the step that start's control decoded at.
        for r in controls:
            run, f = r["run"], scale_of[r["run"]["repeat"]]
            twin = closed_loop(a, cfg, run, work / f"twin-{run['repeat']}.json",
                               "--first-seed", run["seed"], "--seeds", 1, "--step-scale", f)
            tw = {x["name"]: x for x in twin["arms"]}
            twins += [(f"closed loop c{run['concurrency']}, seed {run['seed']}, step x{f:.4f}"
                       + label, tw["control"], tw[sim], r["served"])
                      for sim, label in PREEMPT_ARMS.values()]
        rows[:0] = [(closed_name + label, arms["control"], arms[sim], None)
                    for sim, label in PREEMPT_ARMS.values()] + twins
    served_c = [r["served"] for r in controls]
    mean_served = {k: statistics.fmean(s[k] for s in served_c)
                   for k in ("ttft_p50_s", "ttft_p90_s", "mean_tpot_ms")} if served_c else {}
    print("| prediction | control TTFT p50 | p90 | mean TPOT ms | Δ TTFT p90 (s) | Δ TPOT | "
          "vs served: p50 / p90 / TPOT |")
    print("|---|---|---|---|---|---|---|")
    for name, c, b, served in rows:
        ref = served or mean_served
        err = " / ".join(f"{100 * (c[k] / ref[k] - 1):+.0f}%"
                         for k in ("ttft_p50_s", "ttft_p90_s", "mean_tpot_ms")) if ref else "-"
        print(f"| {name} | {c['ttft_p50_s']:.2f} | {c['ttft_p90_s']:.2f} | "
              f"{c['mean_tpot_ms']:.2f} | {b['ttft_p90_s'] - c['ttft_p90_s']:+.2f} | "
              f"{100 * (b['mean_tpot_ms'] / c['mean_tpot_ms'] - 1):+.1f}% | {err} |")
    if controls:
        # target_output_tps=auto: the control's mean per-request output rate / 1.10.
        rates = []
        for r in controls:
            for line in (work / r["name"] / "served.jsonl").read_text().splitlines():
                x = json.loads(line)
                if x["outcome"] == "completed" and x["output_tokens"] > 1 \
                        and x["finish_s"] > x["first_token_s"]:
                    rates.append((x["output_tokens"] - 1) / (x["finish_s"] - x["first_token_s"]))
        if rates:
            print(f"\ntarget_output_tps=auto from the served control runs: "
                  f"{statistics.fmean(rates) / 1.10:.1f} tok/s (TARGET_OUTPUT_TPS for staging)")
    if a.json:
        a.json.write_text(json.dumps({"fit": fit, "runs": runs, "paired": paired,
            "step_scale": scale_of,
            "predictions": [{"name": n, "control": c, "preempt": b} for n, c, b, _ in rows]},
            indent=1) + "\n")


if __name__ == "__main__":
    main()
