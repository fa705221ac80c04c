"""A speculative verify step on the fast kernels: B sequences x T tokens (the last emitted token
and T-1 drafts) run as M = B*T rows.

Everything but the attention is row-wise, so it is the decode step of batch M (the same plan,
buffers, GEMV / MoE / head kernels and tuning buckets, looked up at M). The attention is per
sequence: KDA carries each sequence's state through its T tokens (``kda_verify``), MLA writes
the window's T latents at lengths[b] .. lengths[b]+T-1 and attends causally (``mla_verify``).

Like ``K3Model.verify`` the step leaves ``state.lengths`` as it was, ends the KDA states after
all T tokens and fills a ``VerifyTrail`` (static buffers: conv windows, per-token states) in
the standard path's layout, so ``K3Model.commit`` keeps each row's accepted prefix for both;
``FastTrail.commit`` does the same on the fast kernels.
"""

from __future__ import annotations

from typing import Any

import torch

from ..model import VerifyTrail
from .attention import _in_projection, _kda_gates, _mla_output, _mla_query, _out_projection
from .kernels import norm as NORM
from .packed import PackedLayer, columns
from .step import DecodeStep


class FastTrail(VerifyTrail):
    """The fast verify step's trail: ``VerifyTrail``'s per-layer lists are views of one tensor
    each (``states`` [n_kda, B, T, H, K, V] fp32, ``window`` [n_kda, B, 3d, W-1+T]), so
    ``commit`` keeps every layer's accepted prefix in two launches (kernels/verify_commit.py)."""

    def __init__(self, T: int, states: torch.Tensor, window: torch.Tensor):
        super().__init__(T)
        self.states, self.window = states, window
        self.kda, self.conv = list(states.unbind(0)), list(window.unbind(0))

    def commit(self, state: Any, keep: torch.Tensor) -> None:
        """``K3Model.commit(state, self, keep)``, bit for bit, on the fast kernels."""
        from .kernels.verify_commit import commit

        commit(state.kda, state.conv, state.latent, state.lengths, self.states, self.window,
               keep.to(state.lengths.device, torch.int64))


def new_trail(cfg: Any, B: int, T: int, device, dtype) -> FastTrail:
    """The trail's static buffers: per KDA layer (slot order) its conv input window
    [B, 3d, W-1+T] and its state after each token [B, T, H, K, V] fp32."""
    H, K, Wc = cfg.kda_heads, cfg.kda_head_dim, cfg.kda_conv
    states = torch.empty(cfg.n_kda, B, T, H, K, K, dtype=torch.float32, device=device)
    window = torch.empty(cfg.n_kda, B, 3 * cfg.kda_dim, Wc - 1 + T, dtype=dtype, device=device)
    return FastTrail(T, states, window)


class VerifyStep(DecodeStep):
    """``step(state)`` runs the verify step of the tokens in ``bufs.tokens`` (row b*T + t) and
    returns the logits buffer [B*T, V]; ``trail`` holds what ``commit`` needs."""

    def __init__(self, *args: Any, tokens: int, trail: VerifyTrail, **kw: Any):
        super().__init__(*args, **kw)
        self.T = tokens
        self.B = self.plan.batch // tokens
        self.trail = trail

    def attend(self, i: int, p: PackedLayer, state: Any, x, x_out) -> None:
        (kda if p.kind == "kda" else mla)(self, i, p, state, x, x_out)

    def advance(self, state: Any) -> None:
        pass  # commit moves the lengths by what each row keeps


def kda(s: VerifyStep, i: int, p: PackedLayer, state: Any, x, x_out) -> None:
    """x → x_out = x + KDA(x) over T tokens per sequence; the trail gets the conv window and
    the state after each token."""
    from .kernels.kda_verify import kda_verify

    cfg, bufs, w = s.cfg, s.bufs, p.attn
    proj, c_in = _in_projection(s, i, p, x, "kda_o")
    col = lambda k: columns(proj, w, k)  # noqa: E731
    d = cfg.kda_dim
    f, gate, low_rank = _kda_gates(s, i, p, col)
    conv = state.conv[p.slot]
    o = bufs.o[:, :d]
    kda_verify(col("q"), col("k"), col("v"), f, col("b"), gate,
               conv[:, :d], conv[:, d:2 * d], conv[:, 2 * d:], *w.conv_w,
               w.A_log, w.dt_bias, state.kda[p.slot], w.o_norm,
               tokens=s.T, num_heads=cfg.kda_heads, head_k=cfg.kda_head_dim, head_v=cfg.kda_head_dim,
               states=s.trail.kda[p.slot], window=s.trail.conv[p.slot],
               eps_l2=1e-6, eps_norm=cfg.norm_eps, lower_bound=cfg.kda_lower_bound, out=o,
               low_rank=low_rank)
    _out_projection(s, i, p, o, x, x_out, c_in, "kda_in")


def mla(s: VerifyStep, i: int, p: PackedLayer, state: Any, x, x_out) -> None:
    """x → x_out = x + MLA(x): the T latents of each sequence go to the cache first, then each
    query attends causally (itself and what precedes it)."""
    from .kernels.mla_verify import mla_verify

    cfg, plan, w = s.cfg, s.plan.mla, p.attn
    B, T = s.B, s.T
    H, C = cfg.mla_heads, cfg.kv_lora
    proj, c_in = _in_projection(s, i, p, x, "mla_o")
    col = lambda k: columns(proj, w, k)  # noqa: E731
    q_lat = _mla_query(s, i, p, col)
    cache = state.latent[p.slot]
    NORM.add_rmsnorm(col("kv"), w.kv_a_norm, eps=cfg.norm_eps, out=cache, positions=state.lengths,
                     rows_per_seq=T)
    o_lat = s.bufs.o_lat
    mla_verify(q_lat.view(B, T * H, C), cache, state.lengths, tokens=T, scale=cfg.qk_nope ** -0.5,
               length_offset=1, max_len=cache.shape[1], out=o_lat.view(B, T * H, C),
               block_h=plan.block_h, min_chunk=plan.min_chunk, max_splits=plan.max_splits, waves=plan.waves)
    _mla_output(s, i, p, col, o_lat, x, x_out, c_in)
