"""K3-mini configurations.

Three sizes of the same architecture:

* ``tiny`` — CPU: hidden 64, 4 layers (KDA KDA KDA MLA), 8 experts top-2; a forward takes
  milliseconds, so the tests and the smoke tier run it.
* ``mini`` — one H200: 8 wide layers (KDA KDA KDA MLA KDA KDA KDA MLA), hidden 4096, 64
  latent-MoE experts top-8. Few, wide layers on purpose: a decode step made of many small
  kernels is bound by kernel count, not bytes.
* ``trained`` — mini's layer pattern at hidden 256 (4.6 M parameters), the size that is trained
  on the repository's synthetic tasks (lab/train/): its fp32 weights and both AdamW moments
  (12 bytes a parameter) must come back from a GPU run in at most 64 MiB, and its bf16
  checkpoint is one file of 9 MB. Every dimension is a power of two, as the fast kernels' tiles
  want (docs/k3-mini.md "The trained config").

Parameter counts and the active bytes read per decoded token are computed by
``param_counts`` / ``active_bytes_per_token`` (never typed by hand); ``python -m
optimized_model.k3.config`` prints them (figures copied into docs/k3-mini.md).

The vocabulary size comes from the tokenizer (``optimized_model.k3.tokenizer``): 256 bytes +
specials, padded to a multiple of 64. Ids >= ``n_real_tokens`` are padding; the model sets
their logits to -inf.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace


def _tokenizer_vocab() -> tuple[int, int]:
    """(padded vocab size, number of real ids) — the one place the numbers come from."""
    from optimized_model.k3.tokenizer import K3Tokenizer

    tok = K3Tokenizer()
    return tok.vocab_size, tok.n_real_tokens


@dataclass(frozen=True)
class K3Config:
    name: str
    hidden: int
    n_layers: int
    # KDA (Kimi Delta Attention)
    kda_heads: int
    kda_head_dim: int  # K == V
    kda_conv: int = 4
    kda_lower_bound: float = -5.0
    # gated MLA
    mla_heads: int = 2
    q_lora: int = 32
    kv_lora: int = 16
    qk_nope: int = 16
    v_head: int = 16
    # MoE
    n_experts: int = 8
    top_k: int = 2
    moe_latent: int = 32
    expert_inter: int = 32
    n_shared: int = 1
    shared_inter: int = 64
    dense_inter: int = 128
    routed_scaling: float = 2.5
    norm_eps: float = 1e-6
    mla_every: int = 4
    vocab_size: int = field(default_factory=lambda: _tokenizer_vocab()[0])
    n_real_tokens: int = field(default_factory=lambda: _tokenizer_vocab()[1])

    # -- layer pattern ----------------------------------------------------------------------
    @property
    def kda_rank(self) -> int:
        """Rank of the low-rank gate projections (hidden -> head_dim -> H*K)."""
        return self.kda_head_dim

    def layer_kind(self, i: int) -> str:
        """"mla" at every ``mla_every``-th layer and the last, "kda" elsewhere."""
        return "mla" if (i + 1) % self.mla_every == 0 or i == self.n_layers - 1 else "kda"

    @property
    def layer_kinds(self) -> list[str]:
        return [self.layer_kind(i) for i in range(self.n_layers)]

    def ffn_kind(self, i: int) -> str:
        return "dense" if i == 0 else "moe"

    @property
    def n_kda(self) -> int:
        return self.layer_kinds.count("kda")

    @property
    def n_mla(self) -> int:
        return self.layer_kinds.count("mla")

    def slot(self, i: int) -> int:
        """Index of layer i among the layers of its kind (row in the stacked state)."""
        return self.layer_kinds[:i].count(self.layer_kind(i))

    @property
    def kda_dim(self) -> int:
        return self.kda_heads * self.kda_head_dim


TINY = K3Config(
    name="tiny", hidden=64, n_layers=4, kda_heads=2, kda_head_dim=32,
    mla_heads=2, q_lora=32, kv_lora=16, qk_nope=16, v_head=16,
    n_experts=8, top_k=2, moe_latent=32, expert_inter=32, shared_inter=64, dense_inter=128,
)

MINI = K3Config(
    name="mini", hidden=4096, n_layers=8, kda_heads=32, kda_head_dim=128,
    mla_heads=32, q_lora=1536, kv_lora=512, qk_nope=128, v_head=128,
    n_experts=64, top_k=8, moe_latent=2048, expert_inter=1024, shared_inter=4096, dense_inter=11008,
)

# MLA at every 2nd layer (1, 3, 5, 7), not mini's every 4th: with two attention layers the trained
# weights chose MRCR's k-th message with one layer; with four they score higher from ~1k to ~8k
# (docs/k3-mini.md, "The trained config")
TRAINED = K3Config(
    name="trained", hidden=256, n_layers=8, kda_heads=4, kda_head_dim=64,
    mla_heads=4, q_lora=128, kv_lora=64, qk_nope=64, v_head=64,
    n_experts=8, top_k=2, moe_latent=64, expert_inter=64, shared_inter=128, dense_inter=512,
    mla_every=2,
)

CONFIGS = {"tiny": TINY, "mini": MINI, "trained": TRAINED}


def get_config(name: str | K3Config, **overrides) -> K3Config:
    if isinstance(name, K3Config):
        cfg = name
    elif name in CONFIGS:
        cfg = CONFIGS[name]
    else:
        raise ValueError(f"unknown K3 config {name!r}; choose one of {sorted(CONFIGS)}")
    return replace(cfg, **overrides) if overrides else cfg


# -- parameter accounting ------------------------------------------------------------------
def layer_param_counts(cfg: K3Config, i: int) -> dict[str, int]:
    """Parameters of layer i split into: attn, ffn_dense (always read), experts (routed, all),
    expert_each (one routed expert), moe_other (router, latent projections, shared experts)."""
    h = cfg.hidden
    out: dict[str, int] = {"attn": 0, "ffn_dense": 0, "experts": 0, "expert_each": 0, "moe_other": 0}
    out["attn"] += 2 * h  # the two pre-norms of the block
    if cfg.layer_kind(i) == "kda":
        d, r, H, K = cfg.kda_dim, cfg.kda_rank, cfg.kda_heads, cfg.kda_head_dim
        out["attn"] += 3 * h * d + 3 * d * cfg.kda_conv  # q,k,v proj + depthwise conv
        out["attn"] += h * r + r * d + H + d  # f_a, f_b, A_log, dt_bias
        out["attn"] += h * H  # b_proj
        out["attn"] += h * r + r * d  # output gate g_a, g_b
        out["attn"] += K + d * h  # o_norm (per head dim), o_proj
    else:
        H = cfg.mla_heads
        out["attn"] += h * cfg.q_lora + cfg.q_lora + cfg.q_lora * H * cfg.qk_nope
        out["attn"] += h * cfg.kv_lora + cfg.kv_lora + cfg.kv_lora * H * (cfg.qk_nope + cfg.v_head)
        out["attn"] += h * H * cfg.v_head + H * cfg.v_head * h  # gate proj, o_proj
    if cfg.ffn_kind(i) == "dense":
        out["ffn_dense"] = 3 * h * cfg.dense_inter
    else:
        each = 3 * cfg.moe_latent * cfg.expert_inter
        out["expert_each"] = each
        out["experts"] = cfg.n_experts * each
        out["moe_other"] = cfg.n_experts * h + cfg.n_experts  # router + correction bias
        out["moe_other"] += 2 * h * cfg.moe_latent  # latent down / up
        out["moe_other"] += cfg.n_shared * 3 * h * cfg.shared_inter
    return out


def param_counts(cfg: K3Config) -> dict[str, int]:
    """{"total", "embedding", "lm_head", "layers", "experts", "active_per_token"}."""
    emb = cfg.vocab_size * cfg.hidden
    head = cfg.vocab_size * cfg.hidden + cfg.hidden  # + final norm
    layers = [layer_param_counts(cfg, i) for i in range(cfg.n_layers)]
    experts = sum(l["experts"] for l in layers)
    non_exp = sum(l["attn"] + l["ffn_dense"] + l["moe_other"] for l in layers)
    active = head + non_exp + sum(cfg.top_k * l["expert_each"] for l in layers)
    return {
        "total": emb + head + non_exp + experts,
        "embedding": emb,
        "lm_head": head,
        "layers": non_exp + experts,
        "experts": experts,
        "active_per_token": active,  # embedding rows read per token are negligible
    }


def experts_touched(cfg: K3Config, batch: int) -> float:
    """Expected distinct experts per MoE layer at ``batch`` tokens (uniform routing)."""
    e, k = cfg.n_experts, cfg.top_k
    return e * (1.0 - (1.0 - k / e) ** batch)


def state_bytes_per_seq(cfg: K3Config, context: int, dtype_bytes: int = 2) -> int:
    """Decode-state bytes per sequence: KDA fp32 states + conv states + MLA latent cache."""
    kda = cfg.n_kda * (cfg.kda_heads * cfg.kda_head_dim * cfg.kda_head_dim * 4
                       + 3 * cfg.kda_dim * (cfg.kda_conv - 1) * dtype_bytes)
    mla = cfg.n_mla * context * cfg.kv_lora * dtype_bytes
    return kda + mla


def bytes_per_step(cfg: K3Config, batch: int, context: int, dtype_bytes: int = 2) -> int:
    """Minimum bytes a decode step of ``batch`` sequences at ``context`` must move: every
    non-expert weight once, the expected distinct routed experts once, each sequence's state
    read and written (KDA fp32 state r+w, conv r+w, latent cache read)."""
    layers = [layer_param_counts(cfg, i) for i in range(cfg.n_layers)]
    pc = param_counts(cfg)
    w = pc["lm_head"] + sum(l["attn"] + l["ffn_dense"] + l["moe_other"] for l in layers)
    w += sum(experts_touched(cfg, batch) * l["expert_each"] for l in layers)
    kda_state = cfg.n_kda * cfg.kda_heads * cfg.kda_head_dim ** 2 * 4 * 2
    conv = cfg.n_kda * 3 * cfg.kda_dim * (cfg.kda_conv - 1) * dtype_bytes * 2
    latent = cfg.n_mla * context * cfg.kv_lora * dtype_bytes
    return int(w * dtype_bytes + batch * (kda_state + conv + latent))


def active_bytes_per_token(cfg: K3Config, dtype_bytes: int = 2) -> int:
    """Weight bytes read per decoded token at batch 1 (bf16 by default)."""
    return param_counts(cfg)["active_per_token"] * dtype_bytes


def describe(cfg: K3Config) -> str:
    pc = param_counts(cfg)
    lines = [f"K3 config {cfg.name}: layers {' '.join(k.upper() for k in cfg.layer_kinds)}",
             f"  vocab {cfg.vocab_size} (real {cfg.n_real_tokens}), hidden {cfg.hidden}"]
    for k, v in pc.items():
        lines.append(f"  {k:18s} {v:>15,d}")
    lines.append(f"  active bytes/token (bf16, batch 1): {active_bytes_per_token(cfg):,d}")
    for b in (1, 8, 64):
        lines.append(f"  bytes/step batch {b:2d} ctx 32768 (bf16): {bytes_per_step(cfg, b, 32768):,d}"
                     f"  (experts touched/layer {experts_touched(cfg, b):.1f})")
    lines.append(f"  state bytes/seq at 32768: {state_bytes_per_seq(cfg, 32768):,d}")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    for c in CONFIGS.values():
        print(describe(c))
