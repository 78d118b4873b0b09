#!/usr/bin/env python3
"""Golden fixture generator for the C++ model tests (tiny Qwen3 target + tiny DFlash drafter).

What this is
    A small, independent, deliberately plain reference implementation of the
    math in docs/ARCHITECTURE.md §1-§2 (the Qwen3 dense target as in HF
    transformers' Qwen3 model, the DFlash-architecture drafter), written
    from those descriptions with nothing but torch, numpy, json and struct
    (no transformers, no code from other projects). It builds a tiny random
    Qwen3 target and a tiny random DFlash-architecture drafter, writes both
    as HF-style checkpoint folders, runs the reference math on a fixed
    prompt and writes the expected outputs. The C++ tests load the
    checkpoints with their own loader and compare against the expected values.

    The script is kept in the repository so the fixture can be regenerated
    (and audited) at any time; the output is deterministic (fixed seeds).

Usage
    python3 tests/golden/make_golden.py --out tests/testdata/golden

Outputs (under --out)
    target/config.json, target/model.safetensors     Qwen3ForCausalLM, F32, untied lm_head
    drafter/config.json, drafter/model.safetensors   DFlashDraftModel, F32
    expected.safetensors
        input_ids                 I64 [11]      prompt, ids in [0, 94)
        target_logits             F32 [11, 96]  causal forward at positions 0..10
        target_features           F32 [11, 128] cat(out of decoder layer 0, out of layer 2)
        block_p1_tokens           I64 [8]       [bonus, MASK(95) x 7], bonus = argmax target_logits[-1]
        drafter_p1_logits         F32 [8, 96]   drafter, context = 11 features, start = 11, bidirectional
        block_p2_tokens           I64 [8]       [bonus, argmax drafter_p1_logits[1..7]]
        drafter_p2_logits         F32 [8, 96]   same on block_p2_tokens
        drafter_p1_causal_logits  F32 [8, 96]   causal-editor variant on block_p1_tokens

Precision
    Weights are drawn in float32 and stored as float32. All reference math is
    done in float64 on exactly those float32 values, and results are rounded
    to float32 only when written. A float32 C++ implementation should match to
    about 1e-5; the tests use a tolerance around 1e-4.

Self-checks (asserts, run every time)
    (a) token-by-token decoding with a KV cache reproduces the full causal
        forward (logits and features), which pins down causal masking and
        RoPE positions with a cache;
    (b) the drafter output does not depend on how the context was appended
        (features appended in two chunks vs one).
"""

import argparse
import json
import os
import struct

import numpy as np
import torch

DT = torch.float64  # compute dtype

# ---------------------------------------------------------------------------
# Configurations
# ---------------------------------------------------------------------------

TARGET_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "head_dim": 32,
    "hidden_act": "silu",
    "hidden_size": 64,
    "initializer_range": 0.02,
    "intermediate_size": 128,
    "max_position_embeddings": 256,
    "max_window_layers": 4,
    "model_type": "qwen3",
    "num_attention_heads": 4,
    "num_hidden_layers": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 10000.0,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 96,
}

