"""Seeded random weights for K3-mini, created directly on the target device.

Every weight is a plain tensor in one flat dict, keyed by a clear name. Linear weights use the
``nn.Linear`` layout ``[out_features, in_features]`` (y = x @ W.T). Names (i = layer index):

    embed                  [vocab, hidden]
    final_norm             [hidden]
    lm_head                [vocab, hidden]                   untied
    L{i}.attn_norm         [hidden]           L{i}.ffn_norm  [hidden]
  KDA layer (d = kda_heads * kda_head_dim, r = kda_rank, W = kda_conv):
    L{i}.qkv_proj          [3d, hidden]       rows: q | k | v, each head-major (h * K + c)
    L{i}.conv              [3d, W]            depthwise causal conv taps, oldest first
    L{i}.f_a [r, hidden]   L{i}.f_b [d, r]    low-rank decay input f(x)
    L{i}.A_log [H] fp32    L{i}.dt_bias [d] fp32     g = lb * sigmoid(exp(A_log) * (f(x) + dt_bias))
    L{i}.b_proj            [H, hidden]        beta = sigmoid(b_proj x)
    L{i}.g_a [r, hidden]   L{i}.g_b [d, r]    low-rank sigmoid output gate
    L{i}.o_norm            [K]                per-head RMSNorm weight
    L{i}.o_proj            [hidden, d]
  MLA layer (H = mla_heads):
    L{i}.q_a [q_lora, hidden]  L{i}.q_a_norm [q_lora]  L{i}.q_b [H * qk_nope, q_lora]
    L{i}.kv_a [kv_lora, hidden]  L{i}.kv_a_norm [kv_lora]
    L{i}.kv_b              [H * (qk_nope + v_head), kv_lora]  per head: qk_nope rows of W_uk then
                           v_head rows of W_uv (view [H, qk_nope + v_head, kv_lora])
    L{i}.gate_proj         [H * v_head, hidden]   sigmoid output gate (gated attention)
    L{i}.o_proj            [hidden, H * v_head]
  FFN, layer 0 (dense SwiGLU):  L0.w13 [2 * dense_inter, hidden] (gate rows | up rows), L0.w2
  FFN, other layers (latent MoE):
    L{i}.router [E, hidden] fp32     L{i}.router_bias [E] fp32 (selection only)
    L{i}.moe_down [latent, hidden]   L{i}.moe_up [hidden, latent]
    L{i}.experts_w13 [E, 2 * expert_inter, latent]  L{i}.experts_w2 [E, latent, expert_inter]
    L{i}.shared_w13 [2 * n_shared * shared_inter, hidden]  L{i}.shared_w2 [hidden, n_shared * shared_inter]
    (several shared experts are one concatenated SwiGLU — the same function)

Scales: std 1/sqrt(fan_in) for input projections; output projections of every residual branch
get an extra 1/sqrt(2 * n_layers); the LM head is scaled so next-token distributions are neither
flat nor peaked (measured in docs/k3-mini.md; asserted by tests/test_k3_model.py). KDA decay
biases are spread so channels range from long memory (g ~ -0.002) to fast decay (g ~ -3.6).

Values are drawn in fp32 from a ``torch.Generator`` on the target device with a fixed order, then
rounded to ``round_dtype`` (the path's dtype) and stored in ``dtype``. The fp32 oracle uses
``round_dtype=bf16, dtype=fp32``: exactly the standard path's weights, upcast.
"""

from __future__ import annotations

import math

import torch

from .config import K3Config

LM_HEAD_GAIN = 3.0
FP32_NAMES = ("A_log", "dt_bias", "router", "router_bias")
# KDA decay parameters, uniform in these ranges: dt_bias down to -8 gives long-memory channels
# (g ~ -0.002, forget gate ~0.998), up to 1 fast-decaying ones; the kernels suite draws its
# long-horizon inputs from the same ranges (fast/kernels/kda_decode.py)
KDA_A_LOG_INIT = (-0.5, 0.5)
KDA_DT_BIAS_INIT = (-8.0, 1.0)


