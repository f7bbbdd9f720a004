#!/usr/bin/env python3
"""Paused or not, identical outputs, for any served model (stdlib only): LANES closed-loop
lanes of ROUNDS greedy completions each (ignore_eos) on a server with preemption on and a
small batch, repeated (at most ATTEMPTS loads) until the pause counter moves, then the same
prompts one at a time; every loaded output must be identical to its solo one and the pause
counter must have moved. Lanes, not one burst: in a burst every later head waits past
the X the earlier ones formed by more than W, and `tpot_budget` never sees a head at risk.
tools/gpu/run.sh runs it against config/cuda-llama-hybrid-1b.yaml (the hybrid shape: each
paused request keeps its recurrent state in its slot).

usage: serve_paused.py URL [OUT.json]
"""
import json
import os
import sys
from functools import partial

import serve_client

URL = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000"
OUT = sys.argv[2] if len(sys.argv) > 2 else None
LANES = int(os.environ.get("SERVE_PAUSED_LANES", 12))
ROUNDS = int(os.environ.get("SERVE_PAUSED_ROUNDS", 3))
N = LANES * ROUNDS
MAX_TOKENS = int(os.environ.get("SERVE_PAUSED_TOKENS", 200))
# Loads run until one pauses something (serve_client.load_until_paused).
ATTEMPTS = int(os.environ.get("SERVE_PAUSED_ATTEMPTS", 3))
post = partial(serve_client.post, URL)


def complete(prompt):
    body = {"prompt": prompt, "max_tokens": MAX_TOKENS, "ignore_eos": True, "temperature": 0}
    b = json.loads(post("/v1/completions", body).read())
    return b["choices"][0]["text"]


serve_client.wait_healthy(URL, 1200)

prompts = [f"request {i} of the paused check: the words repeat, the words repeat {i}"
           for i in range(N)]


def lane(l):
    return [complete(prompts[l * ROUNDS + r]) for r in range(ROUNDS)]


def load():
    lanes = serve_client.concurrent([lambda l=l: lane(l) for l in range(LANES)])
    return [out for outs in lanes for out in outs]


loads, moved, t_load = serve_client.load_until_paused(URL, load, ATTEMPTS)
solo = [complete(p) for p in prompts]
same = sum(a == b for out in loads for a, b in zip(out, solo))
print(f"load: {LANES} lanes x {ROUNDS} requests x {MAX_TOKENS} tokens, {len(loads)} load(s) in {t_load:.1f} s; "
      f"pauses {moved:.0f}; identical to solo: {same}/{N * len(loads)}")
if OUT:
    json.dump({"n": N, "loads": len(loads), "tokens": MAX_TOKENS, "pauses": moved,
               "identical": same, "load_s": t_load}, open(OUT, "w"), indent=1)
failures = []
if moved <= 0:
    failures.append("no request was paused")
if same != N * len(loads):
    failures.append(f"{N * len(loads) - same} outputs differ from their solo runs")
for f in failures:
    print("FAIL:", f)
sys.exit(1 if failures else 0)
