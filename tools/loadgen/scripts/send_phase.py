#!/usr/bin/env python3
"""When requests were sent relative to the server's decode steps.

Reads per-request JSONL in AIPerf's `profile_export.jsonl` shape (AIPerf's own file, or
`loadgen --records`). The server's step ends are taken from the clients' side: every row of
a decode step streams its token at the step's end, so content-chunk arrivals (start + TTFT +
the inter-chunk gaps) cluster at step ends. For each measured request it reports the gap
since the latest response end before its send (a closed-loop lane's end-to-send gap, with
one request per lane in flight) and its send phase: time since the latest step end.

    python3 send_phase.py profile_export.jsonl loadgen-records.jsonl
"""

import bisect
import json
import statistics
import sys

# Chunk arrivals further apart than this belong to different steps (steps are >> 8 ms).
CLUSTER_MS = 8.0


def load(path):
    recs = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{n}: not JSON ({e})")
            md, m = r.get("metadata", {}), r.get("metrics", {})
            if md.get("benchmark_phase") != "profiling" or r.get("error"):
                continue
            if "time_to_first_token" not in m:
                continue
            start, end = md["request_start_ns"] / 1e6, md["request_end_ns"] / 1e6
            ttft = m["time_to_first_token"]["value"]
            chunks = [start + ttft]
            for gap in m.get("inter_chunk_latency", {}).get("value", []):
                chunks.append(chunks[-1] + gap)
            recs.append((start, end, ttft, chunks))
    return recs


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


def report(path):
    recs = load(path)
    if not recs:
        print(f"{path}: no measured requests")
        return
    step_ends = []
    last = None
    for t in sorted(t for r in recs for t in r[3]):
        if last is None or t - last > CLUSTER_MS:
            step_ends.append(t)
        last = t
    periods = [b - a for a, b in zip(step_ends, step_ends[1:])]
    ends = sorted(r[1] for r in recs)
    gaps, phases, by_phase = [], [], {}
    for start, _, ttft, _ in recs:
        i = bisect.bisect_right(ends, start) - 1
        if i >= 0:
            gaps.append(start - ends[i])
        j = bisect.bisect_right(step_ends, start) - 1
        if j >= 0:
            phase = start - step_ends[j]
            phases.append(phase)
            by_phase.setdefault(int(phase // 10), []).append(ttft)
    print(f"{path}: {len(recs)} requests, median step period {statistics.median(periods):.1f} ms")
    for name, xs in (("end-to-send gap", gaps), ("send phase after a step end", phases)):
        print(f"  {name} (ms): p10 {pct(xs, .1):.1f}  p50 {pct(xs, .5):.1f}  "
              f"p90 {pct(xs, .9):.1f}  mean {statistics.mean(xs):.1f}")
    for k in sorted(by_phase):
        t = by_phase[k]
        print(f"  phase {10 * k:3d}-{10 * k + 10:3d} ms: {len(t):3d} requests, "
              f"TTFT median {statistics.median(t):.1f} ms")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for p in sys.argv[1:]:
        report(p)