def init_weights(cfg: K3Config, *, device="cpu", dtype=torch.float32, round_dtype=None, seed: int = 0) -> dict[str, torch.Tensor]:
    device = torch.device(device)
    gen = None  # the meta device (shapes only: weights_file checks a checkpoint's layout) has no generator
    if device.type != "meta":
        gen = torch.Generator(device=device)
        gen.manual_seed(seed)
    round_dtype = round_dtype or dtype
    res = 1.0 / math.sqrt(2 * cfg.n_layers)
    out: dict[str, torch.Tensor] = {}

    def store(name, t):
        if name.split(".")[-1] in FP32_NAMES:
            out[name] = t.float()
        else:
            out[name] = t.to(round_dtype).to(dtype)

    def normal(name, *shape, std):
        store(name, torch.randn(*shape, generator=gen, device=device, dtype=torch.float32) * std)

    def uniform(name, *shape, lo, hi):
        store(name, torch.rand(*shape, generator=gen, device=device, dtype=torch.float32) * (hi - lo) + lo)

    def ones(name, n):
        store(name, torch.ones(n, device=device))

    h, V = cfg.hidden, cfg.vocab_size
    normal("embed", V, h, std=1.0)
    for i in range(cfg.n_layers):
        p = f"L{i}."
        ones(p + "attn_norm", h)
        ones(p + "ffn_norm", h)
        if cfg.layer_kind(i) == "kda":
            d, r, H, K = cfg.kda_dim, cfg.kda_rank, cfg.kda_heads, cfg.kda_head_dim
            normal(p + "qkv_proj", 3 * d, h, std=h ** -0.5)
            normal(p + "conv", 3 * d, cfg.kda_conv, std=cfg.kda_conv ** -0.5)
            normal(p + "f_a", r, h, std=h ** -0.5)
            normal(p + "f_b", d, r, std=0.5 * r ** -0.5)
            uniform(p + "A_log", H, lo=KDA_A_LOG_INIT[0], hi=KDA_A_LOG_INIT[1])
            uniform(p + "dt_bias", d, lo=KDA_DT_BIAS_INIT[0], hi=KDA_DT_BIAS_INIT[1])
            normal(p + "b_proj", H, h, std=h ** -0.5)
            normal(p + "g_a", r, h, std=h ** -0.5)
            normal(p + "g_b", d, r, std=r ** -0.5)
            ones(p + "o_norm", K)
            normal(p + "o_proj", h, d, std=res * d ** -0.5)
        else:
            H = cfg.mla_heads
            normal(p + "q_a", cfg.q_lora, h, std=h ** -0.5)
            ones(p + "q_a_norm", cfg.q_lora)
            normal(p + "q_b", H * cfg.qk_nope, cfg.q_lora, std=cfg.q_lora ** -0.5)
            normal(p + "kv_a", cfg.kv_lora, h, std=h ** -0.5)
            ones(p + "kv_a_norm", cfg.kv_lora)
            normal(p + "kv_b", H * (cfg.qk_nope + cfg.v_head), cfg.kv_lora, std=cfg.kv_lora ** -0.5)
            normal(p + "gate_proj", H * cfg.v_head, h, std=h ** -0.5)
            normal(p + "o_proj", h, H * cfg.v_head, std=res * (H * cfg.v_head) ** -0.5)
        if cfg.ffn_kind(i) == "dense":
            normal(p + "w13", 2 * cfg.dense_inter, h, std=h ** -0.5)
            normal(p + "w2", h, cfg.dense_inter, std=res * cfg.dense_inter ** -0.5)
        else:
            E, L, I = cfg.n_experts, cfg.moe_latent, cfg.expert_inter
            Is = cfg.n_shared * cfg.shared_inter
            normal(p + "router", E, h, std=h ** -0.5)
            normal(p + "router_bias", E, std=0.1)
            normal(p + "moe_down", L, h, std=h ** -0.5)
            normal(p + "moe_up", h, L, std=res * L ** -0.5 / cfg.routed_scaling)
            normal(p + "experts_w13", E, 2 * I, L, std=L ** -0.5)
            normal(p + "experts_w2", E, L, I, std=I ** -0.5)
            normal(p + "shared_w13", 2 * Is, h, std=h ** -0.5)
            normal(p + "shared_w2", h, Is, std=res * Is ** -0.5)
    ones("final_norm", h)
    normal("lm_head", V, h, std=LM_HEAD_GAIN * h ** -0.5)
    return out
