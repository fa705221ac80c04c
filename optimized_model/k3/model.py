"""K3-mini: Kimi K3's architecture at one-GPU size, and its STANDARD path (gpt-fast style).

Structure: embedding -> n_layers pre-norm residual blocks -> RMSNorm -> untied LM
head over a vocabulary padded to a multiple of 64 (padding ids get -inf logits). Block i:
``x += attn_i(norm(x)); x += ffn_i(norm(x))`` with

* attn: MLA at every 4th layer and the last, KDA elsewhere; no positional encoding.
  - KDA: fused q|k|v projection -> causal depthwise conv (kernel 4) + SiLU -> L2-normalised
    q, k per head; decay g = -5 * sigmoid(exp(A_log) * (f_b f_a x + dt_bias)) per channel;
    beta = sigmoid(b_proj x) per head; fp32 delta-rule state (see kda.py, fla's convention);
    output per-head RMSNorm * sigmoid(g_b g_a x) -> o_proj.
  - gated MLA: q = q_b RMSNorm(q_a x); latent c = RMSNorm(kv_a x) (the only thing cached);
    k | v = kv_b c per head; softmax(q k^T / sqrt(qk_nope)) v * sigmoid(gate_proj x) -> o_proj.
    Decode uses absorbed weights: q_lat = q W_uk (per head, into latent space), scores and
    the weighted sum run over the cached latents, then W_uv.
* ffn: layer 0 dense SwiGLU; others latent MoE: fp32 sigmoid router on x, correction bias used
  only to select the top-k, weights normalised over the selected * routed_scaling; routed
  experts are SwiGLUs in the latent width between moe_down (hidden -> latent) and moe_up; plus
  shared SwiGLU expert(s) at full width.

Standard path = what a generic engine does: plain PyTorch; on GPU fla-core's ``chunk_kda``
(prefill) and ``fused_recurrent_kda`` (decode, state updated in place); MoE by sorting the
(token, expert) pairs by expert and ``torch._grouped_mm`` (else a loop over the active
experts). The oracle (``oracle=True``) is the same math with fp32 weights and activations, the
torch recurrence and the expert loop. Weights: weights.py (names, layouts); state: state.py.

Sizes (computed by config.param_counts; see docs/k3-mini.md): mini = 3.95 B parameters,
1.48 B active per token -> 2.96 GB of bf16 weights read per decoded token at batch 1;
tiny = 277 k parameters.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .config import K3Config, get_config
from .kda import kda_chunked, kda_recurrent, kda_step_
from .state import DecodeState, new_state, random_state
from .weights import init_weights


def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).sum(-1, keepdim=True) + eps)


def swiglu(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    h = F.linear(x, w13)
    a, b = h.chunk(2, dim=-1)
    return F.linear(F.silu(a) * b, w2)


def _has_grouped_mm() -> bool:
    return hasattr(torch, "_grouped_mm")


class K3Model:
    """Weights (a flat dict of plain tensors, weights.py) + the standard-path forward."""

    def __init__(self, cfg: K3Config, weights: dict[str, torch.Tensor], *, oracle: bool = False,
                 kda_backend: str | None = None, moe_backend: str | None = None):
        self.cfg = cfg
        self.w = weights
        self.device = weights["embed"].device
        self.dtype = weights["embed"].dtype
        self.oracle = oracle
        on_cuda = self.device.type == "cuda"
        self.kda_backend = kda_backend or ("fla" if on_cuda and not oracle else "torch")
        grouped_ok = _has_grouped_mm() and (not on_cuda or self.dtype == torch.bfloat16)
        self.moe_backend = moe_backend or ("grouped" if grouped_ok and not oracle else "loop")
        self._fla = None

    @classmethod
    def build(cls, config="tiny", *, device="cpu", dtype=torch.float32, seed: int = 0,
              oracle: bool = False, round_dtype=None, **kw) -> "K3Model":
        cfg = get_config(config)
        if oracle:
            round_dtype, dtype = round_dtype or dtype, torch.float32
        w = init_weights(cfg, device=device, dtype=dtype, round_dtype=round_dtype, seed=seed)
        return cls(cfg, w, oracle=oracle, **kw)

    def W(self, i: int, name: str) -> torch.Tensor:
        return self.w[f"L{i}.{name}"]

    # -- state ------------------------------------------------------------------------------
    def new_state(self, batch: int, capacity: int) -> DecodeState:
        return new_state(self.cfg, batch, capacity, device=self.device, dtype=self.dtype)

    def random_state(self, batch: int, context: int, capacity: int, seed: int = 0) -> DecodeState:
        return random_state(self.cfg, batch, context, capacity, device=self.device, dtype=self.dtype, seed=seed)

    # -- KDA ----------------------------------------------------------------------------------
    def _kda_gates(self, i, x):
        """(g [.., H, K] fp32 log-decay, beta [.., H] fp32) for inputs x [.., hidden]."""
        cfg = self.cfg
        H, K = cfg.kda_heads, cfg.kda_head_dim
        f = F.linear(F.linear(x, self.W(i, "f_a")), self.W(i, "f_b")).float()
        f = (f + self.W(i, "dt_bias")).unflatten(-1, (H, K))
        g = cfg.kda_lower_bound * torch.sigmoid(self.W(i, "A_log").exp().unsqueeze(-1) * f)
        beta = torch.sigmoid(F.linear(x, self.W(i, "b_proj")).float())
        return g, beta

    def _kda_out(self, i, o, x):
        """Per-head RMSNorm of o [.., H, V] * sigmoid output gate -> o_proj."""
        cfg = self.cfg
        o = rmsnorm(o.float(), self.W(i, "o_norm"), cfg.norm_eps)
        gate = torch.sigmoid(F.linear(F.linear(x, self.W(i, "g_a")), self.W(i, "g_b")).float())
        o = (o.flatten(-2) * gate).to(x.dtype)
        return self._reduce(F.linear(o, self.W(i, "o_proj")))

    # -- tensor-parallel seams: identities on one rank (parallel.K3ParallelModel overrides them,
    # so the math below is written once for both) -------------------------------------------------
    def _gather(self, t):
        """The ranks' slices of the last dimension -> the whole."""
        return t

    def _reduce(self, t):
        """The ranks' partial sums -> their sum."""
        return t

    def _reduce_scatter(self, t):
        """The ranks' partial sums -> this rank's slice (last dimension) of their sum."""
        return t

    def _mla_latents(self, i, x):
        """MLA's q and kv latents of ``x`` before their norms."""
        return F.linear(x, self.W(i, "q_a")), F.linear(x, self.W(i, "kv_a"))

    def _fla_ops(self):
        if self._fla is None:
            from fla.ops.kda import chunk_kda
            from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd

            # a graph break under torch.compile (the compiled standard step): fla's Triton op runs
            # as it is, inside the same CUDA graph
            self._fla = (chunk_kda, torch.compiler.disable(fused_recurrent_kda_fwd))
        return self._fla

    def kda_prefill(self, i, x, lengths, valid, state: DecodeState):
        cfg, s = self.cfg, self.cfg.slot(i)
        B, T, _ = x.shape
        H, K, Wc = cfg.kda_heads, cfg.kda_head_dim, cfg.kda_conv
        qkv = F.linear(x, self.W(i, "qkv_proj")).transpose(1, 2)  # [B, 3d, T]
        xp = F.pad(qkv, (Wc - 1, 0))
        w = self.W(i, "conv").float()
        conv = sum(xp[:, :, j:j + T].float() * w[:, j:j + 1] for j in range(Wc))  # fp32 accumulate
        # conv state = the last W-1 real inputs: padded positions lengths .. lengths + W-2
        idx = (lengths.view(B, 1) + torch.arange(Wc - 1, device=x.device)).unsqueeze(1)
        state.conv[s].copy_(xp.gather(2, idx.expand(B, qkv.shape[1], Wc - 1)))
        q, k, v = F.silu(conv).transpose(1, 2).unflatten(-1, (3, H, K)).unbind(2)
        q, k = l2norm(q), l2norm(k)
        g, beta = self._kda_gates(i, x)
        g = g * valid[:, :, None, None]  # padded steps: no decay, no update
        beta = beta * valid[:, :, None]
        if self.kda_backend == "fla":
            chunk_kda, _ = self._fla_ops()
            o, S = chunk_kda(q.to(x.dtype), k.to(x.dtype), v.to(x.dtype).contiguous(), g.contiguous(), beta.to(x.dtype),
                             initial_state=torch.zeros_like(state.kda[s]), output_final_state=True)
        else:
            o, S = kda_chunked(q, k, v, g, beta)
        state.kda[s].copy_(S)
        return self._kda_out(i, o, x)

    def kda_decode(self, i, x, state: DecodeState):
        cfg, s = self.cfg, self.cfg.slot(i)
        H, K = cfg.kda_heads, cfg.kda_head_dim
        qkv = F.linear(x, self.W(i, "qkv_proj"))  # [B, 3d]
        window = torch.cat([state.conv[s], qkv.unsqueeze(-1)], dim=-1)  # [B, 3d, W]
        conv = (window.float() * self.W(i, "conv").float()).sum(-1)  # fp32 accumulate
        state.conv[s].copy_(window[:, :, 1:])
        q, k, v = F.silu(conv).unflatten(-1, (3, H, K)).unbind(1)
        q, k = l2norm(q), l2norm(k)
        g, beta = self._kda_gates(i, x)
        o = self._kda_token_(q, k, v, g, beta, state.kda[s], x.dtype)
        return self._kda_out(i, o, x)

    def _kda_token_(self, q, k, v, g, beta, S, dtype):
        """One recurrence step for [B, H, *] inputs, S [B, H, K, V] fp32 updated in place."""
        B, H, K = q.shape
        if self.kda_backend == "fla":
            _, fused_recurrent_kda_fwd = self._fla_ops()
            # contiguous: fla indexes its inputs as dense [B, T, H, K]; a verify step passes
            # token t of [B, T, ...] tensors, whose batch stride is T times a dense one's
            o, _ = fused_recurrent_kda_fwd(
                q=q.to(dtype).contiguous().view(B, 1, H, K), k=k.to(dtype).contiguous().view(B, 1, H, K),
                v=v.to(dtype).contiguous().view(B, 1, H, K),
                g=g.contiguous().view(B, 1, H, K), beta=beta.to(dtype).contiguous().view(B, 1, H), scale=K ** -0.5,
                initial_state=S, inplace_final_state=True)
            return o.view(B, H, K)
        return kda_step_(q, k, v, g, beta, S, K ** -0.5)

    def kda_verify(self, i, x, state: DecodeState, trail: "VerifyTrail"):
        """T tokens per sequence (x [B, T, hidden]) after the state. The conv window and the
        recurrent state after every token go to ``trail``, so ``commit`` can keep any prefix
        (a rejected draft must leave no trace in the state)."""
        cfg, s = self.cfg, self.cfg.slot(i)
        B, T, _ = x.shape
        H, K, Wc = cfg.kda_heads, cfg.kda_head_dim, cfg.kda_conv
        qkv = F.linear(x, self.W(i, "qkv_proj")).transpose(1, 2)  # [B, 3d, T]
        window = torch.cat([state.conv[s], qkv], dim=-1)  # [B, 3d, W-1+T]: inputs oldest first
        w = self.W(i, "conv").float()
        conv = sum(window[:, :, j:j + T].float() * w[:, j:j + 1] for j in range(Wc))  # fp32 accumulate
        trail.conv.append(window)
        q, k, v = F.silu(conv).transpose(1, 2).unflatten(-1, (3, H, K)).unbind(2)  # [B, T, H, K]
        q, k = l2norm(q), l2norm(k)
        g, beta = self._kda_gates(i, x)
        S = state.kda[s]
        o = q.new_empty(B, T, H, K)
        states = S.new_empty(B, T, *S.shape[1:])
        for t in range(T):  # T <= 8: a step at a time, keeping every intermediate state
            o[:, t] = self._kda_token_(q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], S, x.dtype)
            states[:, t].copy_(S)
        trail.kda.append(states)
        return self._kda_out(i, o, x)

    # -- MLA ----------------------------------------------------------------------------------
    def _mla_q_c(self, i, x):
        cfg = self.cfg
        qa, ca = self._mla_latents(i, x)
        q = F.linear(rmsnorm(qa, self.W(i, "q_a_norm"), cfg.norm_eps), self.W(i, "q_b"))
        c = rmsnorm(ca, self.W(i, "kv_a_norm"), cfg.norm_eps)
        return q.unflatten(-1, (cfg.mla_heads, cfg.qk_nope)), c

    def _mla_out(self, i, o, x):
        gate = torch.sigmoid(F.linear(x, self.W(i, "gate_proj")))
        return self._reduce(F.linear(o.flatten(-2) * gate, self.W(i, "o_proj")))

    def _w_uk_uv(self, i):
        cfg = self.cfg
        wkv = self.W(i, "kv_b").view(cfg.mla_heads, cfg.qk_nope + cfg.v_head, cfg.kv_lora)
        return wkv[:, : cfg.qk_nope], wkv[:, cfg.qk_nope:]  # [H, nope, C], [H, v, C]

    def mla_prefill(self, i, x, lengths, valid, state: DecodeState):
        cfg, s = self.cfg, self.cfg.slot(i)
        q, c = self._mla_q_c(i, x)
        self._cache_prompt(s, c, state)
        kv = F.linear(c, self.W(i, "kv_b")).unflatten(-1, (cfg.mla_heads, cfg.qk_nope + cfg.v_head))
        k, v = kv.split([cfg.qk_nope, cfg.v_head], dim=-1)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           is_causal=True, scale=cfg.qk_nope ** -0.5)
        return self._mla_out(i, o.transpose(1, 2), x)

    def _cache_prompt(self, s, c, state: DecodeState) -> None:
        """Store the prompt latents ``c [B, T, C]`` at positions 0 .. T-1 (context-parallel
        ranks keep only their positions: parallel.py overrides this)."""
        T = c.shape[1]
        if T > state.capacity:
            raise ValueError(f"prompt of {T} tokens exceeds the state capacity {state.capacity}")
        state.latent[s, :, :T].copy_(c)

    def _mla_write(self, s, c, state):
        B = c.shape[0]
        rows = torch.arange(B, device=c.device)
        state.latent[s].index_put_((rows, state.lengths), c)
        pos = torch.arange(state.capacity, device=c.device)
        return pos.view(1, 1, -1) > state.lengths.view(-1, 1, 1)  # [B, 1, cap] masked keys

    def mla_decode(self, i, x, state: DecodeState):
        """Absorbed-weight decode over the latent cache."""
        cfg, s = self.cfg, self.cfg.slot(i)
        q, c = self._mla_q_c(i, x)  # [B, H, nope], [B, C]
        masked = self._mla_write(s, c, state)
        w_uk, w_uv = self._w_uk_uv(i)
        lat = state.latent[s]  # [B, cap, C]
        q_lat = torch.einsum("bhn,hnc->bhc", q, w_uk)
        scores = torch.bmm(q_lat, lat.transpose(1, 2)).float() * cfg.qk_nope ** -0.5
        p = torch.softmax(scores.masked_fill(masked, float("-inf")), dim=-1).to(x.dtype)
        o = torch.einsum("bhc,hvc->bhv", torch.bmm(p, lat), w_uv)
        return self._mla_out(i, o, x)

    def mla_verify(self, i, x, state: DecodeState):
        """Absorbed attention of T tokens per sequence (x [B, T, hidden]): their latents go to
        positions lengths .. lengths+T-1 and each attends causally (itself and what precedes)."""
        cfg, s = self.cfg, self.cfg.slot(i)
        B, T, _ = x.shape
        q, c = self._mla_q_c(i, x)  # [B, T, H, nope], [B, T, C]
        pos = state.lengths.view(B, 1) + torch.arange(T, device=x.device)  # [B, T]
        rows = torch.arange(B, device=x.device).view(B, 1).expand(B, T)
        state.latent[s].index_put_((rows, pos), c)
        masked = torch.arange(state.capacity, device=x.device).view(1, 1, 1, -1) > pos.view(B, T, 1, 1)
        w_uk, w_uv = self._w_uk_uv(i)
        lat = state.latent[s]  # [B, cap, C]
        q_lat = torch.einsum("bthn,hnc->bthc", q, w_uk).flatten(1, 2)  # [B, T*H, C]
        scores = torch.bmm(q_lat, lat.transpose(1, 2)).float().view(B, T, -1, state.capacity)
        p = torch.softmax((scores * cfg.qk_nope ** -0.5).masked_fill(masked, float("-inf")), dim=-1)
        o = torch.bmm(p.to(x.dtype).flatten(1, 2), lat).view(B, T, -1, lat.shape[-1])
        return self._mla_out(i, torch.einsum("bthc,hvc->bthv", o, w_uv), x)

    def mla_decode_reference(self, i, x, state: DecodeState):
        """Non-absorbed decode (k, v materialised from the cached latents); for tests."""
        cfg, s = self.cfg, self.cfg.slot(i)
        q, c = self._mla_q_c(i, x)
        masked = self._mla_write(s, c, state)
        kv = F.linear(state.latent[s], self.W(i, "kv_b")).unflatten(-1, (cfg.mla_heads, -1))
        k, v = kv.split([cfg.qk_nope, cfg.v_head], dim=-1)  # [B, cap, H, *]
        scores = torch.einsum("bhn,bthn->bht", q, k).float() * cfg.qk_nope ** -0.5
        p = torch.softmax(scores.masked_fill(masked, float("-inf")), dim=-1).to(x.dtype)
        return self._mla_out(i, torch.einsum("bht,bthv->bhv", p, v), x)

    # -- MoE ----------------------------------------------------------------------------------
    def route(self, i, x):
        """fp32 sigmoid router: (expert ids [N, k], weights [N, k] fp32)."""
        cfg = self.cfg
        scores = self._gather(torch.sigmoid(F.linear(x.float(), self.W(i, "router"))))
        ids = torch.topk(scores + self.W(i, "router_bias"), cfg.top_k, dim=-1).indices
        w = scores.gather(-1, ids)
        return ids, w / w.sum(-1, keepdim=True) * cfg.routed_scaling

    def experts(self, i, lat, ids, w):
        """Routed experts in the latent width: sum_k w_k * SwiGLU_{ids_k}(lat) -> [N, latent]."""
        w13, w2 = self.W(i, "experts_w13"), self.W(i, "experts_w2")
        N, k = ids.shape
        if self.moe_backend == "grouped":
            flat = ids.flatten()
            order = torch.argsort(flat, stable=True)
            counts = torch.zeros(self.cfg.n_experts, device=lat.device, dtype=torch.int32)
            counts.scatter_add_(0, flat.to(torch.int32), torch.ones_like(flat, dtype=torch.int32))
            offs = torch.cumsum(counts, 0, dtype=torch.int32)
            xs = lat[order // k]
            h = torch._grouped_mm(xs, w13.transpose(-2, -1), offs=offs)
            a, b = h.chunk(2, dim=-1)
            y = torch._grouped_mm(F.silu(a) * b, w2.transpose(-2, -1), offs=offs)
            out = torch.empty_like(y)
            out[order] = y
            return (out.view(N, k, -1).float() * w.unsqueeze(-1)).sum(1).to(lat.dtype)
        out = torch.zeros(N, lat.shape[-1], device=lat.device, dtype=torch.float32)
        for e in torch.unique(ids).tolist():
            rows, slot = (ids == e).nonzero(as_tuple=True)
            y = swiglu(lat[rows], w13[e], w2[e])
            out.index_add_(0, rows, y.float() * w[rows, slot].unsqueeze(-1))
        return out.to(lat.dtype)

    def moe(self, i, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        ids, w = self.route(i, x)
        lat = self._gather(F.linear(x, self.W(i, "moe_down")))
        y = F.linear(self._reduce_scatter(self.experts(i, lat, ids, w)), self.W(i, "moe_up"))
        y = y + swiglu(x, self.W(i, "shared_w13"), self.W(i, "shared_w2"))
        return self._reduce(y).view(shape)  # routed and shared partials in one reduction

    def ffn(self, i, x):
        if self.cfg.ffn_kind(i) == "dense":
            return self._reduce(swiglu(x, self.W(i, "w13"), self.W(i, "w2")))
        return self.moe(i, x)

    # -- whole model ----------------------------------------------------------------------------
    def logits(self, x):
        x = rmsnorm(x, self.w["final_norm"], self.cfg.norm_eps)
        out = self._gather(F.linear(x, self.w["lm_head"]).float())
        out[..., self.cfg.n_real_tokens:] = float("-inf")
        return out

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token embeddings of the prefill (a seam: training looks them up in fp32, lab/train)."""
        return self.w["embed"][tokens]

    @torch.inference_mode()
    def prefill(self, tokens: torch.Tensor, lengths: torch.Tensor, state: DecodeState, *,
                all_logits: bool = False, stats: list | None = None) -> torch.Tensor:
        """Prefill right-padded prompts ``tokens [B, T]`` with ``lengths [B]`` into a fresh
        ``state``. Returns fp32 logits at each prompt's last position [B, vocab] (or at every
        position [B, T, vocab] with ``all_logits``). ``stats``: appended the per-layer RMS of
        the residual stream (fp32 [B, T]) for conditioning measurements."""
        return self.prefill_forward(tokens, lengths, state, all_logits=all_logits, stats=stats)

    def prefill_forward(self, tokens: torch.Tensor, lengths: torch.Tensor, state: DecodeState, *,
                        all_logits: bool = False, stats: list | None = None) -> torch.Tensor:
        """``prefill`` outside inference mode, so autograd can differentiate it (training)."""
        cfg = self.cfg
        tokens = tokens.to(self.device)
        lengths = lengths.to(self.device)
        B, T = tokens.shape
        valid = torch.arange(T, device=self.device).view(1, T) < lengths.view(B, 1)
        x = self.embed(tokens)
        for i in range(cfg.n_layers):
            h = rmsnorm(x, self.W(i, "attn_norm"), cfg.norm_eps)
            if cfg.layer_kind(i) == "kda":
                x = x + self.kda_prefill(i, h, lengths, valid, state)
            else:
                x = x + self.mla_prefill(i, h, lengths, valid, state)
            x = x + self.ffn(i, rmsnorm(x, self.W(i, "ffn_norm"), cfg.norm_eps))
            if stats is not None:
                stats.append(x.float().pow(2).mean(-1).sqrt())
        state.lengths.copy_(lengths)
        state.max_len = int(lengths.max())
        if all_logits:
            return self.logits(x)
        last = x[torch.arange(B, device=self.device), lengths - 1]
        return self.logits(last)

    @torch.inference_mode()
    def decode(self, tokens: torch.Tensor, state: DecodeState, *, absorbed: bool = True) -> torch.Tensor:
        """One decode step: ``tokens [B]`` appended to each sequence of ``state`` (in place).
        Returns fp32 logits [B, vocab]. Graph-capturable (no host synchronisation)."""
        logits = self.decode_tensors(tokens, state, absorbed=absorbed)
        state.max_len += 1
        return logits

    def decode_tensors(self, tokens: torch.Tensor, state: DecodeState, *, absorbed: bool = True) -> torch.Tensor:
        """``decode`` without the host-side bookkeeping (``state.max_len``): tensors in, tensors
        out, what ``torch.compile`` traces for the compiled standard step (runner.py)."""
        cfg = self.cfg
        x = self.w["embed"][tokens]
        for i in range(cfg.n_layers):
            h = rmsnorm(x, self.W(i, "attn_norm"), cfg.norm_eps)
            if cfg.layer_kind(i) == "kda":
                x = x + self.kda_decode(i, h, state)
            elif absorbed:
                x = x + self.mla_decode(i, h, state)
            else:
                x = x + self.mla_decode_reference(i, h, state)
            x = x + self.ffn(i, rmsnorm(x, self.W(i, "ffn_norm"), cfg.norm_eps))
        state.lengths.add_(1)
        return self.logits(x)


    # -- speculative decoding: verify K+1 tokens, then keep each sequence's accepted prefix --------
    @torch.inference_mode()
    def verify(self, tokens: torch.Tensor, state: DecodeState) -> tuple[torch.Tensor, "VerifyTrail"]:
        """A verify step: ``tokens [B, T]`` (the last emitted token, then T-1 draft tokens) run
        after each sequence's state. Returns fp32 logits [B, T, vocab] (row t predicts what
        follows token t) and the trail ``commit`` needs. The KDA states and the latent cache
        hold all T tokens until ``commit``; ``state.lengths`` is not moved. No host sync."""
        return self.verify_tensors(tokens, state)

    def verify_tensors(self, tokens: torch.Tensor, state: DecodeState) -> tuple[torch.Tensor, "VerifyTrail"]:
        """``verify`` without its inference-mode decorator: what ``torch.compile`` traces for the
        compiled standard verify step (runner.py; a decorator inside the traced region fails
        there on the state's inference tensors)."""
        cfg = self.cfg
        trail = VerifyTrail(tokens.shape[1])
        x = self.w["embed"][tokens]
        for i in range(cfg.n_layers):
            h = rmsnorm(x, self.W(i, "attn_norm"), cfg.norm_eps)
            if cfg.layer_kind(i) == "kda":
                x = x + self.kda_verify(i, h, state, trail)
            else:
                x = x + self.mla_verify(i, h, state)
            x = x + self.ffn(i, rmsnorm(x, self.W(i, "ffn_norm"), cfg.norm_eps))  # MoE: B*T tokens
        return self.logits(x), trail

    @torch.inference_mode()
    def commit(self, state: DecodeState, trail: "VerifyTrail", keep: torch.Tensor) -> None:
        """Keep the first ``keep[b]`` (1 ..= T) tokens of the last verify in sequence b: the
        state becomes exactly what plain decoding of those tokens leaves (rejected latents are
        cleared, as plain decoding never wrote them). No host sync."""
        self.commit_tensors(state, trail, keep)

    def commit_tensors(self, state: DecodeState, trail: "VerifyTrail", keep: torch.Tensor) -> None:
        """``commit`` without its inference-mode decorator (see ``verify_tensors``)."""
        cfg, B, T = self.cfg, state.batch, trail.T
        keep = keep.to(state.lengths.device, torch.int64)
        rows = torch.arange(B, device=keep.device)
        for s in range(cfg.n_kda):
            state.kda[s].copy_(trail.kda[s][rows, keep - 1])
            window = trail.conv[s]  # [B, 3d, W-1+T]; after n tokens the last W-1 start at n
            idx = keep.view(B, 1, 1) + torch.arange(cfg.kda_conv - 1, device=keep.device)
            state.conv[s].copy_(window.gather(2, idx.expand(B, window.shape[1], -1)))
        pos = torch.arange(state.capacity, device=keep.device).view(1, -1)
        start = state.lengths.view(B, 1)
        drop = (pos >= start + keep.view(B, 1)) & (pos < start + T)
        state.latent.masked_fill_(drop.view(1, B, -1, 1), 0)
        state.lengths.add_(keep)


class VerifyTrail:
    """What a verify step leaves for ``commit``: per KDA layer (slot order) its conv input
    window [B, 3d, W-1+T] and its recurrent state after each token [B, T, H, K, V] fp32."""

    def __init__(self, T: int):
        self.T = T
        self.conv: list[torch.Tensor] = []
        self.kda: list[torch.Tensor] = []


__all__ = ["K3Model", "DecodeState", "VerifyTrail", "kda_recurrent"]
