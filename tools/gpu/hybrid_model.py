"""genslot's hybrid decoder (`tiny-hybrid`, `llama-hybrid-1b`) in plain PyTorch, for parity.py.

No transformers class: the recurrent layers exist nowhere else, and the attention layers are
written out to equal transformers' Llama (LlamaRMSNorm, rotate-half RoPE with float32
frequencies and cos/sin cast to the activations' dtype, GQA through SDPA, SwiGLU).

A recurrent layer (src/gpu/cuda/shape.rs `LayerMix`, cpu_ref.rs `recur`, kernels/recurrent.cu)
uses the layer's q/k/v/o projections and a decay projection [kv_heads, hidden] with a bias:
  a = exp(-softplus(decay_proj(h))) per kv head, from the layer's normed input h
  S = a S + k^ v^T   (S: head_dim x head_dim per kv head, row i = key dimension)
  o_g = S^T q^_g     for each query head g of the kv head's group
with q^, k^ = x / max(|x|, 1e-6) per head and no RoPE. In a bf16 run the projections (q, k,
v and the decay's pre-activation) come out of bf16 linears as any PyTorch module would give
them; the normalisation, decay and state stay float32 and the output is cast back to bf16
before o_proj, as recurrent-state PyTorch implementations keep their state (a bf16 state
would lose the decayed memory and only loosen the SPEC criterion).

Tensor names are genslot's (init.rs `Tensor::hf_name`): a recurrent layer keeps its
projections under `self_attn` and adds `linear_attn.decay_proj.{weight,bias}`; config.json
marks the layers with `layer_types` (shape.rs `LayerMix::from_layer_types`).
"""
import json
import math
import os

import torch
import torch.nn.functional as F
from torch import nn


def layer_types(layers, attention_every):
    """shape.rs `LayerMix::layer_types`: layer l attends when (l + 1) % attention_every == 0."""
    return ["full_attention" if (l + 1) % attention_every == 0 else "linear_attention"
            for l in range(layers)]


def inv_freq(cfg):
    """transformers' rotary frequencies (float32 arithmetic, llama3 rescaling)."""
    d = cfg["head_dim"]
    f = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    r = cfg.get("rope_scaling")
    if not r or r.get("rope_type", "default") == "default":
        return f
    assert r["rope_type"] == "llama3", r
    factor, lo, hi = r["factor"], r["low_freq_factor"], r["high_freq_factor"]
    old = r["original_max_position_embeddings"]
    wavelen = 2 * math.pi / f
    out = torch.where(wavelen > old / lo, f / factor, f)
    smooth = (old / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * out / factor + smooth * out
    medium = ~(wavelen < old / hi) * ~(wavelen > old / lo)
    return torch.where(medium, smoothed, out)


class RMSNorm(nn.Module):
    """LlamaRMSNorm: float32 inside, cast back before the weight."""

    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        dt = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dt)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Mixer(nn.Module):
    """q/k/v/o of a layer; softmax attention or, with `recurrent`, the recurrence."""

    def __init__(self, cfg, recurrent):
        super().__init__()
        h, d = cfg["hidden_size"], cfg["head_dim"]
        self.heads, self.kv, self.d, self.recurrent = (cfg["num_attention_heads"],
                                                       cfg["num_key_value_heads"], d, recurrent)
        self.q_proj = nn.Linear(h, self.heads * d, bias=False)
        self.k_proj = nn.Linear(h, self.kv * d, bias=False)
        self.v_proj = nn.Linear(h, self.kv * d, bias=False)
        self.o_proj = nn.Linear(self.heads * d, h, bias=False)

    def attend(self, h, cos, sin, past):
        b, t, _ = h.shape
        q = self.q_proj(h).view(b, t, self.heads, self.d).transpose(1, 2)
        k = self.k_proj(h).view(b, t, self.kv, self.d).transpose(1, 2)
        v = self.v_proj(h).view(b, t, self.kv, self.d).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        if past is not None:
            k, v = torch.cat((past[0], k), dim=2), torch.cat((past[1], v), dim=2)
        g = self.heads // self.kv  # query head j reads kv head j // g (transformers' repeat_kv)
        kr, vr = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
        n = k.shape[2]
        mask = None
        if t > 1 and n > t:  # a chunk after cached positions: causal within the chunk
            mask = torch.ones(t, n, dtype=torch.bool, device=h.device).tril(n - t)
        o = F.scaled_dot_product_attention(q, kr, vr, attn_mask=mask,
                                           is_causal=t > 1 and mask is None,
                                           scale=self.d ** -0.5)
        return self.o_proj(o.transpose(1, 2).reshape(b, t, -1)), (k, v)

    def recur(self, h, decay_proj, state):
        b, t, _ = h.shape
        g = self.heads // self.kv
        q = self.q_proj(h).view(b, t, self.kv, g, self.d)
        k = self.k_proj(h).view(b, t, self.kv, self.d)
        v = self.v_proj(h).view(b, t, self.kv, self.d)
        a = torch.exp(-F.softplus(decay_proj(h).float()))  # [b, t, kv]; softplus(z) = z above 20
        qn = F.normalize(q.float(), dim=-1, eps=1e-6)
        kn = F.normalize(k.float(), dim=-1, eps=1e-6)
        vf = v.float()
        s = state if state is not None else h.new_zeros(b, self.kv, self.d, self.d,
                                                         dtype=torch.float32)
        outs = []
        for i in range(t):  # token after token, as prefill and decode both run it
            s = a[:, i, :, None, None] * s + kn[:, i, :, :, None] * vf[:, i, :, None, :]
            outs.append(torch.einsum("bkgi,bkij->bkgj", qn[:, i], s))
        o = torch.stack(outs, dim=1).reshape(b, t, -1).to(h.dtype)
        return self.o_proj(o), s


