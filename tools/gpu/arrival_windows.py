#!/usr/bin/env python3
"""TTFT by windows of arrivals: served recordings (`genslot serve --record`) beside a twin's
requests (`genslot sim --records`), so a served run and its simulated twin can be set side by
side window by window (docs/results.md §7.2-7.3).

    python3 tools/gpu/arrival_windows.py --from 60 --to 480 --every 30 \
        "served control=control/served.jsonl" "served tpot=tpot/served.jsonl" \
        "twin control=twin.jsonl@control" "twin tpot=twin.jsonl@tpot_budget=0.10"

A recording's clock starts at its first arrival (as `genslot sim --replay` reads it); a twin's
`sent_s` counts from the run's first send, the same zero. Completed requests only, as the
replay's check counts them. Each window prints TTFT p50 / p90 and the request count; the
summary lines print p50 / p90 / p99 over the first `--split` seconds of the measured window,
the rest, and the whole.
"""
import argparse
import json
import math


def percentile(values, q):
    """Linear interpolation between closest ranks (numpy's default)."""
    v = sorted(values)
    if not v:
        return float("nan")
    k = (len(v) - 1) * q
    lo = math.floor(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def served(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    t0 = min(r["arrival_s"] for r in rows)
    # Completed requests only, as `genslot sim --replay`'s check counts the served run.
    return [(r["arrival_s"] - t0, r["first_token_s"] - r["arrival_s"])
            for r in rows if r["outcome"] == "completed" and r.get("first_token_s") is not None]


def twin(path, arm):
    out = []
    for line in open(path):
        r = json.loads(line)
        if r["arm"] == arm:
            out.append((r["sent_s"], r["ttft_s"]))
    if not out:
        raise SystemExit(f"{path}: no requests of arm {arm!r}")
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="NAME=served.jsonl or NAME=records.jsonl@ARM")
    p.add_argument("--from", dest="start", type=float, default=60.0)
    p.add_argument("--to", dest="end", type=float, required=True)
    p.add_argument("--every", type=float, default=30.0)
    p.add_argument("--split", type=float, default=120.0,
                   help="summarise the first SPLIT s of the window apart from the rest")
    a = p.parse_args()
    runs = {}
    for spec in a.runs:
        name, _, src = spec.partition("=")
        path, at, arm = src.partition("@")
        runs[name] = twin(path, arm) if at else served(path)
    width = max(20, max(len(n) for n in runs) + 2)
    print("arrivals (s)    " + "".join(f"{n:>{width}}" for n in runs))
    t = a.start
    while t < a.end:
        u = min(t + a.every, a.end)
        cells = []
        for v in runs.values():
            w = [x for s, x in v if t <= s < u]
            cells.append(f"{percentile(w, 0.5):.2f} / {percentile(w, 0.9):.2f} ({len(w)})")
        print(f"{t:5.0f}-{u:<5.0f}     " + "".join(f"{c:>{width}}" for c in cells))
        t = u
    mid = min(a.start + a.split, a.end)
    print("\np50 / p90 / p99 s")
    spans = [(a.start, mid), (mid, a.end), (a.start, a.end)] if mid < a.end else [(a.start, a.end)]
    for lo, hi in spans:
        cells = []
        for v in runs.values():
            w = [x for s, x in v if lo <= s < hi]
            cells.append("/".join(f"{percentile(w, q):.2f}" for q in (0.5, 0.9, 0.99)))
        print(f"{lo:5.0f}-{hi:<5.0f}     " + "".join(f"{c:>{width}}" for c in cells))


if __name__ == "__main__":
    main()
