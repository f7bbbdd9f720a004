#!/usr/bin/env python3
"""Reference run for `genslot-gpu parity`, on the H200 machine (torch + transformers, no network).

Builds LlamaForCausalLM from a LlamaConfig with a fixed seed for a named shape (or loads an
existing Hugging Face checkpoint with --checkpoint, e.g. SmolLM2 exported from its GGUF by
`genslot-gpu export-hf`); a hybrid shape (tiny-hybrid, llama-hybrid-1b) is the plain-PyTorch
model of hybrid_model.py instead (transformers is not needed for it). Saves it as a Hugging
Face checkpoint (model.safetensors + config.json), then for several prompts of different
lengths runs the prefill and N greedy decode steps in bf16 on the GPU and writes:
  REF/meta.json   {"prompts": [[ids]], "steps": N, "vocab": V, "tokens": [[t_0..t_N]]}
  REF/logits.f32  little-endian float32 [prompts][N + 1][V] (row 0: last prompt position)
"""
import argparse
import json
import os
import time

import numpy as np
import torch

from hybrid_model import HybridForCausalLM, hybrid_config

# Must match src/gpu/cuda/shape.rs.
SHAPES = {
    "tiny": dict(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                 num_attention_heads=8, num_key_value_heads=2, head_dim=64, theta=10000.0,
                 tie_word_embeddings=False),
    # Llama-3.2-1B's dimensions and RoPE (llama3 scaling, factor 32).
    "llama-1b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                     num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=64, theta=500000.0, tie_word_embeddings=True,
                     rope=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0,
                               high_freq_factor=4.0, original_max_position_embeddings=8192)),
    # Small, but with llama-1b's RoPE base and more layers: checks long-position RoPE on a CPU.
    "rope-check": dict(vocab_size=1024, hidden_size=256, intermediate_size=512,
                       num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2,
                       head_dim=64, theta=500000.0, tie_word_embeddings=True),
}
# The hybrids: a recurrent layer where (l + 1) % attention_every != 0 (hybrid_model.py).
SHAPES["tiny-hybrid"] = dict(SHAPES["tiny"], num_hidden_layers=4, attention_every=2)
SHAPES["llama-hybrid-1b"] = dict(SHAPES["llama-1b"], attention_every=4)


class HfRunner:
    """A transformers model behind hybrid_model's interface: (logits, cache) = m(ids, cache)."""

    def __init__(self, model):
        self.model = model

    def __call__(self, ids, cache=None):
        out = self.model(ids, past_key_values=cache, use_cache=True)
        return out.logits.float(), out.past_key_values


def make_config(shape):
    from transformers import LlamaConfig
    kw = dict(SHAPES[shape])
    theta = kw.pop("theta")
    rope = kw.pop("rope", dict(rope_type="default"))
    common = dict(rms_norm_eps=1e-5, max_position_embeddings=8192, attention_bias=False,
                  mlp_bias=False, hidden_act="silu")
    try:  # transformers 5 keeps RoPE settings in rope_parameters
        cfg = LlamaConfig(**kw, **common, rope_parameters={**rope, "rope_theta": theta})
    except TypeError:
        scaling = None if rope["rope_type"] == "default" else rope
        cfg = LlamaConfig(**kw, **common, rope_theta=theta, rope_scaling=scaling)
    return cfg