DRAFTER_CONFIG = {
    "architectures": ["DFlashDraftModel"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "block_size": 8,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "head_dim": 32,
    "hidden_act": "silu",
    "hidden_size": 64,
    "initializer_range": 0.02,
    "intermediate_size": 128,
    "max_position_embeddings": 256,
    "model_type": "qwen3",
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "num_target_layers": 4,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "transformers_version": "4.51.0",
    "use_cache": True,
    "vocab_size": 96,
    "dflash_config": {"mask_token_id": 95, "target_layer_ids": [0, 2]},
    "dedit_config": {"num_passes": 3, "causal_editor": False},
}

PROMPT_LEN = 11
PROMPT_ID_LIMIT = 94  # prompt ids are drawn from [0, 94)

# ---------------------------------------------------------------------------
# Random weights
# ---------------------------------------------------------------------------


class WeightMaker:
    """Draws float32 tensors from one seeded generator, in a fixed order."""

    def __init__(self, seed):
        self.gen = torch.Generator().manual_seed(seed)
        self.tensors = {}  # name -> float32 tensor (what goes to disk)

    def randn(self, name, shape, std):
        t = torch.randn(*shape, generator=self.gen, dtype=torch.float32) * std
        self.tensors[name] = t
        return t

    def norm(self, name, dim):
        # Around 1 but clearly not 1, so a missing/misapplied norm weight shows.
        t = 1.0 + 0.1 * torch.randn(dim, generator=self.gen, dtype=torch.float32)
        self.tensors[name] = t
        return t


def make_decoder_layer(wm, prefix, cfg):
    d = cfg["hidden_size"]
    nh = cfg["num_attention_heads"]
    nkv = cfg["num_key_value_heads"]
    hd = cfg["head_dim"]
    ff = cfg["intermediate_size"]
    wm.norm(prefix + "input_layernorm.weight", d)
    wm.norm(prefix + "post_attention_layernorm.weight", d)
    wm.randn(prefix + "self_attn.q_proj.weight", (nh * hd, d), 0.12)
    wm.randn(prefix + "self_attn.k_proj.weight", (nkv * hd, d), 0.12)
    wm.randn(prefix + "self_attn.v_proj.weight", (nkv * hd, d), 0.12)
    wm.randn(prefix + "self_attn.o_proj.weight", (d, nh * hd), 0.08)
    wm.norm(prefix + "self_attn.q_norm.weight", hd)
    wm.norm(prefix + "self_attn.k_norm.weight", hd)
    wm.randn(prefix + "mlp.gate_proj.weight", (ff, d), 0.12)
    wm.randn(prefix + "mlp.up_proj.weight", (ff, d), 0.12)
    wm.randn(prefix + "mlp.down_proj.weight", (d, ff), 0.08)


def make_target_weights(cfg, seed):
    wm = WeightMaker(seed)
    d, v = cfg["hidden_size"], cfg["vocab_size"]
    wm.randn("model.embed_tokens.weight", (v, d), 0.5)
    for i in range(cfg["num_hidden_layers"]):
        make_decoder_layer(wm, "model.layers.%d." % i, cfg)
    wm.norm("model.norm.weight", d)
    wm.randn("lm_head.weight", (v, d), 0.2)
    return wm.tensors


def make_drafter_weights(cfg, seed):
    wm = WeightMaker(seed)
    d = cfg["hidden_size"]
    n_ids = len(cfg["dflash_config"]["target_layer_ids"])
    wm.randn("fc.weight", (d, n_ids * d), 0.1)
    wm.norm("hidden_norm.weight", d)
    for i in range(cfg["num_hidden_layers"]):
        make_decoder_layer(wm, "layers.%d." % i, cfg)
    wm.norm("norm.weight", d)
    return wm.tensors


# ---------------------------------------------------------------------------
# Building blocks (all inputs float64)
# ---------------------------------------------------------------------------


def rms_norm(x, weight, eps):
    """x * rsqrt(mean(x^2) + eps) * weight, over the last axis."""
    var = (x * x).mean(dim=-1, keepdim=True)
    return x * torch.rsqrt(var + eps) * weight


def linear(x, weight):
    """y = x W^T with W stored [out, in], no bias."""
    return x @ weight.t()


def silu(x):
    return x * torch.sigmoid(x)


def rope_cos_sin(positions, head_dim, theta):
    """cos/sin tables [T, head_dim] for the given absolute positions (NeoX layout)."""
    exponents = torch.arange(0, head_dim, 2, dtype=DT) / head_dim  # 0, 2/hd, 4/hd, ...
    inv_freq = 1.0 / (theta ** exponents)  # [hd/2]
    freqs = positions.to(DT)[:, None] * inv_freq[None, :]  # [T, hd/2]
    emb = torch.cat([freqs, freqs], dim=-1)  # [T, hd]
    return emb.cos(), emb.sin()


def rotate_half(x):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x, positions, theta):
    """x: [T, n_heads, head_dim]; positions: [T] absolute positions."""
    cos, sin = rope_cos_sin(positions, x.shape[-1], theta)
    cos, sin = cos[:, None, :], sin[:, None, :]  # broadcast over heads
    return x * cos + rotate_half(x) * sin


