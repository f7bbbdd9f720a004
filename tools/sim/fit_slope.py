#!/usr/bin/env python3
"""Scores step-model slopes against the reference's measurements (docs/results.md §5).

Each argument is a `genslot sim --json` of `control,max_batch_size=144` run with
`--jump-ms J --per-request-above-ms S`. The score is the sum of squared relative errors (in %)
of the model's step at 128, 129, 141 and 144 requests (at the preset's 128k-token mean
context) against 90 / 102 / 110 / 110 ms, and of the b144 arm's paired TPOT and throughput
cost against the reference GPU's +16.1 % and −4.1 %.
"""
import json
import re
import sys

BASE, PER_REQ, KV_PER_REQ = 85.0, 0.03, 0.1e-6 * 128_000  # ms; ms per request at 128k tokens
POINTS = [(128, 90.0), (129, 102.0), (141, 110.0), (144, 110.0)]
REF_TPOT, REF_TPS = 1.161, 0.959


def step_ms(batch, jump, slope):
    ms = BASE + batch * (PER_REQ + KV_PER_REQ)
    if batch > 128:
        ms += jump + (batch - 128) * slope
    return ms


rows = []
for path in sys.argv[1:]:
    slope = float(re.search(r"sim-slope-([0-9.]+)\.json$", path).group(1))
    jump = round(11.48 - slope, 3)
    paired = {p["arm"]: p for p in json.load(open(path))["paired"]}["max_batch_size=144"]
    dtpot = paired["delta_mean_tpot_pct"]["mean"]
    dtps = paired["delta_total_tps_pct"]["mean"]
    errs = [100 * (step_ms(b, jump, slope) / want - 1) for b, want in POINTS]
    errs += [100 * ((1 + dtpot / 100) / REF_TPOT - 1), 100 * ((1 + dtps / 100) / REF_TPS - 1)]
    rows.append((sum(e * e for e in errs), slope, jump, errs, dtpot, dtps))

print("slope_ms jump_ms  step128 step129 step141 step144  b144_dTPOT b144_dtps  score(%^2)")
for score, slope, jump, errs, dtpot, dtps in sorted(rows, key=lambda r: r[1]):
    steps = " ".join(f"{e:+6.2f}%" for e in errs[:4])
    print(f"{slope:8.2f} {jump:7.2f}  {steps}  {dtpot:+9.2f}% {dtps:+8.2f}%  {score:9.1f}")
best = min(rows)
print(f"best: slope {best[1]} ms per request, jump {best[2]} ms")
