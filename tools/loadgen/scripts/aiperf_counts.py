#!/usr/bin/env python3
"""Checks an AIPerf run that counted tokens itself (no --use-server-token-count) against the
server: every request's client-side output (and input) token count against its `usage`, and
AIPerf's mean inter-token latency against the server's own TPOT histogram (the mean of
`genslot_time_per_output_token_seconds` over the run, from two /metrics scrapes).

Usage: aiperf_counts.py OUT_DIR METRICS_BEFORE METRICS_AFTER
Prints the numbers and exits 1 if a count differs or ITL is more than 5 % off the TPOT mean.
"""
import json
import sys


def scalar(text, name):
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def main():
    out, before, after = sys.argv[1], open(sys.argv[2]).read(), open(sys.argv[3]).read()
    records = [json.loads(l) for l in open(f"{out}/profile_export.jsonl")]
    records = [r for r in records if r["metadata"].get("benchmark_phase") == "profiling"]
    m = lambda r, k: r["metrics"].get(k, {}).get("value")
    out_diff = [r for r in records if m(r, "output_sequence_length") != m(r, "usage_completion_tokens")]
    in_diff = [r for r in records if m(r, "input_sequence_length") != m(r, "usage_prompt_tokens")]
    errors = [r for r in records if r.get("error")]
    summary = json.load(open(f"{out}/profile_export_aiperf.json"))
    itl_ms = summary["inter_token_latency"]["avg"]
    tpot = "genslot_time_per_output_token_seconds"
    d_sum = scalar(after, tpot + "_sum") - scalar(before, tpot + "_sum")
    d_count = scalar(after, tpot + "_count") - scalar(before, tpot + "_count")
    tpot_ms = 1e3 * d_sum / d_count if d_count else float("nan")
    off = (itl_ms - tpot_ms) / tpot_ms
    gen = "genslot_generation_tokens_total"
    server_tokens = scalar(after, gen) - scalar(before, gen)
    client_tokens = sum(m(r, "output_sequence_length") or 0 for r in records)
    print(f"requests {len(records)}, errors {len(errors)}")
    print(f"output tokens: client {client_tokens:.0f}, server {server_tokens:.0f}; "
          f"requests whose client count differs from usage: {len(out_diff)}")
    print(f"input tokens: requests whose client count differs from usage: {len(in_diff)}")
    print(f"AIPerf mean ITL {itl_ms:.2f} ms, server TPOT mean {tpot_ms:.2f} ms "
          f"over {d_count:.0f} requests: {100 * off:+.2f} %")
    ok = not out_diff and not errors and client_tokens == server_tokens and abs(off) <= 0.05
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
