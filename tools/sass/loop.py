#!/usr/bin/env python3
"""The SASS of a kernel's main loop, counted, on the CPU machine (no GPU).

Compiles genslot's kernel source for sm_90 with NVRTC (as the backend does, with the same
-D options) into a cubin, disassembles it with nvdisasm, finds the kernel's loop with the
most HMMA instructions and prints its size and its instructions by opcode, plus the
whole-tile path of the tensor-core attention loop (loop head, the copy block with
unpredicated LDGSTS, and the compute after the last LDGDEPBAR). BENCHMARKS.md §3.8 counts
attention's loop with it.

    target/release/genslot-gpu kernels --shape llama-8b --out /tmp/k.cu
    python3 tools/sass/loop.py /tmp/k.cu paged_attn_tc_d128_g4 [-DTC_WARPS=4 ...]

Needs libnvrtc (NVRTC) and nvdisasm: the nvidia-cuda-nvrtc and nvidia-cuda-nvdisasm wheels
(`pip download --no-deps`, unzip) or a CUDA toolkit; NVRTC_LIB and NVDISASM name them.
"""
import collections
import ctypes
import os
import re
import subprocess
import sys
import tempfile


def cubin(src: bytes, opts: list) -> bytes:
    lib = ctypes.CDLL(os.environ.get("NVRTC_LIB", "libnvrtc.so"))
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), src, b"k.cu", 0, None, None) != 0:
        sys.exit("nvrtcCreateProgram failed")
    args = [b"--gpu-architecture=sm_90", b"--std=c++17"] + [o.encode() for o in opts]
    r = lib.nvrtcCompileProgram(prog, len(args), (ctypes.c_char_p * len(args))(*args))
    n = ctypes.c_size_t()
    if r != 0:
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
        log = ctypes.create_string_buffer(n.value)
        lib.nvrtcGetProgramLog(prog, log)
        sys.exit(log.value.decode())
    lib.nvrtcGetCUBINSize(prog, ctypes.byref(n))
    buf = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetCUBIN(prog, buf)
    return buf.raw


def kernel_sass(cub: bytes, name: str) -> list:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cub)
        f.flush()
        text = subprocess.run([os.environ.get("NVDISASM", "nvdisasm"), "-c", f.name],
                              check=True, capture_output=True, text=True).stdout
    lines, inside = [], False
    for line in text.splitlines():
        if line.startswith(f".text.{name}:"):
            inside = True
        elif inside and line.startswith(".text."):
            break
        if inside:
            lines.append(line)
    if not lines:
        sys.exit(f"{name} not in the cubin")
    return lines


def opcode(line: str) -> str:
    m = re.search(r"\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_]+)", line)
    return m.group(2) if m else "?"


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    src, name, opts = open(sys.argv[1], "rb").read(), sys.argv[2], sys.argv[3:]
    labels, ins = {}, []
    for line in kernel_sass(cubin(src, opts), name):
        m = re.match(r"^(\.L_x_\d+):", line)
        if m:
            labels[m.group(1)] = len(ins)
        elif re.search(r"/\*[0-9a-f]{4,}\*/", line):
            ins.append(line)
    best = None  # (start, end, HMMAs) of the backward branch's loop with the most HMMAs
    for i, line in enumerate(ins):
        m = re.search(r"BRA `\((\.L_x_\d+)\)", line)
        if m and labels.get(m.group(1), len(ins)) <= i:
            a = labels[m.group(1)]
            h = sum("HMMA" in b for b in ins[a:i + 1])
            if h and (best is None or h > best[2]):
                best = (a, i, h)
    if best is None:
        sys.exit(f"{name}: no loop with HMMA")
    body = ins[best[0]:best[1] + 1]
    print(f"{name} {' '.join(opts)}: {len(ins)} instructions, main loop {len(body)} "
          f"(every path through it)")
    counts = collections.Counter(opcode(b) for b in body)
    print("  loop by opcode:", ", ".join(f"{k} {v}" for k, v in counts.most_common(16)))
    deps = [j for j, b in enumerate(body) if "LDGDEPBAR" in b]
    if not deps:
        return
    # What follows the last commit group: the tile's MMAs and softmax, every path.
    compute = body[deps[-1] + 1:]
    c = collections.Counter(opcode(b) for b in compute)
    print(f"  after the copies: {len(compute)}:",
          ", ".join(f"{k} {v}" for k, v in c.most_common(16)))
    # A block of 16 unpredicated cp.async (a whole tile's copies), from the branch into it.
    whole = [d for d in deps
             if sum("LDGSTS" in b and "!P" not in b for b in body[max(0, d - 40):d]) >= 16]
    if whole:
        d = whole[-1]
        print(f"  whole-tile copy block: {d - max(j for j, b in enumerate(body[:d]) if 'BRA' in b)}")


if __name__ == "__main__":
    main()