class Layer(nn.Module):
    def __init__(self, cfg, recurrent):
        super().__init__()
        h, f = cfg["hidden_size"], cfg["intermediate_size"]
        self.input_layernorm = RMSNorm(h, cfg["rms_norm_eps"])
        self.self_attn = Mixer(cfg, recurrent)
        if recurrent:
            self.linear_attn = nn.Module()
            self.linear_attn.decay_proj = nn.Linear(h, cfg["num_key_value_heads"], bias=True)
        self.post_attention_layernorm = RMSNorm(h, cfg["rms_norm_eps"])
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(h, f, bias=False)
        self.mlp.up_proj = nn.Linear(h, f, bias=False)
        self.mlp.down_proj = nn.Linear(f, h, bias=False)

    def forward(self, x, cos, sin, past):
        h = self.input_layernorm(x)
        if self.self_attn.recurrent:
            o, past = self.self_attn.recur(h, self.linear_attn.decay_proj, past)
        else:
            o, past = self.self_attn.attend(h, cos, sin, past)
        x = x + o
        h = self.post_attention_layernorm(x)
        m = self.mlp
        return x + m.down_proj(F.silu(m.gate_proj(h)) * m.up_proj(h)), past


class HybridForCausalLM(nn.Module):
    """forward(ids [b, t], cache) -> (logits [b, t, vocab] float32, cache); cache=None starts
    a sequence. The cache holds each attention layer's (k, v) and each recurrent layer's
    float32 state."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        recurrent = [t == "linear_attention" for t in cfg["layer_types"]]
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.model.layers = nn.ModuleList(Layer(cfg, r) for r in recurrent)
        self.model.norm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        if not cfg["tie_word_embeddings"]:
            self.lm_head = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)
        # Not a buffer: Module.to(bfloat16) must not round it (see parity.py keep_rope_fp32).
        self.inv_freq = inv_freq(cfg)

    def init_weights(self, std):
        """transformers' Llama init (normal(0, std) linears and embedding, norms 1), and the
        decay bias as genslot's seeded init draws it: U(-4, -2), a decay of about 0.88-0.98."""
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("layernorm.weight") or name == "model.norm.weight":
                    p.fill_(1.0)
                elif name.endswith("decay_proj.bias"):
                    p.uniform_(-4.0, -2.0)
                else:
                    p.normal_(0.0, std)

    def forward(self, ids, cache=None):
        cache = cache or {"len": 0, "layers": [None] * len(self.model.layers)}
        x = self.model.embed_tokens(ids)
        pos = torch.arange(cache["len"], cache["len"] + ids.shape[1], device=ids.device)
        freqs = pos[:, None].float() * self.inv_freq.to(ids.device)[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        layers = []
        for layer, past in zip(self.model.layers, cache["layers"]):
            x, past = layer(x, cos, sin, past)
            layers.append(past)
        x = self.model.norm(x)
        head = self.lm_head.weight if hasattr(self, "lm_head") else self.model.embed_tokens.weight
        logits = F.linear(x, head).float()
        return logits, {"len": cache["len"] + ids.shape[1], "layers": layers}

    def save(self, path):
        """config.json and model.safetensors (bf16) in genslot's names."""
        from safetensors.torch import save_file
        os.makedirs(path, exist_ok=True)
        cfg = dict(self.cfg, architectures=["GenslotHybridForCausalLM"],
                   model_type="genslot_hybrid", torch_dtype="bfloat16", hidden_act="silu",
                   attention_bias=False, mlp_bias=False)
        json.dump(cfg, open(os.path.join(path, "config.json"), "w"), indent=2)
        tensors = {k: v.detach().to(torch.bfloat16).contiguous().cpu()
                   for k, v in self.state_dict().items()}
        save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})

    @classmethod
    def load(cls, path, dtype=torch.float32):
        from safetensors.torch import load_file
        m = cls(json.load(open(os.path.join(path, "config.json"))))
        m.load_state_dict(load_file(os.path.join(path, "model.safetensors")))
        return m.to(dtype)


