#!/usr/bin/env python3
"""Per-kernel summary of decode steps profiled by ncu (the `ncu` stage of run.sh).

Input: `ncu --csv --page raw --print-units base --metrics gpu__time_duration.sum,
dram__bytes_read.sum,dram__bytes_write.sum` over `genslot-gpu bench --profile`, which puts
exactly one eager step per (batch, context) point inside the profiler's range. Each step
starts at `embed_rows`. Every kernel that is not one of genslot's own row-wise kernels is a
weight product (cuBLAS's or `wgemm_*`); it is named by the layer position it serves: qkv,
o, gate_up, down, lm_head.

Usage: ncu_summary.py NCU.csv LABEL [LABEL...] [--json OUT]   (one label per profiled step)
"""
import csv
import json
import sys
from collections import OrderedDict

OWN = ("embed_rows", "rmsnorm", "rope_kv_write", "paged_attn", "attn_combine", "silu_mul",
       "sample_rows", "recurrent_scan", "draft_")


def short(name):
    n = name.split("(")[0].split("<")[0].strip()
    return n[5:] if n.startswith("void ") else n


def is_gemm(name):
    return not any(short(name).startswith(p) for p in OWN)


def num(v):
    """ncu writes thousands separators ("15,232")."""
    return float((v or "0").replace(",", ""))


def read(path):
    rows = []
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    reader = csv.DictReader(lines)
    for r in reader:
        if not r.get("ID", "").strip().isdigit():
            continue  # the units row
        rows.append(dict(
            name=r["Kernel Name"],
            ns=num(r["gpu__time_duration.sum"]),
            rd=num(r.get("dram__bytes_read.sum")),
            wr=num(r.get("dram__bytes_write.sum")),
        ))
    return rows


def steps(rows):
    out, cur = [], None
    for r in rows:
        if short(r["name"]) == "embed_rows":
            cur = []
            out.append(cur)
        if cur is not None:
            cur.append(r)
    return out


def roles(step):
    """The weight product each GEMM kernel serves, from the next own kernel after it."""
    nxt = {"rope_kv_write": "qkv", "recurrent_scan": "qkv", "silu_mul": "gate_up",
           "sample_rows": "lm_head"}
    named = []
    for i, r in enumerate(step):
        if not is_gemm(r["name"]):
            named.append(short(r["name"]))
            continue
        after = next((short(p["name"]) for p in step[i + 1:] if not is_gemm(p["name"])), "")
        if after == "rmsnorm":
            # After o comes the ffn's rmsnorm, after down the next layer's (or the final one):
            # the own kernel before this GEMM tells them apart.
            before = next((short(p["name"]) for p in reversed(step[:i]) if not is_gemm(p["name"])), "")
            role = "down" if before == "silu_mul" else "o"
        else:
            role = next((v for k, v in nxt.items() if after.startswith(k)), "gemm")
        named.append(f"{role} [{short(r['name'])}]")
    return named


def summarise(step):
    agg = OrderedDict()
    for key, r in zip(roles(step), step):
        a = agg.setdefault(key, dict(n=0, ns=0.0, bytes=0.0))
        a["n"] += 1
        a["ns"] += r["ns"]
        a["bytes"] += r["rd"] + r["wr"]
    total = sum(a["ns"] for a in agg.values())
    return total, sorted(agg.items(), key=lambda kv: -kv[1]["ns"])


def main():
    args = sys.argv[1:]
    out = None
    if "--json" in args:
        i = args.index("--json")
        out = args[i + 1]
        del args[i:i + 2]
    path, labels = args[0], args[1:]
    ss = steps(read(path))
    report = {}
    for k, st in enumerate(ss):
        label = labels[k] if k < len(labels) else f"step {k}"
        total, items = summarise(st)
        gemm_ns = sum(r["ns"] for r in st if is_gemm(r["name"]))
        gemm_b = sum(r["rd"] + r["wr"] for r in st if is_gemm(r["name"]))
        print(f"== {label}: {len(st)} kernels, {total / 1e3:.1f} µs of kernel time; weight "
              f"products {gemm_ns / 1e3:.1f} µs ({gemm_ns / total:.0%}, {gemm_b / max(gemm_ns, 1):.0f} GB/s)")
        print(f"   {'kernel (role)':58} {'n':>4} {'µs':>9} {'share':>6} {'GB/s':>6}")
        for key, a in items[:14]:
            gbs = a["bytes"] / a["ns"] if a["ns"] else 0.0
            print(f"   {key[:58]:58} {a['n']:4d} {a['ns'] / 1e3:9.1f} {a['ns'] / total:6.1%} {gbs:6.0f}")
        report[label] = dict(kernel_us=total / 1e3, kernels=len(st), gemm_us=gemm_ns / 1e3,
                             top=[dict(kernel=k2, n=a["n"], us=a["ns"] / 1e3,
                                       gbs=a["bytes"] / a["ns"] if a["ns"] else 0.0)
                                  for k2, a in items])
    if out:
        with open(out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
