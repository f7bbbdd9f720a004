#!/usr/bin/env python3
"""A served recording's occupancy over time: the resident rows, how many of them must be
paused, the queue, and the first tokens and completions of each step of time
(docs/results.md §7.3).

    python3 tools/gpu/occupancy.py tpot/served.jsonl --from 60 --to 90 --slots 128

The clock starts at the recording's first arrival, as `arrival_windows.py` and
`genslot sim --replay` read it. A request is resident from `admitted_s` to `finish_s` and
queued from `arrival_s` to `admitted_s`. A paused request stays resident (its KV and state
stay) but gives its decode slot back, so residents beyond the slot count are paused, at
least: `paused >=` is that excess, a lower bound (a pass with free slots may hold paused rows
too). The recording has no time of each pause, so this is what it can tell.
"""
import argparse
import json


def rows(path):
    out = [json.loads(line) for line in open(path) if line.strip()]
    if not out:
        raise SystemExit(f"{path}: no requests")
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("recording", help="served.jsonl (`genslot serve --record`)")
    p.add_argument("--from", dest="start", type=float, required=True)
    p.add_argument("--to", dest="end", type=float, required=True)
    p.add_argument("--every", type=float, default=0.5)
    p.add_argument("--slots", type=int, required=True,
                   help="the decode slots (max_num_active_requests)")
    a = p.parse_args()
    if a.every <= 0 or a.end <= a.start:
        raise SystemExit("--every must be > 0 and --to after --from")
    rs = rows(a.recording)
    t0 = min(r["arrival_s"] for r in rs)
    inf = float("inf")
    spans = []
    for r in rs:
        arrival = r["arrival_s"] - t0
        admitted = r.get("admitted_s")
        admitted = inf if admitted is None else admitted - t0
        finish = r.get("finish_s")
        finish = inf if finish is None else finish - t0
        first = r.get("first_token_s")
        first = inf if first is None else first - t0
        spans.append((arrival, admitted, first, finish))
    print(f"{'t (s)':>8} {'resident':>9} {'paused >=':>10} {'queued':>7} "
          f"{'first tokens':>13} {'completions':>12}   (the counts: in [t, t + {a.every:g}))")
    n = 0
    while True:
        t = a.start + n * a.every
        if t >= a.end - 1e-9:
            break
        u = t + a.every
        resident = sum(1 for _, ad, _, fin in spans if ad <= t < fin)
        queued = sum(1 for arr, ad, _, _ in spans if arr <= t < ad)
        firsts = sum(1 for _, _, ft, _ in spans if t <= ft < u)
        done = sum(1 for _, _, _, fin in spans if t <= fin < u)
        print(f"{t:8.2f} {resident:9d} {max(0, resident - a.slots):10d} {queued:7d} "
              f"{firsts:13d} {done:12d}")
        n += 1


if __name__ == "__main__":
    main()