def keep_rope_fp32(model):
    """nn.Module.to(bfloat16) also rounds the rotary `inv_freq` buffers to bf16 (a later
    .float() cannot bring the bits back), while Hugging Face keeps them float32 when it loads
    a checkpoint with a dtype. Rounded frequencies shift every rotation angle by an error that
    grows with the position. Returns a function that puts the float32 values back after a cast."""
    saved = []
    for m in model.modules():
        for attr in ("inv_freq", "original_inv_freq"):
            t = getattr(m, attr, None)
            if torch.is_tensor(t):
                saved.append((m, attr, t.detach().clone().float()))

    def restore(device):
        for m, attr, t in saved:
            setattr(m, attr, t.to(device))
        return sorted({str(getattr(m, a).dtype) for m, a, _ in saved})

    return restore


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="tiny", choices=sorted(SHAPES))
    ap.add_argument("--checkpoint", help="load this Hugging Face checkpoint instead of a "
                                         "random --shape (its weights, read as float32)")
    ap.add_argument("--out", required=True, help="writes OUT/model and OUT/ref")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--lengths", default="7,33,64,150")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--init", default="hf", choices=["hf", "scaled"],
                    help="hf: transformers' default (normal, std 0.02, everywhere); scaled: the "
                         "residual-branch outputs (o_proj, down_proj) get std 0.02 / sqrt(2 L), "
                         "as in GPT-2 and Megatron-LM, so a deep random model is not chaotic")
    ap.add_argument("--no-rope-fix", action="store_true",
                    help="leave the bf16-rounded inv_freq of Module.to (for comparison)")
    a = ap.parse_args()
    t0 = time.time()
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 reference means IEEE float32
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(a.seed)
    hybrid = (a.checkpoint and "layer_types" in json.load(
        open(os.path.join(a.checkpoint, "config.json")))) or "attention_every" in SHAPES[a.shape]
    if hybrid:
        if a.checkpoint:
            model = HybridForCausalLM.load(a.checkpoint)
        else:
            model = HybridForCausalLM(hybrid_config(**SHAPES[a.shape]))
            model.init_weights(0.02)  # transformers' initializer_range
        layers, vocab = model.model.layers, model.cfg["vocab_size"]
        std = 0.02 / (2 * len(layers)) ** 0.5
    else:
        from transformers import LlamaForCausalLM
        if a.checkpoint:
            try:  # transformers 5 names it dtype, 4 torch_dtype
                model = LlamaForCausalLM.from_pretrained(a.checkpoint, dtype=torch.float32)
            except TypeError:
                model = LlamaForCausalLM.from_pretrained(a.checkpoint, torch_dtype=torch.float32)
        else:
            model = LlamaForCausalLM(make_config(a.shape))
        cfg = model.config
        layers, vocab = model.model.layers, cfg.vocab_size
        std = cfg.initializer_range / (2 * cfg.num_hidden_layers) ** 0.5
    if a.init == "scaled" and not a.checkpoint:
        with torch.no_grad():
            for layer in layers:
                layer.self_attn.o_proj.weight.normal_(0.0, std)
                layer.mlp.down_proj.weight.normal_(0.0, std)
    restore_rope = keep_rope_fp32(model)
    model = model.to(torch.bfloat16).to(a.device).eval()
    if not a.no_rope_fix and not hybrid:  # the hybrid keeps its frequencies out of .to()
        print(f"rotary inv_freq dtypes after restoring: {restore_rope(a.device)}")
    mdir, rdir = os.path.join(a.out, "model"), os.path.join(a.out, "ref")
    os.makedirs(rdir, exist_ok=True)
    if hybrid:
        model.save(mdir)
    else:
        model.save_pretrained(mdir, safe_serialization=True)
    theta = json.load(open(os.path.join(mdir, "config.json")))
    print(f"saved {a.checkpoint or a.shape} to {mdir} ({time.time() - t0:.1f}s); "
          f"config keys: {sorted(theta)}")
    run = model if hybrid else HfRunner(model)
    g = torch.Generator().manual_seed(a.seed + 1)
    prompts = [torch.randint(0, vocab, (int(n),), generator=g).tolist()
               for n in a.lengths.split(",")]
    all_logits, all_tokens = [], []
    with torch.no_grad():
        for p in prompts:
            logits, past = run(torch.tensor([p], device=a.device))
            last = logits[0, -1]
            toks, rows = [int(last.argmax())], [last.cpu().numpy()]
            for _ in range(a.steps):
                logits, past = run(torch.tensor([[toks[-1]]], device=a.device), past)
                last = logits[0, -1]
                toks.append(int(last.argmax()))
                rows.append(last.cpu().numpy())
            all_tokens.append(toks)
            all_logits.append(np.stack(rows))
    np.stack(all_logits).astype("<f4").tofile(os.path.join(rdir, "logits.f32"))
    # The same teacher-forced tokens through the model in float32: the bf16-free answer, to
    # tell bf16 rounding (shared by PyTorch's bf16 run and ours) from real disagreement.
    model = model.float()
    f32_logits = []
    with torch.no_grad():
        for p, toks in zip(prompts, all_tokens):
            ids = torch.tensor([p + toks[:-1]], device=a.device)
            out = run(ids)[0][0, len(p) - 1:]
            f32_logits.append(out.cpu().numpy())
    np.stack(f32_logits).astype("<f4").tofile(os.path.join(rdir, "logits32.f32"))
    json.dump({"prompts": prompts, "steps": a.steps, "vocab": vocab,
               "tokens": all_tokens}, open(os.path.join(rdir, "meta.json"), "w"))
    print(f"reference for {len(prompts)} prompts x {a.steps} steps in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
