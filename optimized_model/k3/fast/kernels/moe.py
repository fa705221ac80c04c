"""Latent MoE kernels of the fast path (components ``moe_router`` and ``moe_experts``).

Over 500 lines on purpose: the four kernels, their launchers, their references and their
kernels-suite entries share one (token, slot) pair layout, and one file keeps them in step.

* ``fp_moe_router_kernel`` — grid (expert blocks, token blocks): each program computes the fp32
  router logits of BLOCK_M tokens x BLOCK_E experts (RMSNorm of x in the prologue — the ffn norm,
  in wide chunks — the normed x rounded to the working dtype like the standard path, fp32 weight), stores them to a workspace and
  takes its token block's atomic ticket; the LAST program of each token block applies sigmoid,
  + correction bias (selection only), top-k by repeated argmax (ties: lowest id), weights =
  selected sigmoid scores normalised over the k and scaled by ``routed_scaling``, for the
  block's tokens, writes ids int32 [M, k] and weights fp32 [M, k]; with ``align`` the last token
  block to finish groups the pairs by expert (below). One launch, deterministic.
* ``fp_moe_experts_align_kernel`` (one program per expert) or the router's last program — the
  (token, slot) pairs grouped by expert, on device, no host sync: per expert (increasing id) its
  pairs in increasing pair order, cut into blocks of BLOCK_M rows; per block its expert (-1 =
  unused) and its rows. (One program grouping 512 pairs took 44–53 µs inside the batch-64 step.)
* ``fp_moe_experts_up_kernel`` / ``fp_moe_experts_down_kernel`` — grid (expert block, N tile):
  the selected experts' weights are streamed once each, by many programs (an expert with more
  pairs than BLOCK_M has several blocks: only then are its weights read again, mostly from L2).
  BLOCK_M ≥ 16: ``tl.dot`` tiles; below: the small-M form (the W tile is loaded once and
  multiplied with each row in turn — no 3-D broadcast, no duplicated W loads).
  up:   h[pair] = silu(lat[tok] Wg[e]ᵀ) · (lat[tok] Wu[e]ᵀ)          (W13[e] = [gate; up])
  down: o[pair] = round(h[pair] W2[e]ᵀ) · weight[pair]   (fp32 [M, k, latent])
  The sum over the k slots happens in the prologue of the latent up-projection gemv
  (kernels/gemv.py, x of shape [M, k, latent]) — deterministic, no atomics; or, for a few
  tokens (``slot_sum``, table data), in the down kernel: the last program of each N tile
  (atomic ticket) adds the slots in the same order and writes the row in the working dtype.

Loop bounds are compile-time constants (Triton 3.6's interpreter cannot range over runtime
values); the row loop of the small-M form is unrolled (BLOCK_M is a constexpr).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _counters, pdl
from .entry import KernelSpec, default_dtypes
from .pdl import pdl_enter


@triton.jit
def _moe_align(IDS, SORTED, BEXP, BROWS, P, E: tl.constexpr, BLOCK_P: tl.constexpr,
               BLOCK_E: tl.constexpr, BLOCK_M: tl.constexpr, MAX_BLOCKS: tl.constexpr,
               BLOCK_B: tl.constexpr):
    """Group the (token, slot) pairs by expert: SORTED[blk * BLOCK_M + j] = j-th pair of block
    blk (pairs of one expert in increasing pair order, each expert's run padded to BLOCK_M),
    BEXP[blk] = the block's expert (-1: unused block), BROWS[blk] = its valid rows."""
    rp = tl.arange(0, BLOCK_P)
    p_ok = rp < P
    ids = tl.load(IDS + rp, mask=p_ok, other=-1, cache_modifier=".cg")  # written by other programs
    re = tl.arange(0, BLOCK_E)
    match = ids[None, :] == re[:, None]                      # [E, P]
    mi = match.to(tl.int32)
    cnt = tl.sum(mi, axis=1)                                 # pairs per expert
    nblk = (cnt + BLOCK_M - 1) // BLOCK_M
    off = tl.cumsum(nblk, axis=0) - nblk                     # first block of each expert
    pos = tl.cumsum(mi, axis=1) - 1                          # rank of the pair within its expert
    rank = tl.sum(tl.where(match, pos, 0), axis=0)
    poff = tl.sum(tl.where(match, off[:, None], 0), axis=0)
    tl.store(SORTED + poff * BLOCK_M + rank, rp, mask=p_ok & (ids >= 0) & (ids < E))
    rb = tl.arange(0, BLOCK_B)
    inb = (rb[:, None] >= off[None, :]) & (rb[:, None] < (off + nblk)[None, :])   # [B, E]
    eb = tl.sum(tl.where(inb, re[None, :], 0), axis=1)
    nhit = tl.sum(inb.to(tl.int32), axis=1)
    left = cnt[None, :] - (rb[:, None] - off[None, :]) * BLOCK_M
    rows = tl.sum(tl.where(inb, tl.minimum(left, BLOCK_M), 0), axis=1)
    b_ok = rb < MAX_BLOCKS
    tl.store(BEXP + rb, tl.where(nhit > 0, eb, -1), mask=b_ok)
    tl.store(BROWS + rb, rows, mask=b_ok)


@triton.jit
def fp_moe_experts_align_kernel(IDS, SORTED, BEXP, BROWS, P, E: tl.constexpr, BLOCK_P: tl.constexpr,
                                BLOCK_E: tl.constexpr, BLOCK_M: tl.constexpr,
                                MAX_BLOCKS: tl.constexpr, BLOCK_B: tl.constexpr, PDL: tl.constexpr):
    """The grouping of ``_moe_align`` (same output), one program per expert: each counts the
    pairs of every expert (a compare-and-sum, no scan over [E, P]), takes its first block from
    the exclusive prefix of the block counts and places its own pairs (a scan over P) and
    blocks. The last program marks the unused blocks. No program waits for another."""
    e = tl.program_id(0)
    pdl_enter(PDL)
    rp = tl.arange(0, BLOCK_P)
    p_ok = rp < P
    ids = tl.load(IDS + rp, mask=p_ok, other=-1)
    re = tl.arange(0, BLOCK_E)
    cnt = tl.sum((ids[None, :] == re[:, None]).to(tl.int32), axis=1)     # pairs per expert
    nblk = (cnt + BLOCK_M - 1) // BLOCK_M
    first = tl.cumsum(nblk, axis=0) - nblk                                # first block per expert
    me = re == e
    off = tl.sum(tl.where(me, first, 0))
    n_e = tl.sum(tl.where(me, nblk, 0))
    c_e = tl.sum(tl.where(me, cnt, 0))
    mine = (ids == e) & p_ok
    rank = tl.cumsum(mine.to(tl.int32), axis=0) - 1                       # in pair order
    tl.store(SORTED + off * BLOCK_M + rank, rp, mask=mine)
    rb = tl.arange(0, BLOCK_B)
    b_mine = rb < n_e
    tl.store(BEXP + off + rb, tl.zeros([BLOCK_B], dtype=tl.int32) + e, mask=b_mine)
    tl.store(BROWS + off + rb, tl.minimum(c_e - rb * BLOCK_M, BLOCK_M), mask=b_mine)
    if e == E - 1:
        unused = (rb >= off + n_e) & (rb < MAX_BLOCKS)
        tl.store(BEXP + rb, tl.full([BLOCK_B], -1, dtype=tl.int32), mask=unused)
        tl.store(BROWS + rb, tl.zeros([BLOCK_B], dtype=tl.int32), mask=unused)


@triton.jit
def fp_moe_router_kernel(X, NW, RW, RB, LG, CNT, IDS, WOUT, SORTED, BEXP, BROWS,
                         M, eps, scaling, stride_xm,
                         D: tl.constexpr, E: tl.constexpr, TOPK: tl.constexpr,
                         BLOCK_ME: tl.constexpr, BLOCK_RE: tl.constexpr, BLOCK_K: tl.constexpr,
                         BLOCK_E: tl.constexpr, NORM: tl.constexpr,
                         NORM_BK: tl.constexpr, ALIGN: tl.constexpr, BLOCK_P: tl.constexpr, ALIGN_M: tl.constexpr,
                         MAX_BLOCKS: tl.constexpr, BLOCK_B: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    # phase 1 (every program): fp32 logits of BLOCK_ME tokens x BLOCK_RE experts
    pid_e = tl.program_id(0)
    pid_m = tl.program_id(1)
    rm = pid_m * BLOCK_ME + tl.arange(0, BLOCK_ME)
    re = pid_e * BLOCK_RE + tl.arange(0, BLOCK_RE)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    e_ok = re < E
    if NORM:
        # statistics first (exactly the standard path's rounding of the normed x below: the
        # top-k selection must not flip on a different rounding); wide chunks, few round trips
        rkn = tl.arange(0, NORM_BK)
        ss = tl.zeros([BLOCK_ME], dtype=tl.float32)
        for k0 in range(0, D, NORM_BK):
            kk = k0 + rkn
            xn = tl.load(X + rm[:, None] * stride_xm + kk[None, :],
                         mask=m_ok[:, None] & (kk[None, :] < D), other=0.0).to(tl.float32)
            ss += tl.sum(xn * xn, axis=1)
        rstd = 1.0 / tl.sqrt(ss / D + eps)
    acc = tl.zeros([BLOCK_ME, BLOCK_RE], dtype=tl.float32)
    for k0 in range(0, D, BLOCK_K):
        kk = k0 + rk
        k_ok = kk < D
        w = tl.load(RW + re[:, None] * D + kk[None, :], mask=e_ok[:, None] & k_ok[None, :], other=0.0)
        w = w.to(tl.float32)
        xk = tl.load(X + rm[:, None] * stride_xm + kk[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        if NORM:
            nw = tl.load(NW + kk, mask=k_ok, other=0.0).to(tl.float32)
            # the normed x, rounded to the working dtype (the standard path's router input)
            xk = (xk.to(tl.float32) * rstd[:, None] * nw[None, :]).to(X.dtype.element_ty)
        acc += tl.sum(xk.to(tl.float32)[:, None, :] * w[None, :, :], axis=2)
    tl.store(LG + rm[:, None] * E + re[None, :], acc, mask=m_ok[:, None] & e_ok[None, :])
    # phase 2, per token block (the last of its expert programs to finish, atomic ticket):
    # sigmoid, bias, top-k of this block's tokens — parallel over token blocks, so a batch of 64
    # does not wait for one program to rank all 64 tokens
    tl.debug_barrier()
    ticket = tl.atomic_add(CNT + pid_m, 1, sem="acq_rel")
    if ticket == tl.num_programs(0) - 1:
        ea = tl.arange(0, BLOCK_E)
        ea_ok = ea < E
        lg = tl.load(LG + rm[:, None] * E + ea[None, :], mask=m_ok[:, None] & ea_ok[None, :], other=0.0,
                     cache_modifier=".cg")
        score = 1.0 / (1.0 + tl.exp(-lg))
        sel = score + tl.load(RB + ea, mask=ea_ok, other=0.0).to(tl.float32)[None, :]
        sel = tl.where(ea_ok[None, :], sel, float("-inf"))
        rt = tl.arange(0, TOPK)
        ids = tl.zeros([BLOCK_ME, TOPK], dtype=tl.int32)
        ws = tl.zeros([BLOCK_ME, TOPK], dtype=tl.float32)
        for j in tl.static_range(TOPK):
            best = tl.max(sel, axis=1)
            hit = sel == best[:, None]
            idx = tl.min(tl.where(hit, ea[None, :], BLOCK_E), axis=1)  # lowest id among ties
            one = ea[None, :] == idx[:, None]
            sc = tl.sum(tl.where(one, score, 0.0), axis=1)
            ids = tl.where(rt[None, :] == j, idx[:, None], ids)
            ws = tl.where(rt[None, :] == j, sc[:, None], ws)
            sel = tl.where(one, float("-inf"), sel)
        ws = ws / tl.sum(ws, axis=1)[:, None] * scaling
        o_mask = m_ok[:, None] & (rt[None, :] < TOPK)
        tl.store(IDS + rm[:, None] * TOPK + rt[None, :], ids, mask=o_mask)
        tl.store(WOUT + rm[:, None] * TOPK + rt[None, :], ws, mask=o_mask)
        tl.atomic_xchg(CNT + pid_m, 0)  # re-arm for the next launch / graph replay
        if ALIGN:
            # phase 3: the last token block to finish groups all pairs by expert
            tl.debug_barrier()
            n_m = tl.num_programs(1)
            done = tl.atomic_add(CNT + n_m, 1, sem="acq_rel")
            if done == n_m - 1:
                _moe_align(IDS, SORTED, BEXP, BROWS, M * TOPK, E, BLOCK_P, BLOCK_E, ALIGN_M,
                           MAX_BLOCKS, BLOCK_B)
                tl.atomic_xchg(CNT + n_m, 0)


@triton.jit
def fp_moe_experts_up_kernel(LAT, SORTED, BEXP, BROWS, W13, H, stride_lm, stride_we, stride_wn, stride_hp,
                             L: tl.constexpr, I: tl.constexpr, TOPK: tl.constexpr,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                             USE_DOT: tl.constexpr, PDL: tl.constexpr):
    blk = tl.program_id(0)
    pid_n = tl.program_id(1)
    pdl_enter(PDL)
    e = tl.load(BEXP + blk)
    if e < 0:
        return
    if True:
        rows = tl.load(BROWS + blk)
        rm = tl.arange(0, BLOCK_M)
        m_ok = rm < rows
        pair = tl.load(SORTED + blk * BLOCK_M + rm, mask=m_ok, other=0)
        tok = pair // TOPK
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = rn < I
        rk = tl.arange(0, BLOCK_K)
        wbase = W13 + e.to(tl.int64) * stride_we
        acc_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, L, BLOCK_K):
            kk = k0 + rk
            k_ok = kk < L
            wm = n_ok[:, None] & k_ok[None, :]
            wg = tl.load(wbase + rn[:, None] * stride_wn + kk[None, :], mask=wm, other=0.0)
            wu = tl.load(wbase + (rn[:, None] + I) * stride_wn + kk[None, :], mask=wm, other=0.0)
            if USE_DOT:
                x = tl.load(LAT + tok[:, None] * stride_lm + kk[None, :],
                            mask=m_ok[:, None] & k_ok[None, :], other=0.0)
                acc_g += tl.dot(x.to(wg.dtype), tl.trans(wg))
                acc_u += tl.dot(x.to(wg.dtype), tl.trans(wu))
            else:
                # small M: the W tile is loaded once and reused for each row (2-D products only)
                wgf = wg.to(tl.float32)
                wuf = wu.to(tl.float32)
                for m in tl.static_range(BLOCK_M):
                    t_m = tl.load(SORTED + blk * BLOCK_M + m, mask=m < rows, other=0) // TOPK
                    xm = tl.load(LAT + t_m * stride_lm + kk, mask=k_ok & (m < rows), other=0.0).to(tl.float32)
                    pg = tl.sum(wgf * xm[None, :], axis=1)
                    pu = tl.sum(wuf * xm[None, :], axis=1)
                    acc_g += tl.where(rm[:, None] == m, pg[None, :], 0.0)
                    acc_u += tl.where(rm[:, None] == m, pu[None, :], 0.0)
        # round the projections like the standard path's matmul output, then SwiGLU
        g = acc_g.to(H.dtype.element_ty).to(tl.float32)
        u = acc_u.to(H.dtype.element_ty).to(tl.float32)
        h = g / (1.0 + tl.exp(-g)) * u
        tl.store(H + pair[:, None] * stride_hp + rn[None, :], h.to(H.dtype.element_ty),
                 mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def fp_moe_experts_down_kernel(Hb, SORTED, BEXP, BROWS, RWT, W2, O, LS, CNT,
                               stride_hp, stride_we, stride_wn, stride_op, stride_ls,
                               L: tl.constexpr, I: tl.constexpr,
                               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                               USE_DOT: tl.constexpr, SUM_TOKENS: tl.constexpr, TOPK: tl.constexpr,
                               PDL: tl.constexpr):
    blk = tl.program_id(0)
    pid_n = tl.program_id(1)
    pdl_enter(PDL)
    e = tl.load(BEXP + blk)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < L
    if e >= 0:
        rows = tl.load(BROWS + blk)
        rm = tl.arange(0, BLOCK_M)
        m_ok = rm < rows
        pair = tl.load(SORTED + blk * BLOCK_M + rm, mask=m_ok, other=0)
        rk = tl.arange(0, BLOCK_K)
        wbase = W2 + e.to(tl.int64) * stride_we
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, I, BLOCK_K):
            kk = k0 + rk
            k_ok = kk < I
            w = tl.load(wbase + rn[:, None] * stride_wn + kk[None, :],
                        mask=n_ok[:, None] & k_ok[None, :], other=0.0)
            if USE_DOT:
                x = tl.load(Hb + pair[:, None] * stride_hp + kk[None, :],
                            mask=m_ok[:, None] & k_ok[None, :], other=0.0)
                acc += tl.dot(x.to(w.dtype), tl.trans(w))
            else:
                wf = w.to(tl.float32)
                for m in tl.static_range(BLOCK_M):
                    p_m = tl.load(SORTED + blk * BLOCK_M + m, mask=m < rows, other=0)
                    xm = tl.load(Hb + p_m * stride_hp + kk, mask=k_ok & (m < rows), other=0.0).to(tl.float32)
                    acc += tl.where(rm[:, None] == m, tl.sum(wf * xm[None, :], axis=1)[None, :], 0.0)
        rw = tl.load(RWT + pair, mask=m_ok, other=0.0)
        y = acc.to(Hb.dtype.element_ty).to(tl.float32) * rw[:, None]
        tl.store(O + pair[:, None] * stride_op + rn[None, :], y.to(O.dtype.element_ty),
                 mask=m_ok[:, None] & n_ok[None, :])
    if SUM_TOKENS > 0:
        # the sum over the k slots, here instead of in the latent up-projection's prologue (where
        # each of its programs re-read all k fp32 slots of the whole row): the last program of
        # this N tile (atomic ticket; unused blocks take one too) adds the slots of each token in
        # slot order, as that prologue did, and writes the row in the working dtype
        tl.debug_barrier()
        ticket = tl.atomic_add(CNT + pid_n, 1, sem="acq_rel")
        if ticket == tl.num_programs(0) - 1:
            for t in tl.static_range(SUM_TOKENS):
                acc_t = tl.load(O + t * TOPK * stride_op + rn, mask=n_ok, other=0.0, cache_modifier=".cg")
                for j in tl.static_range(1, TOPK):
                    acc_t += tl.load(O + (t * TOPK + j) * stride_op + rn, mask=n_ok, other=0.0,
                                     cache_modifier=".cg")
                tl.store(LS + t * stride_ls + rn, acc_t.to(LS.dtype.element_ty), mask=n_ok)
            tl.atomic_xchg(CNT + pid_n, 0)  # re-arm for the next launch / graph replay


# ------------------------------------------------------------------------------------- host
def _p2(v: int) -> int:
    return 1 << max(0, (int(v) - 1).bit_length())


def _cfg(kernel: str, M: int, device, config: dict | None) -> dict:
    if config is not None:
        return dict(config)
    from .. import tuning

    return tuning.lookup(kernel, M, device=device)


def experts_block_m(M: int, cfg: dict) -> int:
    """Rows per expert block (``BLOCK_M``; ``BLOCK_T`` is the older name): ≥ 16 selects the
    tl.dot tiles (kept at 16+ even for a smaller batch), below 16 the small-M form (≤ the
    batch's power of two)."""
    bm = _p2(int(cfg.get("BLOCK_M", cfg.get("BLOCK_T", 16))))
    return bm if bm >= 16 else max(1, min(bm, _p2(M)))


class MoeAlign:
    """Static buffers of the by-expert grouping of the M*k (token, slot) pairs (graph-safe):
    ``sorted`` pair ids per block, ``bexp`` the block's expert (-1 unused), ``brows`` its rows."""

    def __init__(self, M: int, k: int, E: int, block_m: int, device):
        P = M * k
        self.M, self.k, self.E, self.block_m = M, k, E, block_m
        self.max_blocks = max(1, (P + min(E, P) * (block_m - 1)) // block_m)
        self.sorted = torch.zeros(self.max_blocks * block_m, dtype=torch.int32, device=device)
        self.bexp = torch.full((self.max_blocks,), -1, dtype=torch.int32, device=device)
        self.brows = torch.zeros(self.max_blocks, dtype=torch.int32, device=device)

    def consts(self) -> dict:
        P = self.M * self.k
        return dict(BLOCK_P=max(2, _p2(P)), BLOCK_E=max(2, _p2(self.E)), MAX_BLOCKS=self.max_blocks,
                    BLOCK_B=max(2, _p2(self.max_blocks)))


class RouterScratch:
    """fp32 logits workspace + zeroed tickets: one per token block (its top-k epilogue) and one
    for the grouping by expert (the last token block)."""

    def __init__(self, M: int, E: int, device):
        self.logits = torch.empty(max(1, M * E), dtype=torch.float32, device=device)
        self.cnt = torch.zeros(M + 1, dtype=torch.int32, device=device)


def moe_router(x, router_w, router_bias, top_k: int, *, routed_scaling: float = 1.0,
               norm_weight=None, eps: float = 1e-6, ids=None, weights=None, config=None,
               scratch: RouterScratch | None = None, align: MoeAlign | None = None):
    """Fused router. x [M, D] (working dtype; normalised here when ``norm_weight`` is given),
    router_w fp32 [E, D], router_bias fp32 [E]. Returns (ids int32 [M, k], weights fp32 [M, k]).
    Grid over (expert blocks, token blocks): the fp32 logits are a parallel gemv; the last
    program of each token block (atomic ticket) applies sigmoid, bias, top-k, normalisation and
    scaling for its tokens; given ``align``, the last token block groups the pairs by expert for
    ``moe_experts``."""
    M, D = x.shape
    E = router_w.shape[0]
    cfg = _cfg("moe_router", M, x.device, config)
    if ids is None:
        ids = torch.empty((M, top_k), dtype=torch.int32, device=x.device)
    if weights is None:
        weights = torch.empty((M, top_k), dtype=torch.float32, device=x.device)
    assert _p2(top_k) == top_k, "top_k must be a power of two"
    if scratch is None:
        scratch = RouterScratch(M, E, x.device)
    BRE = int(cfg.get("BLOCK_E", 2))
    BME = max(1, min(int(cfg.get("BLOCK_M", 8)), _p2(M)))
    grid = (triton.cdiv(E, BRE), triton.cdiv(M, BME))
    if align is not None:
        assert align.M == M and align.k == top_k and align.E == E
        ac = align.consts()
        a_bufs = (align.sorted, align.bexp, align.brows)
    else:
        ac = dict(BLOCK_P=2, BLOCK_E=max(2, _p2(E)), MAX_BLOCKS=1, BLOCK_B=2)
        a_bufs = (ids, ids, ids)
    fp_moe_router_kernel[grid](
        x, norm_weight if norm_weight is not None else x, router_w, router_bias,
        scratch.logits, scratch.cnt, ids, weights, *a_bufs,
        M, float(eps), float(routed_scaling), x.stride(0),
        D=D, E=E, TOPK=top_k, BLOCK_ME=BME, BLOCK_RE=BRE, BLOCK_K=int(cfg.get("BLOCK_K", 64)),
        BLOCK_E=ac["BLOCK_E"], NORM=norm_weight is not None,
        NORM_BK=min(_p2(D), max(int(cfg.get("BLOCK_K", 64)), 16384 // BME)),
        ALIGN=align is not None, BLOCK_P=ac["BLOCK_P"], ALIGN_M=align.block_m if align is not None else 1,
        MAX_BLOCKS=ac["MAX_BLOCKS"], BLOCK_B=ac["BLOCK_B"],
        num_warps=int(cfg.get("num_warps", 4)), **pdl.launch_args(),
    )
    return ids, weights


def moe_align(ids, E: int, block_m: int, align: MoeAlign | None = None) -> MoeAlign:
    """Group the pairs of ``ids`` [M, k] by expert (one launch, one program per expert)."""
    M, k = ids.shape
    if align is None:
        align = MoeAlign(M, k, E, block_m, ids.device)
    c = align.consts()
    fp_moe_experts_align_kernel[(E,)](ids, align.sorted, align.bexp, align.brows, M * k, E=E,
                                      BLOCK_M=align.block_m, num_warps=4, **c,
                                      **pdl.launch_args())
    return align


# tokens up to which the down kernel can sum the slots itself (its last program per N tile
# walks every token's k slots: cheap at batch 1, a long serial tail at batch 64)
MAX_SLOT_SUM_TOKENS = 4
def _tickets(device, n: int) -> torch.Tensor:
    """The down kernel's zeroed per-N-tile tickets (the kernel re-arms them)."""
    return _counters.zeroed("moe_experts_down", device, n)


def moe_experts(lat, ids, weights, w13, w2, *, h_buf=None, out=None, config=None,
                align: MoeAlign | None = None, slot_sum=None):
    """Grouped routed experts. lat [M, L] (working dtype), ids int32 [M, k], weights fp32 [M, k],
    w13 [E, 2I, L], w2 [E, L, I]. Returns o fp32 [M, k, L] (weighted per-slot outputs; sum
    over k is the MoE output in latent width). ``align``: the grouping already made by the
    router (else one align launch here). ``slot_sum`` [M, L] (working dtype; M ≤
    ``MAX_SLOT_SUM_TOKENS``): the down kernel also writes the sum over the k slots there."""
    M, L = lat.shape
    k = ids.shape[1]
    E, I2, L2 = w13.shape
    I = I2 // 2
    assert L2 == L and w2.shape == (E, L, I)
    assert w13.stride(2) == 1 and w2.stride(2) == 1 and lat.stride(1) == 1
    ids = ids.contiguous()
    weights = weights.contiguous()
    cfg = _cfg("moe_experts", M, lat.device, config)
    P = M * k
    BM = experts_block_m(M, cfg)
    use_dot = BM >= 16
    BN, BK = int(cfg["BLOCK_N"]), int(cfg["BLOCK_K"])
    BN_D, BK_D = int(cfg.get("BLOCK_N_DOWN", BN)), int(cfg.get("BLOCK_K_DOWN", BK))
    if use_dot:
        BN, BK, BN_D, BK_D = max(BN, 16), max(BK, 16), max(BN_D, 16), max(BK_D, 16)
    if align is None:
        align = moe_align(ids, E, BM)
    assert align.block_m == BM and align.M == M and align.k == k
    if h_buf is None:
        h_buf = torch.empty((P, I), dtype=lat.dtype, device=lat.device)
    if out is None:
        out = torch.empty((M, k, L), dtype=torch.float32, device=lat.device)
    nw, ns = int(cfg.get("num_warps", 4)), int(cfg.get("num_stages", 3))
    fp_moe_experts_up_kernel[(align.max_blocks, triton.cdiv(I, BN))](
        lat, align.sorted, align.bexp, align.brows, w13, h_buf,
        lat.stride(0), w13.stride(0), w13.stride(1), h_buf.stride(0),
        L=L, I=I, TOPK=k, BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, USE_DOT=use_dot,
        num_warps=nw, num_stages=ns, **pdl.launch_args(),
    )
    o2 = out.view(P, L)
    n_tiles = triton.cdiv(L, BN_D)
    if slot_sum is not None:
        if M > MAX_SLOT_SUM_TOKENS:
            raise ValueError(f"moe_experts: slot_sum at {M} tokens; the down kernel sums the slots "
                             f"for at most {MAX_SLOT_SUM_TOKENS} (the latent up's prologue does beyond)")
        assert slot_sum.shape == (M, L) and slot_sum.stride(1) == 1, slot_sum.shape
    fp_moe_experts_down_kernel[(align.max_blocks, n_tiles)](
        h_buf, align.sorted, align.bexp, align.brows, weights, w2, o2,
        slot_sum if slot_sum is not None else o2, _tickets(lat.device, n_tiles),
        h_buf.stride(0), w2.stride(0), w2.stride(1), o2.stride(0),
        slot_sum.stride(0) if slot_sum is not None else 0,
        L=L, I=I, BLOCK_M=BM, BLOCK_N=BN_D, BLOCK_K=BK_D, USE_DOT=use_dot,
        SUM_TOKENS=M if slot_sum is not None else 0, TOPK=k,
        num_warps=int(cfg.get("num_warps_down", nw)), num_stages=ns, **pdl.launch_args(),
    )
    return out


def variant_name(M: int, cfg: dict) -> str:
    return "triton_sorted_" + ("dot" if experts_block_m(M, cfg) >= 16 else "small_m")


# ---------------------------------------------------------------------------- references
def align_reference(ids, E: int, block_m: int) -> list[tuple[int, list[int]]]:
    """The grouping ``moe_align`` must produce, as (expert, pair ids) per used block: experts
    in increasing id, each one's pairs in increasing order, in blocks of ``block_m``."""
    flat = ids.flatten().tolist()
    blocks = []
    for e in range(E):
        pairs = [p for p, x in enumerate(flat) if x == e]
        blocks += [(e, pairs[s:s + block_m]) for s in range(0, len(pairs), block_m)]
    return blocks


def align_blocks(align: MoeAlign) -> list[tuple[int, list[int]]]:
    """(expert, pair ids) of every used block of ``align`` (to compare with ``align_reference``)."""
    bexp, brows, srt, bm = align.bexp.tolist(), align.brows.tolist(), align.sorted.tolist(), align.block_m
    return [(bexp[b], srt[b * bm: b * bm + brows[b]]) for b in range(align.max_blocks) if bexp[b] >= 0]


def router_reference(x, router_w, router_bias, top_k, *, routed_scaling=1.0, norm_weight=None,
                     eps=1e-6, dtype=None):
    """The standard path's routing (fp32 router on the normed x in ``dtype``)."""
    dt = dtype or x.dtype
    xx = x.to(dt)
    if norm_weight is not None:
        xf = xx.float()
        xx = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * norm_weight.float()).to(dt)
    scores = torch.sigmoid(xx.float() @ router_w.float().T)
    ids = torch.topk(scores + router_bias.float(), top_k, dim=-1).indices
    w = scores.gather(-1, ids)
    return ids.to(torch.int32), w / w.sum(-1, keepdim=True) * routed_scaling


def experts_reference(lat, ids, weights, w13, w2, *, dtype=None):
    """Per-slot weighted expert outputs fp32 [M, k, L] (loop over experts, torch ops in dtype)."""
    dt = dtype or lat.dtype
    M, k = ids.shape
    L = lat.shape[1]
    I = w13.shape[1] // 2
    out = torch.zeros(M, k, L, dtype=torch.float32, device=lat.device)
    x = lat.to(dt)
    for e in torch.unique(ids).tolist():
        rows, slot = (ids == e).nonzero(as_tuple=True)
        h = x[rows] @ w13[e].to(dt).T
        a, b = h[:, :I], h[:, I:]
        hh = (torch.nn.functional.silu(a.float()) * b.float()).to(dt)
        y = (hh @ w2[e].to(dt).T).float()
        out[rows, slot] = y * weights[rows, slot].float().unsqueeze(-1)
    return out


# ------------------------------------------------------------------------------ registry
def _on_gpu(device) -> bool:
    return str(device or "").startswith("cuda") or (device is None and torch.cuda.is_available())


def _router_entry(device=None) -> KernelSpec:
    def make_inputs(shape, value_class="normal", dtype=torch.float16, device="cpu", seed=0):
        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        g = torch.Generator(device="cpu").manual_seed(seed)
        M, D, E, k = shape["M"], shape["D"], shape["E"], shape["k"]
        x = torch.randn(M, D, generator=g)
        rw = torch.randn(E, D, generator=g) / D ** 0.5
        rb = torch.randn(E, generator=g) * 0.1
        if value_class == "ties":  # many equal scores: the selection must still be consistent
            rw = rw[: max(1, E // 4)].repeat(4, 1)[:E].clone()
            rb = torch.zeros(E)
        elif value_class == "large":
            x = x * 50
        return {"x": x.to(dtype).to(device), "router_w": rw.float().to(device),
                "router_bias": rb.float().to(device),
                "norm_weight": (1 + 0.1 * torch.randn(D, generator=g)).to(dtype).to(device),
                "top_k": k, "routed_scaling": 2.5}

    def fast(**i):
        ids, w = moe_router(**i)
        return _canon(ids, w, i["router_w"].shape[0])

    def standard(**i):
        ids, w = router_reference(**i)
        return _canon(ids, w, i["router_w"].shape[0])

    def oracle(**i):
        j = {k: (v.float() if torch.is_tensor(v) else v) for k, v in i.items()}
        ids, w = router_reference(**j)
        return _canon(ids, w, i["router_w"].shape[0])

    shapes = ([{"M": m, "D": 4096, "E": 64, "k": 8} for m in (1, 2, 4, 8, 16, 32, 64)] + [{"M": 3, "D": 1000, "E": 48, "k": 4}]
              if _on_gpu(device) else [{"M": 1, "D": 64, "E": 8, "k": 2}, {"M": 5, "D": 96, "E": 12, "k": 4}])
    return KernelSpec(name="moe_router", component="moe_router", fast=fast, standard=standard, oracle=oracle,
                      make_inputs=make_inputs, shapes=shapes, value_classes=["normal", "large"],
                      dtypes=default_dtypes(device), kernel_patterns=[r"^fp_moe_router"])


def _canon(ids, w, E):
    """Routing as a dense [M, E] weight matrix (order of the k slots is irrelevant)."""
    dense = torch.zeros(ids.shape[0], E, dtype=torch.float32, device=ids.device)
    dense.scatter_(1, ids.long(), w.float())
    return dense


def _experts_entry(device=None) -> KernelSpec:
    def make_inputs(shape, value_class="normal", dtype=torch.float16, device="cpu", seed=0):
        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        # generated on the target device: 64 experts' weights are 0.8 G values, seconds on a CPU
        dev = torch.device(device)
        g = torch.Generator(device=dev).manual_seed(seed)
        M, L, I, E, k = shape["M"], shape["L"], shape["I"], shape["E"], shape["k"]
        scale = {"normal": 1.0, "large": 8.0, "near_zero": 1e-3}.get(value_class, 1.0)
        lat = torch.randn(M, L, generator=g, device=dev) * scale
        ids = torch.stack([torch.randperm(E, generator=g, device=dev)[:k] for _ in range(M)]).to(torch.int32)
        w = torch.rand(M, k, generator=g, device=dev) + 0.1
        return {"lat": lat.to(dtype), "ids": ids, "weights": w.float(),
                "w13": (torch.randn(E, 2 * I, L, generator=g, device=dev) / L ** 0.5).to(dtype),
                "w2": (torch.randn(E, L, I, generator=g, device=dev) / I ** 0.5).to(dtype)}

    # slot_sum: the sum over the slots written by the down kernel (the batch-1 step's way)
    shapes = ([{"M": m, "L": 2048, "I": 1024, "E": 64, "k": 8} for m in (1, 2, 4, 8, 16, 32, 64)]
              + [{"M": 3, "L": 1000, "I": 520, "E": 16, "k": 4},
                 {"M": 1, "L": 2048, "I": 1024, "E": 64, "k": 8, "slot_sum": True},
                 {"M": 3, "L": 1000, "I": 520, "E": 16, "k": 4, "slot_sum": True}]
              if _on_gpu(device) else
              [{"M": 1, "L": 32, "I": 32, "E": 8, "k": 2}, {"M": 5, "L": 48, "I": 40, "E": 6, "k": 2},
               {"M": 20, "L": 32, "I": 16, "E": 4, "k": 2},
               {"M": 1, "L": 32, "I": 32, "E": 8, "k": 2, "slot_sum": True},
               {"M": 3, "L": 48, "I": 40, "E": 6, "k": 2, "slot_sum": True}])
    def fast(slot_sum=False, **i):
        if not slot_sum:
            return moe_experts(**i).sum(1)
        out = torch.empty_like(i["lat"])  # the down kernel's sum over the slots, working dtype
        moe_experts(**i, slot_sum=out)
        return out

    def standard(slot_sum=False, **i):  # the standard path rounds the slot sum to the working dtype
        y = experts_reference(**i).sum(1)
        return y.to(i["lat"].dtype) if slot_sum else y

    def oracle(slot_sum=False, **i):
        return experts_reference(**{k: (v.float() if v.is_floating_point() else v) for k, v in i.items()}).sum(1)

    def make(shape, *a, **kw):
        inp = make_inputs(shape, *a, **kw)
        if shape.get("slot_sum"):
            inp["slot_sum"] = True
        return inp

    return KernelSpec(
        name="moe_experts", component="moe_experts", fast=fast, standard=standard, oracle=oracle,
        make_inputs=make, shapes=shapes, value_classes=["normal", "large", "near_zero"],
        dtypes=default_dtypes(device), kernel_patterns=[r"^fp_moe_experts"],
        # fp32: the fp32 accumulation order differs from torch's (outputs up to O(100) for
        # "large"), the standard path on CPU IS the oracle (error 0), so the floor decides
        atol_floor={"float32": 1e-4, "float16": 1e-3, "bfloat16": 8e-3},
    )


def kernel_entry(device=None) -> list[KernelSpec]:
    return [_router_entry(device), _experts_entry(device)]
