#!/usr/bin/env python3
"""End-to-end check of `genslot serve --backend cuda` on a real model (stdlib only; the H200
machine runs it against config/cuda-smollm2.yaml from tools/gpu/run.sh).

1. Chat completion "What is the capital of France?", greedy (temperature 0), non-streaming
   and streaming: the text contains EXPECT ("Paris"); the stream ends with a usage chunk and
   [DONE], and its text equals the non-streaming one.
2. Under a load that pauses requests (preemption on, small batch): LANES closed-loop lanes
   of ROUNDS greedy requests each (ignore_eos, so the load lasts), repeated (at most ATTEMPTS
   loads) until the pause counter moves, then the same prompts one at a time; every answer
   (the text up to the model's end token) must be identical and the server's pause counter
   must have moved. Whole outputs, past the end token, are compared
   and reported. Lanes, not one burst: in a burst every later head of the queue waits longer
   than the X the earlier ones formed, so it is late by more than W and `tpot_budget` never
   sees a head at risk (SPEC §4.3); closed-loop lanes keep the waits around X.
3. Seeded sampled requests, with top_k (temperature 1, top_p 0.9, top_k 50) and without it
   (temperature 0.8, top_p 0.95, as OpenAI clients send: the device sampler's top-p path):
   the same seeds sent twice, each time among concurrent others, give the same text; other
   seeds give other text.

usage: serve_real.py URL [OUT.json]
"""
import json
import os
import sys
from functools import partial

import serve_client

URL = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000"
OUT = sys.argv[2] if len(sys.argv) > 2 else None
EXPECT = "Paris"
EOS_TEXT = "<|im_end|>"  # SmolLM2's end token as the server decodes it
# SERVE_REAL_LANES / _ROUNDS / _TOKENS size the load (a dry run against the timing model
# shrinks it). A request is a pause victim only after 64 decode iterations (SPEC §4.3).
LANES = int(os.environ.get("SERVE_REAL_LANES", 12))
ROUNDS = int(os.environ.get("SERVE_REAL_ROUNDS", 3))
N = LANES * ROUNDS
MAX_TOKENS = int(os.environ.get("SERVE_REAL_TOKENS", 200))
# Loads run until one pauses something (serve_client.load_until_paused).
ATTEMPTS = int(os.environ.get("SERVE_REAL_ATTEMPTS", 3))
report = {}
post = partial(serve_client.post, URL)
concurrent = serve_client.concurrent


def chat(content, stream=False, **params):
    body = {"messages": [{"role": "user", "content": content}],
            "max_tokens": 64, "stream": stream, **params}
    if stream:
        body["stream_options"] = {"include_usage": True}
    r = post("/v1/chat/completions", body)
    if not stream:
        b = json.loads(r.read())
        return b["choices"][0]["message"]["content"], b["choices"][0]["finish_reason"], b["usage"]
    lines = [l.decode().strip() for l in r if l.strip()]
    chunks = [json.loads(l[6:]) for l in lines if l.startswith("data: {")]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))
    finish = [c["choices"][0].get("finish_reason") for c in chunks if c.get("choices")]
    usage = [c["usage"] for c in chunks if c.get("usage")]
    assert lines[-1] == "data: [DONE]", f"stream ends with {lines[-1]!r}"
    return text, next((f for f in reversed(finish) if f), None), usage[-1] if usage else None


def complete(prompt, ignore_eos=True, **params):
    body = {"prompt": prompt, "max_tokens": MAX_TOKENS, "ignore_eos": ignore_eos, **params}
    b = json.loads(post("/v1/completions", body).read())
    return b["choices"][0]["text"], b["usage"]["completion_tokens"]


serve_client.wait_healthy(URL, 1200)
failures = []

# 1. The capital of France, greedy, both ways.
text, finish, usage = chat("What is the capital of France?", temperature=0)
s_text, s_finish, s_usage = chat("What is the capital of France?", stream=True, temperature=0)
print(f"chat: {text!r} (finish {finish}, usage {usage})")
print(f"chat stream: {s_text!r} (finish {s_finish}, usage {s_usage})")
report["chat"] = {"text": text, "finish": finish, "stream_text": s_text, "stream_finish": s_finish}
if EXPECT not in text:
    failures.append(f"non-streaming answer lacks {EXPECT!r}")
if EXPECT not in s_text:
    failures.append(f"streaming answer lacks {EXPECT!r}")
