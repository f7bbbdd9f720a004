#!/usr/bin/env python3
"""The mix of context lengths in a served run's batches, from its recording (`genslot serve
--record`): the resident rows are rebuilt every `--every` seconds of the measured window
(a row's context is its prompt plus the tokens it had decoded, taken as linear between its
first token and its finish), and each row's context is divided by its step's mean.

Prints the pooled ratios' quantiles at `--points` equally spaced shares (the line to give
`genslot-gpu bench --context-ratios`), the longest row against the mean, the coefficient of
variation, and a bound on what the mix costs the attention kernel when every (kv head, row)
is one block and `--slots` blocks run at once: the longest block's tokens against the mean
slot's, max(L_max, kv_heads * sum L / slots) / (kv_heads * sum L / slots). That bound counts
tokens, not time: a block left alone at the kernel's end streams faster than its share.

The pooled quantiles put the window's longest rows at the top, longer than any one step's
longest row: a bench step on them is more uneven than the run's steps were. The typical step's
quantiles (each quantile of every sampled step, its median over the steps) keep one step's
shape; both lines are valid `--context-ratios`.

    python3 tools/gpu/batch_mix.py served.jsonl [--from 60 --to 480] [--slots 264]
"""
import argparse
import json
import statistics


# The ratio above which the step takes the balanced attention grid: forward::BALANCED_ABOVE.
BALANCED_ABOVE = 5 / 4


def quantiles(xs, n):
    """xs (sorted) at 0, 1/n, ..., 1, nearest rank."""
    return [xs[round(k / n * (len(xs) - 1))] for k in range(n + 1)]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("recording")
    p.add_argument("--from", dest="start", type=float, default=60.0,
                   help="window start, seconds after the first arrival")
    p.add_argument("--to", dest="end", type=float, help="window end (default: last finish)")
    p.add_argument("--every", type=float, default=0.25)
    p.add_argument("--points", type=int, default=21)
    p.add_argument("--slots", type=int, default=264,
                   help="attention blocks at once (2 a multiprocessor on 132)")
    p.add_argument("--kv-heads", type=int, default=8)
    a = p.parse_args()
    recs = [json.loads(line) for line in open(a.recording) if line.strip()]
    t0 = min(r["arrival_s"] for r in recs)
    rows = [(r["first_token_s"], r["finish_s"], r["context_tokens"], r["output_tokens"])
            for r in recs if r.get("first_token_s") is not None]
    end = t0 + a.end if a.end is not None else max(f for _, f, _, _ in rows)
    ratios, longest, cvs, bounds, batch, means, shapes = [], [], [], [], [], [], []
    n = a.points - 1
    t = t0 + a.start
    while t < end:
        ls = [c + (t - f) / max(e - f, 1e-9) * o for f, e, c, o in rows if f <= t < e]
        if len(ls) > 1:
            mean = sum(ls) / len(ls)
            ratios += [x / mean for x in ls]
            shapes.append(quantiles(sorted(x / mean for x in ls), n))
            longest.append(max(ls) / mean)
            cvs.append(statistics.pstdev(ls) / mean)
            share = a.kv_heads * sum(ls) / a.slots
            bounds.append(max(max(ls), share) / share)
            batch.append(len(ls))
            means.append(mean)
        t += a.every
    if not ratios:
        raise SystemExit(f"{a.recording}: no step with two rows in the window")
    ratios.sort()
    q = quantiles(ratios, n)
    typical = [statistics.median(s[k] for s in shapes) for k in range(n + 1)]
    print(f"steps sampled: {len(batch)}, mean batch {statistics.mean(batch):.1f} rows of "
          f"{statistics.mean(means):.0f} tokens")
    print("context / step mean, quantiles at 0, 1/%d, ..., 1:" % n)
    print(",".join(f"{x:.2f}" for x in q))
    print("the typical step (each quantile's median over the steps):")
    print(",".join(f"{x:.2f}" for x in typical))
    longest.sort()
    bounds.sort()
    print(f"longest row / mean: median {statistics.median(longest):.2f}, "
          f"p90 {longest[int(0.9 * (len(longest) - 1))]:.2f}")
    print(f"coefficient of variation: mean {statistics.mean(cvs):.2f}")
    print(f"attention's longest block / mean slot ({a.slots} slots): mean "
          f"{statistics.mean(bounds):.3f}, median {statistics.median(bounds):.3f}, "
          f"above 1 in {sum(b > 1.0001 for b in bounds) / len(bounds):.0%} of steps, above 5/4 "
          f"(where the step takes the balanced grid) in "
          f"{sum(b > BALANCED_ABOVE for b in bounds) / len(bounds):.0%}")


if __name__ == "__main__":
    main()