def hybrid_config(vocab_size, hidden_size, intermediate_size, num_hidden_layers,
                  num_attention_heads, num_key_value_heads, head_dim, theta, tie_word_embeddings,
                  attention_every, rope=None):
    """The config.json of a hybrid shape (parity.py's SHAPES entry)."""
    rope = rope or {"rope_type": "default"}
    return dict(vocab_size=vocab_size, hidden_size=hidden_size,
                intermediate_size=intermediate_size, num_hidden_layers=num_hidden_layers,
                num_attention_heads=num_attention_heads, num_key_value_heads=num_key_value_heads,
                head_dim=head_dim, rope_theta=theta, tie_word_embeddings=tie_word_embeddings,
                rms_norm_eps=1e-5, max_position_embeddings=8192,
                rope_scaling=None if rope["rope_type"] == "default" else rope,
                layer_types=layer_types(num_hidden_layers, attention_every))


def check_llama(device="cpu", shape="tiny"):
    """This model with every layer full_attention against transformers' LlamaForCausalLM on
    the same weights, prefill and decode, float32 and bf16: the attention layers are Llama's.
    Returns the max relative logit difference per dtype."""
    import parity
    from transformers import LlamaForCausalLM
    torch.manual_seed(0)
    hf = LlamaForCausalLM(parity.make_config(shape))
    kw = {k: v for k, v in parity.SHAPES[shape].items() if k != "attention_every"}
    ours = HybridForCausalLM(hybrid_config(**kw, attention_every=1))
    ours.load_state_dict(hf.state_dict(), strict=False)  # a tied lm_head is the embedding
    restore = parity.keep_rope_fp32(hf)
    ids = torch.randint(0, kw["vocab_size"], (1, 40))
    worst = {}
    for dt in (torch.float32, torch.bfloat16):
        hf, ours = hf.to(dt).to(device).eval(), ours.to(dt).to(device).eval()
        restore(device)
        run = parity.HfRunner(hf)
        with torch.no_grad():
            (a, pa), (b, pb) = run(ids.to(device)), ours(ids.to(device))
            err = ((a - b).abs().max() / a.abs().max()).item()
            for t in (5, 9, 700):
                x = torch.tensor([[t]], device=device)
                (a, pa), (b, pb) = run(x, pa), ours(x, pb)
                err = max(err, ((a - b).abs().max() / a.abs().max()).item())
        worst[str(dt)] = err
    return worst


if __name__ == "__main__":
    import argparse
    import sys
    ap = argparse.ArgumentParser(description="check the attention layers against transformers' "
                                             "Llama (needs transformers)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--shape", default="tiny")
    a = ap.parse_args()
    w = check_llama(a.device, a.shape)
    print(f"max relative logit difference from LlamaForCausalLM ({a.shape}, {a.device}): {w}")
    sys.exit(0 if w["torch.float32"] <= 1e-5 else 1)