def attention(q, k, v, allowed):
    """Grouped-query attention.

    q: [Tq, H, hd]; k, v: [Tk, KV, hd]; allowed: bool [Tq, Tk] (True = may attend).
    Returns [Tq, H * hd].
    """
    tq, n_heads, hd = q.shape
    n_kv = k.shape[1]
    group = n_heads // n_kv
    scale = hd ** -0.5
    out = torch.empty(tq, n_heads, hd, dtype=DT)
    for h in range(n_heads):
        kvh = h // group
        scores = (q[:, h, :] @ k[:, kvh, :].t()) * scale  # [Tq, Tk]
        scores = scores.masked_fill(~allowed, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[:, h, :] = probs @ v[:, kvh, :]
    return out.reshape(tq, n_heads * hd)


def mlp(x, w, prefix):
    gate = linear(x, w[prefix + "mlp.gate_proj.weight"])
    up = linear(x, w[prefix + "mlp.up_proj.weight"])
    return linear(silu(gate) * up, w[prefix + "mlp.down_proj.weight"])


def to64(tensors):
    return {name: t.to(DT) for name, t in tensors.items()}


# ---------------------------------------------------------------------------
# Qwen3 target with a KV cache
# ---------------------------------------------------------------------------


class Qwen3Reference:
    def __init__(self, cfg, weights_f32):
        self.cfg = cfg
        self.w = to64(weights_f32)
        self.n_layers = cfg["num_hidden_layers"]
        self.n_heads = cfg["num_attention_heads"]
        self.n_kv = cfg["num_key_value_heads"]
        self.hd = cfg["head_dim"]
        self.eps = cfg["rms_norm_eps"]
        self.theta = cfg["rope_theta"]
        self.reset()

    def reset(self):
        # Per layer: K (after k_norm and RoPE) and V, each [past, KV, hd].
        self.k_cache = [torch.zeros(0, self.n_kv, self.hd, dtype=DT) for _ in range(self.n_layers)]
        self.v_cache = [torch.zeros(0, self.n_kv, self.hd, dtype=DT) for _ in range(self.n_layers)]

    def past_len(self):
        return self.k_cache[0].shape[0]

    def embed(self, ids):
        return self.w["model.embed_tokens.weight"][ids]

    def lm_head(self, x):
        return linear(x, self.w["lm_head.weight"])

    def forward(self, ids):
        """Runs ids at positions past..past+T-1 against the cache and appends to it.

        Returns (logits [T, V], layer_outputs: list of [T, D], one per decoder layer,
        before the final norm).
        """
        w = self.w
        t = ids.shape[0]
        past = self.past_len()
        positions = torch.arange(past, past + t)
        # Query i (absolute past+i) sees key j iff j <= past + i.
        key_pos = torch.arange(0, past + t)
        allowed = key_pos[None, :] <= positions[:, None]

        x = self.embed(ids)
        layer_outputs = []
        for i in range(self.n_layers):
            p = "model.layers.%d." % i
            h = rms_norm(x, w[p + "input_layernorm.weight"], self.eps)
            q = linear(h, w[p + "self_attn.q_proj.weight"]).reshape(t, self.n_heads, self.hd)
            k = linear(h, w[p + "self_attn.k_proj.weight"]).reshape(t, self.n_kv, self.hd)
            v = linear(h, w[p + "self_attn.v_proj.weight"]).reshape(t, self.n_kv, self.hd)
            q = rms_norm(q, w[p + "self_attn.q_norm.weight"], self.eps)
            k = rms_norm(k, w[p + "self_attn.k_norm.weight"], self.eps)
            q = apply_rope(q, positions, self.theta)
            k = apply_rope(k, positions, self.theta)
            self.k_cache[i] = torch.cat([self.k_cache[i], k], dim=0)
            self.v_cache[i] = torch.cat([self.v_cache[i], v], dim=0)
            a = attention(q, self.k_cache[i], self.v_cache[i], allowed)
            x = x + linear(a, w[p + "self_attn.o_proj.weight"])
            h = rms_norm(x, w[p + "post_attention_layernorm.weight"], self.eps)
            x = x + mlp(h, w, p)
            layer_outputs.append(x)
        x = rms_norm(x, w["model.norm.weight"], self.eps)
        return self.lm_head(x), layer_outputs


# ---------------------------------------------------------------------------
# DFlash drafter with a context cache
# ---------------------------------------------------------------------------


class DFlashReference:
    def __init__(self, cfg, weights_f32, target):
        self.cfg = cfg
        self.w = to64(weights_f32)
        self.target = target  # supplies embed_tokens and lm_head
        self.n_layers = cfg["num_hidden_layers"]
        self.n_heads = cfg["num_attention_heads"]
        self.n_kv = cfg["num_key_value_heads"]
        self.hd = cfg["head_dim"]
        self.eps = cfg["rms_norm_eps"]
        self.theta = cfg["rope_theta"]
        self.reset()

    def reset(self):
        self.k_cache = [torch.zeros(0, self.n_kv, self.hd, dtype=DT) for _ in range(self.n_layers)]
        self.v_cache = [torch.zeros(0, self.n_kv, self.hd, dtype=DT) for _ in range(self.n_layers)]

    def ctx_len(self):
        return self.k_cache[0].shape[0]

    def append_context(self, features):
        """features [n, n_ids*D] of the next n committed tokens (absolute positions
        ctx_len..ctx_len+n-1). Projects them once and appends per-layer K/V."""
        w = self.w
        n = features.shape[0]
        start = self.ctx_len()
        positions = torch.arange(start, start + n)
        ctx = rms_norm(linear(features, w["fc.weight"]), w["hidden_norm.weight"], self.eps)
        for i in range(self.n_layers):
            p = "layers.%d." % i
            k = linear(ctx, w[p + "self_attn.k_proj.weight"]).reshape(n, self.n_kv, self.hd)
            v = linear(ctx, w[p + "self_attn.v_proj.weight"]).reshape(n, self.n_kv, self.hd)
            k = rms_norm(k, w[p + "self_attn.k_norm.weight"], self.eps)
            k = apply_rope(k, positions, self.theta)
            self.k_cache[i] = torch.cat([self.k_cache[i], k], dim=0)
            self.v_cache[i] = torch.cat([self.v_cache[i], v], dim=0)

    def draft(self, block_tokens, causal_editor=False):
        """One pass over a block at positions start..start+W-1 (start = ctx_len).
        The block's K/V is used for this pass only, never cached. Returns logits [W, V]."""
        w = self.w
        wb = block_tokens.shape[0]
        start = self.ctx_len()
        positions = torch.arange(start, start + wb)
        if causal_editor:
            # Block query i sees every context key and block keys j <= i.
            ctx_part = torch.ones(wb, start, dtype=torch.bool)
            blk_part = torch.arange(wb)[None, :] <= torch.arange(wb)[:, None]
            allowed = torch.cat([ctx_part, blk_part], dim=1)
        else:
            allowed = torch.ones(wb, start + wb, dtype=torch.bool)

        x = self.target.embed(block_tokens)
        for i in range(self.n_layers):
            p = "layers.%d." % i
            h = rms_norm(x, w[p + "input_layernorm.weight"], self.eps)
            q = linear(h, w[p + "self_attn.q_proj.weight"]).reshape(wb, self.n_heads, self.hd)
            k = linear(h, w[p + "self_attn.k_proj.weight"]).reshape(wb, self.n_kv, self.hd)
            v = linear(h, w[p + "self_attn.v_proj.weight"]).reshape(wb, self.n_kv, self.hd)
            q = rms_norm(q, w[p + "self_attn.q_norm.weight"], self.eps)
            k = rms_norm(k, w[p + "self_attn.k_norm.weight"], self.eps)
            q = apply_rope(q, positions, self.theta)
            k = apply_rope(k, positions, self.theta)
            k_all = torch.cat([self.k_cache[i], k], dim=0)
            v_all = torch.cat([self.v_cache[i], v], dim=0)
            a = attention(q, k_all, v_all, allowed)
            x = x + linear(a, w[p + "self_attn.o_proj.weight"])
            h = rms_norm(x, w[p + "post_attention_layernorm.weight"], self.eps)
            x = x + mlp(h, w, p)
        x = rms_norm(x, w["norm.weight"], self.eps)
        return self.target.lm_head(x)


# ---------------------------------------------------------------------------
# safetensors writer
# ---------------------------------------------------------------------------

_ST_DTYPES = {torch.float32: ("F32", "<f4"), torch.int64: ("I64", "<i8")}


def write_safetensors(path, tensors, metadata=None):
    """[u64 LE header length][JSON header, space-padded to 8 bytes][data].
    Tensors laid out in name order; offsets relative to the data start."""
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        st_dtype, np_dtype = _ST_DTYPES[t.dtype]
        data = t.numpy().astype(np_dtype).tobytes()
        header[name] = {
            "dtype": st_dtype,
            "shape": list(t.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((8 - len(hjson) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    """Minimal reader, used only to check that what was written reads back."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n].decode("utf-8"))
    data = raw[8 + n :]
    out = {}
    rev = {"F32": "<f4", "I64": "<i8"}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        arr = np.frombuffer(data[b:end], dtype=rev[e["dtype"]]).reshape(e["shape"])
        out[name] = torch.from_numpy(arr.copy())
    return out


def write_checkpoint(folder, cfg, tensors):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    path = os.path.join(folder, "model.safetensors")
    write_safetensors(path, tensors, {"format": "pt"})
    back = read_safetensors(path)
    assert set(back) == set(tensors)
    for name, t in tensors.items():
        assert torch.equal(back[name], t), name


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------


def max_abs_diff(a, b):
    return (a - b).abs().max().item()


def top5(row):
    return row.topk(5).indices.tolist()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output folder, e.g. tests/testdata/golden")
    args = ap.parse_args()

    torch.manual_seed(20240611)
    tcfg, dcfg = TARGET_CONFIG, DRAFTER_CONFIG
    target_w = make_target_weights(tcfg, seed=1234)
    drafter_w = make_drafter_weights(dcfg, seed=5678)
    gen = torch.Generator().manual_seed(42)
    input_ids = torch.randint(0, PROMPT_ID_LIMIT, (PROMPT_LEN,), generator=gen, dtype=torch.int64)

    target = Qwen3Reference(tcfg, target_w)
    layer_ids = dcfg["dflash_config"]["target_layer_ids"]
    mask_id = dcfg["dflash_config"]["mask_token_id"]
    block = dcfg["block_size"]
    tol = 1e-10  # float64 vs float64: only summation-order differences

    # --- target: full causal forward (prefill) ---
    target.reset()
    target_logits, outs = target.forward(input_ids)
    target_features = torch.cat([outs[l] for l in layer_ids], dim=-1)

    # Self-check (a): token-by-token with the KV cache == full forward.
    target.reset()
    step_logits, step_feats = [], []
    for t in range(PROMPT_LEN):
        lg, o = target.forward(input_ids[t : t + 1])
        step_logits.append(lg)
        step_feats.append(torch.cat([o[l] for l in layer_ids], dim=-1))
    d_logits = max_abs_diff(torch.cat(step_logits), target_logits)
    d_feats = max_abs_diff(torch.cat(step_feats), target_features)
    assert d_logits < tol and d_feats < tol, (d_logits, d_feats)
    # And a mixed split (prefill 4, then a chunk of 5, then 2) against the cache.
    target.reset()
    parts = [target.forward(input_ids[a:b])[0] for a, b in ((0, 4), (4, 9), (9, 11))]
    d_chunk = max_abs_diff(torch.cat(parts), target_logits)
    assert d_chunk < tol, d_chunk
    # Sanity: the causal mask matters (changing the last token only changes the last row).
    target.reset()
    alt = input_ids.clone()
    alt[-1] = (alt[-1] + 1) % PROMPT_ID_LIMIT
    alt_logits, _ = target.forward(alt)
    assert max_abs_diff(alt_logits[:-1], target_logits[:-1]) < tol
    assert max_abs_diff(alt_logits[-1], target_logits[-1]) > 1e-3
    print("self-check (a) passed: incremental KV-cache decode == full forward "
          "(max |diff| logits %.2e, features %.2e, chunked %.2e)" % (d_logits, d_feats, d_chunk))

    # --- drafter ---
    bonus = int(target_logits[-1].argmax())
    block_p1 = torch.tensor([bonus] + [mask_id] * (block - 1), dtype=torch.int64)

    drafter = DFlashReference(dcfg, drafter_w, target)
    drafter.append_context(target_features)
    p1_logits = drafter.draft(block_p1)
    p1_causal_logits = drafter.draft(block_p1, causal_editor=True)
    block_p2 = torch.cat([block_p1[:1], p1_logits[1:].argmax(dim=-1)])
    p2_logits = drafter.draft(block_p2)
    assert drafter.ctx_len() == PROMPT_LEN  # drafting never writes the cache

    # Self-check (b): context appended in two chunks == one chunk.
    drafter2 = DFlashReference(dcfg, drafter_w, target)
    drafter2.append_context(target_features[:5])
    drafter2.append_context(target_features[5:])
    d_p1 = max_abs_diff(drafter2.draft(block_p1), p1_logits)
    d_p2 = max_abs_diff(drafter2.draft(block_p2), p2_logits)
    d_pc = max_abs_diff(drafter2.draft(block_p1, causal_editor=True), p1_causal_logits)
    assert max(d_p1, d_p2, d_pc) < tol, (d_p1, d_p2, d_pc)
    # Sanity: the causal editor's slot i ignores later block slots, the
    # bidirectional one does not.
    causal_on_p2 = drafter.draft(block_p2, causal_editor=True)
    assert max_abs_diff(causal_on_p2[0], p1_causal_logits[0]) < tol
    assert max_abs_diff(p2_logits[0], p1_logits[0]) > 1e-3
    assert max_abs_diff(p1_causal_logits, p1_logits) > 1e-3
    # Sanity: editing actually changes the output.
    assert max_abs_diff(p2_logits, p1_logits) > 1e-3
    print("self-check (b) passed: drafter independent of context chunking "
          "(max |diff| p1 %.2e, p2 %.2e, causal %.2e)" % (d_p1, d_p2, d_pc))

    # --- write ---
    out = args.out
    write_checkpoint(os.path.join(out, "target"), tcfg, target_w)
    write_checkpoint(os.path.join(out, "drafter"), dcfg, drafter_w)
    f32 = lambda t: t.to(torch.float32).contiguous()
    expected = {
        "input_ids": input_ids,
        "target_logits": f32(target_logits),
        "target_features": f32(target_features),
        "block_p1_tokens": block_p1,
        "drafter_p1_logits": f32(p1_logits),
        "block_p2_tokens": block_p2,
        "drafter_p2_logits": f32(p2_logits),
        "drafter_p1_causal_logits": f32(p1_causal_logits),
    }
    meta = {
        "format": "pt",
        "generator": "tests/golden/make_golden.py",
        "start": str(PROMPT_LEN),
        "mask_token_id": str(mask_id),
        "target_layer_ids": json.dumps(layer_ids),
    }
    exp_path = os.path.join(out, "expected.safetensors")
    write_safetensors(exp_path, expected, meta)
    back = read_safetensors(exp_path)
    for name, t in expected.items():
        assert torch.equal(back[name], t), name

    # --- eyeballing ---
    print("input_ids:", input_ids.tolist())
    print("target top-5 at last position:", top5(target_logits[-1]), "-> bonus", bonus)
    print("target_logits range: [%.3f, %.3f]" % (target_logits.min(), target_logits.max()))
    print("block_p1_tokens:", block_p1.tolist())
    for i in range(block):
        print("  drafter_p1 slot %d top-5: %s" % (i, top5(p1_logits[i])))
    print("block_p2_tokens:", block_p2.tolist())
    print("drafter_p2 argmax:", p2_logits.argmax(dim=-1).tolist())
    print("drafter_p1_causal argmax:", p1_causal_logits.argmax(dim=-1).tolist())
    for root, _, files in sorted(os.walk(out)):
        for fn in sorted(files):
            p = os.path.join(root, fn)
            print("wrote %s (%d bytes)" % (p, os.path.getsize(p)))


if __name__ == "__main__":
    main()