if s_text != text:
    failures.append("streaming and non-streaming answers differ")
if finish != "stop":
    failures.append(f"finish_reason {finish!r}, expected 'stop' at the model's EOS")

# 2. Paused or not: identical greedy outputs.
topics = ["the sea", "a city at night", "bread", "a long journey", "winter", "music",
          "a lighthouse", "mountains", "rain", "a library", "the moon", "gardens",
          "trains", "a market", "clocks", "rivers"]
styles = ["", " in verse", " for a child", " as a letter"]
prompts = [f"<|im_start|>user\nWrite about {topics[i % len(topics)]}"
           f"{styles[(i // len(topics)) % len(styles)]}.<|im_end|>\n"
           f"<|im_start|>assistant\n" for i in range(N)]


def lane(l):
    return [complete(prompts[l * ROUNDS + r], temperature=0) for r in range(ROUNDS)]


def load():
    return [out for outs in concurrent([lambda l=l: lane(l) for l in range(LANES)]) for out in outs]


loads, pauses, t_load = serve_client.load_until_paused(URL, load, ATTEMPTS)
solo = [complete(p, temperature=0) for p in prompts]
pairs = [(a, b) for loaded in loads for a, b in zip(loaded, solo)]
same = sum(a == b for a, b in pairs)
# What a client gets without ignore_eos: the text up to the model's end token. Past it the
# model runs outside what it was trained on, where the two best tokens can nearly tie.
answer = lambda t: t.split(EOS_TEXT)[0]
same_answer = sum(answer(a[0]) == answer(b[0]) for a, b in pairs)
n = len(pairs)
print(f"load: {LANES} lanes x {ROUNDS} requests x {MAX_TOKENS} tokens, {len(loads)} load(s) in {t_load:.1f} s; "
      f"pauses {pauses:.0f}; identical to solo: {same}/{n} whole outputs, {same_answer}/{n} up to the end token")
for i, (a, b) in enumerate(pairs):
    if a != b:
        k = next((j for j, (x, y) in enumerate(zip(a[0], b[0])) if x != y), min(len(a[0]), len(b[0])))
        print(f"  request {i % N} of load {i // N + 1} differs at character {k}: "
              f"{a[0][max(0, k - 40):k + 40]!r} vs {b[0][max(0, k - 40):k + 40]!r}")
report["paused_vs_solo"] = {"n": n, "loads": len(loads), "identical": same,
                            "identical_up_to_eos": same_answer, "pauses": pauses, "load_s": t_load}
if pauses <= 0:
    failures.append("no request was paused under load")
if same_answer != n:
    failures.append(f"{n - same_answer} answers differ paused vs solo")

# 3. Seeded sampling, reproducible under different concurrent company.
seeds = [101, 202, 303, 404]
q = "<|im_start|>user\nTell me a story about a fox.<|im_end|>\n<|im_start|>assistant\n"
for key, sampled in [("seeded", dict(temperature=1.0, top_p=0.9, top_k=50)),
                     ("seeded_top_p", dict(temperature=0.8, top_p=0.95))]:
    first = concurrent([lambda s=s: complete(q, False, seed=s, **sampled) for s in seeds])
    # The same seeds again, now beside six greedy requests: other batches, other pauses.
    second = concurrent([lambda s=s: complete(q, False, seed=s, **sampled) for s in seeds]
                        + [lambda p=p: complete(p, temperature=0) for p in prompts[:6]])[:len(seeds)]
    repro = sum(a == b for a, b in zip(first, second))
    distinct = len({t for t, _ in first})
    print(f"seeded sampling {sampled}: {repro}/{len(seeds)} reproduced; {distinct} distinct "
          f"texts for {len(seeds)} seeds")
    report[key] = {"sampling": sampled, "reproduced": repro, "seeds": len(seeds),
                   "distinct": distinct, "texts": [t for t, _ in first]}
    if repro != len(seeds):
        failures.append(f"a seeded request ({sampled}) drew other tokens the second time")
    if distinct < 2:
        failures.append(f"different seeds ({sampled}) gave the same text: are sampling "
                        "parameters ignored?")

report["failures"] = failures
if OUT:
    json.dump(report, open(OUT, "w"), indent=1)
if failures:
    sys.exit("serve_real FAILED: " + "; ".join(failures))
print("serve_real OK")
