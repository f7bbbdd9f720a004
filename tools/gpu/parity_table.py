#!/usr/bin/env python3
"""The parity table of docs/gpu.md from `genslot-gpu parity --json` files.

usage: parity_table.py parity-tiny.json parity-llama-1b.json parity-smollm2.json ...
Each file's name after "parity-" (up to ".json") names the model in the table. The criterion
(SPEC §6): our max relative logit error against the float32 reference is no larger than
PyTorch bf16's own.
"""
import json
import os
import sys

print("| model | positions | ours vs float32 (max / mean L2) | PyTorch bf16 vs float32 (max / mean L2) "
      "| criterion | ours vs PyTorch bf16 (max) | greedy agreement |")
print("|---|---|---|---|---|---|---|")
ok = True
for path in sys.argv[1:]:
    name = os.path.basename(path)[len("parity-"):-len(".json")]
    r = json.load(open(path))
    f = r.get("vs_f32")
    if not f:
        print(f"| {name} | {r['positions']} | (no float32 run) | | | {r['max_rel_err']:.4f} | "
              f"{r['greedy_agree']}/{r['positions']} |")
        continue
    met = f["ours_max_rel_err"] <= f["reference_bf16_max_rel_err"]
    ok &= met
    print(f"| {name} | {r['prompts']} prompts x {r['steps'] + 1} | "
          f"{f['ours_max_rel_err']:.4f} / {f['ours_mean_rel_l2']:.4f} | "
          f"{f['reference_bf16_max_rel_err']:.4f} / {f['reference_bf16_mean_rel_l2']:.4f} | "
          f"{'met' if met else 'NOT met'} | {r['max_rel_err']:.4f} | "
          f"{r['greedy_agree']}/{r['positions']} |")
sys.exit(0 if ok else 1)
