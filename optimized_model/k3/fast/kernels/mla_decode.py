"""Absorbed MLA decode attention over the latent cache, split over the KV length
(flash-decoding), for K3-mini's gated MLA layers (NoPE: the scores use the latent only).

Per sequence b and head h (one new token)::

    s_t   = scale * q[b, h, :] . c[b, t, :]          for t < n_b = lengths[b] + length_offset
    o     = sum_t softmax(s)_t c[b, t, :]            (o = 0 when n_b <= 0)

q is already absorbed into latent space (q_nope @ W_UK per head), o stays in latent space
(the caller applies W_UV and the output gate).

Kernels:

* ``mla_decode_split_kernel``, grid (B, NS, ceil(H / BH)): one program takes a block of BH heads
  (all heads share the latent, so each latent tile [BT, D] is read once per head block) and one
  contiguous range of ``split_len`` positions, runs an online softmax (fp32 max / sum / acc,
  ``tl.dot`` for q·cᵀ and p·c) and stores its normalised partial output and log-sum-exp
  (or, when NS == 1, the final output directly);
* ``mla_decode_split_kvmajor_kernel``, same grid and outputs, with the positions as the MMA's M
  dimension (scoresᵀ = c qᵀ [BT, BH], outᵀ += cᵀ pᵀ [D, BH]): with K3-mini's 32 heads the
  head-major dots have M = 32, too small for Hopper's warpgroup MMA; on the H200 this layout
  reads the latent cache at 2.8 TB/s vs 1.7 (lab/gpu_attn_sweep.py, batch 64 x 32k);
* ``mla_decode_combine_kernel``, grid (B, H, programs per head): merges the NS partials with
  weights exp(lse_s - max lse).

The split count NS (``split_plan``) comes from the batch, the head blocks and the context
bound so that long contexts fill the GPU (``waves`` waves of programs; tuning-table data) while
each split keeps >= ``MIN_CHUNK`` positions, in whole tiles. Empty splits (beyond a sequence's length)
exit with lse = -inf. Under a CUDA graph, ``max_len`` (the context bound the graph was captured
for) fixes NS and the split ranges.

Layouts: ``q`` [B, H, D] (inner dim contiguous), ``cache`` [B, T_cap, D] (latent of one layer,
inner dim contiguous, any batch / position strides), ``lengths`` [B] int32/int64 on the device,
out [B, H, D] in q's dtype. D = kv_lora (512 in K3-mini).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch
import triton
import triton.language as tl

from fastpath import trace

from . import pdl
from .entry import KernelSpec, default_dtypes
from .pdl import pdl_enter

COMPONENT = "mla_decode"
LAYOUTS = {"head_major": "triton_splitkv", "kv_major": "triton_splitkv_kvmajor"}  # -> trace variant
# the split-count policy (split_plan); the tuning table's mla_decode entry may set each
MIN_CHUNK, MAX_SPLITS, WAVES = 128, 128, 4.0


@triton.jit
def _split_bounds(lengths, b, s, split_len, length_offset):
    """Positions [start, end) of split ``s`` of sequence ``b`` (empty when end <= start)."""
    n = tl.load(lengths + b).to(tl.int32) + length_offset
    start = s * split_len
    end = tl.minimum(start + split_len, n)
    return start, end


@triton.jit
def _online_softmax_step(sc, m_i, l_i, AXIS: tl.constexpr):
    """One tile of the online softmax along the positions axis ``AXIS`` of the scores ``sc``
    (-inf where masked): returns p = exp(sc - running max), the factor ``alpha`` that rescales
    the running sums, and the new running max and sum (a row that is all -inf stays at 0)."""
    m_new = tl.maximum(m_i, tl.max(sc, AXIS))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m_i - m_safe)
    if AXIS == 1:
        p = tl.exp(sc - m_safe[:, None])
    else:
        p = tl.exp(sc - m_safe[None, :])
    l_i = l_i * alpha + tl.sum(p, AXIS)
    return p, alpha, m_new, l_i


@triton.jit
def _head_major_split(qt, base, sc_t, od, md, start, end, row_end, scale,
                      BH: tl.constexpr, BD: tl.constexpr, BT: tl.constexpr, IEEE: tl.constexpr,
                      n_tiles: tl.constexpr, CAUSAL: tl.constexpr):
    """The head-major split's online softmax of the query rows ``qt`` [BH, BD] over positions
    [start, end) of the latent rows at ``base``: (acc [BH, BD], running max, running sum), fp32.
    ``CAUSAL`` (a verify step): row r also stops at its own ``row_end[r]``."""
    m_i = tl.full([BH], float("-inf"), tl.float32)
    l_i = tl.zeros([BH], tl.float32)
    acc = tl.zeros([BH, BD], tl.float32)
    # fixed trip count n_tiles (constexpr: one compiled variant per split length; the
    # interpreter cannot take runtime loop bounds); tiles past ``end`` are masked
    # (predicated-off loads move no bytes) and whole splits past the length exit early.
    if start < end:
        for i in range(0, n_tiles):
            ot = start + i * BT + tl.arange(0, BT)
            mt = ot < end
            c = tl.load(base + ot[:, None].to(tl.int64) * sc_t + od[None, :],
                        mask=mt[:, None] & md[None, :], other=0.0)
            if IEEE:
                sc = tl.dot(qt, tl.trans(c), input_precision="ieee")
            else:
                sc = tl.dot(qt, tl.trans(c))
            if CAUSAL:
                sc = tl.where(mt[None, :] & (ot[None, :] < row_end[:, None]), sc * scale, float("-inf"))
            else:
                sc = tl.where(mt[None, :], sc * scale, float("-inf"))
            p, alpha, m_new, l_i = _online_softmax_step(sc, m_i, l_i, 1)
            if IEEE:
                acc = acc * alpha[:, None] + tl.dot(p.to(c.dtype), c, input_precision="ieee")
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(c.dtype), c)
            m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _head_major_store(acc, m_i, l_i, out, o_part, lse_part, b, s, NS, oh, mh, od, md, so_b, so_h,
                      ROWS: tl.constexpr, D: tl.constexpr, DIRECT: tl.constexpr):
    """A head-major split's result: the final output when there is one split (``DIRECT``), else
    its normalised partial and log-sum-exp (o_part [B, NS, ROWS, D] fp32, lse_part [B, NS, ROWS])."""
    has = l_i > 0
    o = acc / tl.where(has, l_i, 1.0)[:, None]
    if DIRECT:
        tl.store(out + b * so_b + oh[:, None] * so_h + od[None, :], o.to(out.dtype.element_ty),
                 mask=mh[:, None] & md[None, :])
    else:
        lse = tl.where(has, m_i + tl.log(tl.where(has, l_i, 1.0)), float("-inf"))
        row = (b * NS + s) * ROWS + oh
        tl.store(lse_part + row, lse, mask=mh)
        tl.store(o_part + row[:, None] * D + od[None, :], o, mask=mh[:, None] & md[None, :])


@triton.jit
def mla_decode_split_kernel(
    q, cache, lengths, out, o_part, lse_part,
    sq_b, sq_h, sc_b, sc_t, so_b, so_h,
    scale, split_len, length_offset, NS,
    H: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BH: tl.constexpr, BT: tl.constexpr,
    DIRECT: tl.constexpr, IEEE: tl.constexpr, n_tiles: tl.constexpr, PDL: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    hb = tl.program_id(2)
    pdl_enter(PDL)  # the cache row of this step was written by the kernel before
    start, end = _split_bounds(lengths, b, s, split_len, length_offset)

    oh = hb * BH + tl.arange(0, BH)
    mh = oh < H
    od = tl.arange(0, BD)
    md = od < D
    qt = tl.load(q + b * sq_b + oh[:, None] * sq_h + od[None, :], mask=mh[:, None] & md[None, :], other=0.0)
    acc, m_i, l_i = _head_major_split(qt, cache + b * sc_b, sc_t, od, md, start, end, end, scale,
                                      BH, BD, BT, IEEE, n_tiles, False)
    _head_major_store(acc, m_i, l_i, out, o_part, lse_part, b, s, NS, oh, mh, od, md, so_b, so_h, H, D, DIRECT)


@triton.jit
def mla_decode_split_kvmajor_kernel(
    q, cache, lengths, out, o_part, lse_part,
    sq_b, sq_h, sc_b, sc_t, so_b, so_h,
    scale, split_len, length_offset, NS,
    H: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BH: tl.constexpr, BT: tl.constexpr,
    DIRECT: tl.constexpr, IEEE: tl.constexpr, n_tiles: tl.constexpr, PDL: tl.constexpr,
):
    """The split kernel with positions as the MMA's M dimension: scores^T = c q^T [BT, BH],
    out^T += c^T p^T [BD, BH]. With 32 heads the head-major dots have M = 32 (too small for
    Hopper's warpgroup MMA); here M = BT (>= 64) and D (512)."""
    b = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    hb = tl.program_id(2)
    pdl_enter(PDL)  # the cache row of this step was written by the kernel before
    start, end = _split_bounds(lengths, b, s, split_len, length_offset)

    oh = hb * BH + tl.arange(0, BH)
    mh = oh < H
    od = tl.arange(0, BD)
    md = od < D
    qT = tl.load(q + b * sq_b + oh[None, :] * sq_h + od[:, None], mask=md[:, None] & mh[None, :], other=0.0)

    m_i = tl.full([BH], float("-inf"), tl.float32)
    l_i = tl.zeros([BH], tl.float32)
    accT = tl.zeros([BD, BH], tl.float32)
    base = cache + b * sc_b
    if start < end:
        for i in range(0, n_tiles):
            ot = start + i * BT + tl.arange(0, BT)
            mt = ot < end
            c = tl.load(base + ot[:, None].to(tl.int64) * sc_t + od[None, :],
                        mask=mt[:, None] & md[None, :], other=0.0)
            if IEEE:
                sc = tl.dot(c, qT, input_precision="ieee")
            else:
                sc = tl.dot(c, qT)
            sc = tl.where(mt[:, None], sc * scale, float("-inf"))
            p, alpha, m_new, l_i = _online_softmax_step(sc, m_i, l_i, 0)
            if IEEE:
                accT = accT * alpha[None, :] + tl.dot(tl.trans(c), p.to(c.dtype), input_precision="ieee")
            else:
                accT = accT * alpha[None, :] + tl.dot(tl.trans(c), p.to(c.dtype))
            m_i = m_new

    has = l_i > 0
    oT = accT / tl.where(has, l_i, 1.0)[None, :]
    if DIRECT:
        tl.store(out + b * so_b + oh[None, :] * so_h + od[:, None], oT.to(out.dtype.element_ty),
                 mask=md[:, None] & mh[None, :])
    else:
        lse = tl.where(has, m_i + tl.log(tl.where(has, l_i, 1.0)), float("-inf"))
        row = (b * NS + s) * H + oh
        tl.store(lse_part + row, lse, mask=mh)
        tl.store(o_part + row[None, :] * D + od[:, None], oT, mask=md[:, None] & mh[None, :])


@triton.jit
def mla_decode_combine_kernel(
    o_part, lse_part, out, so_b, so_h, NS,
    H: tl.constexpr, D: tl.constexpr, BS: tl.constexpr, BDC: tl.constexpr, CHUNKS: tl.constexpr,
    PDL: tl.constexpr,
):
    """Grid (B, H, D / (CHUNKS * BDC)): each program merges CHUNKS chunks of BDC channels
    (the split weights are recomputed by each program; the sum per channel is the same)."""
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    d_base = tl.program_id(2) * (CHUNKS * BDC)
    pdl_enter(PDL)
    os_ = tl.arange(0, BS)
    ms = os_ < NS
    lse = tl.load(lse_part + (b * NS + os_) * H + h, mask=ms, other=float("-inf"))
    mx = tl.max(lse, 0)
    mx = tl.where(mx == float("-inf"), 0.0, mx)
    w = tl.where(lse == float("-inf"), 0.0, tl.exp(lse - mx))
    den = tl.sum(w, 0)
    w = w / tl.where(den > 0, den, 1.0)
    for c in tl.static_range(CHUNKS):
        od = d_base + c * BDC + tl.arange(0, BDC)
        md = od < D
        part = tl.load(o_part + ((b * NS + os_[:, None]) * H + h) * D + od[None, :],
                       mask=ms[:, None] & md[None, :], other=0.0)
        o = tl.sum(part * w[:, None], 0)
        tl.store(out + b * so_b + h * so_h + od, o.to(out.dtype.element_ty), mask=md)


@functools.lru_cache(maxsize=None)
def _sm_count_idx(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return _sm_count_idx(device.index if device.index is not None else torch.cuda.current_device())
    return 132


def choose_splits(batch: int, head_blocks: int, max_len: int, sm_count: int = 132,
                  min_chunk: int = MIN_CHUNK, max_splits: int = MAX_SPLITS, waves: float = WAVES) -> int:
    """Split count asked for: enough programs for ``waves`` waves of SMs, each split >=
    ``min_chunk`` positions, at most ``max_splits``. ``split_plan`` turns it into whole tiles."""
    if max_len <= min_chunk:
        return 1
    want = math.ceil(waves * sm_count / max(batch * head_blocks, 1))
    return int(max(1, min(want, math.ceil(max_len / min_chunk), max_splits)))


def split_plan(batch: int, head_blocks: int, max_len: int, block_t: int, *, sm_count: int = 132,
               min_chunk: int = MIN_CHUNK, max_splits: int = MAX_SPLITS, waves: float = WAVES,
               min_tiles: int = 1, num_splits: int | None = None) -> tuple[int, int]:
    """(split count, positions per split): the ``max_len`` positions cut into splits of whole
    ``block_t`` tiles, as many splits as ``choose_splits`` asks (or ``num_splits``) and no more
    tiles per split than that needs. The tile count per split is not rounded to a power of two:
    with the step's capacities (context + 1 rounded up to 64, e.g. 32 832) that rounding halved
    the splits at batch 1 x 32k (65 programs of 8 tiles on 132 SMs; perf notes run N)."""
    if not waves > 0 or min_chunk < 1 or max_splits < 1:
        raise ValueError(f"mla_decode: waves ({waves!r}) must be > 0 and min_chunk ({min_chunk}) / "
                         f"max_splits ({max_splits}) >= 1 (tuning table entry mla_decode)")
    ns = num_splits or choose_splits(batch, head_blocks, max_len, sm_count, min_chunk=min_chunk,
                                     max_splits=max_splits, waves=waves)
    tiles = max(1, triton.cdiv(max(max_len, 1), block_t))
    per_split = max(min_tiles, triton.cdiv(tiles, ns))
    return triton.cdiv(tiles, per_split), per_split * block_t


def split_partials(out: torch.Tensor, NS: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(o_part [B, NS, ROWS, D] fp32, lse_part [B, NS, ROWS] fp32) of ``out`` [B, ROWS, D]'s
    ``NS`` splits; with one split the split kernel writes ``out`` itself (both are ``out``)."""
    if NS == 1:
        return out, out
    B, rows, D = out.shape
    return (torch.empty((B, NS, rows, D), dtype=torch.float32, device=out.device),
            torch.empty((B, NS, rows), dtype=torch.float32, device=out.device))


def combine_splits(o_part: torch.Tensor, lse_part: torch.Tensor, out: torch.Tensor, NS: int, BD: int,
                   programs_per_head: int, launch: dict) -> None:
    """``mla_decode_combine_kernel`` over ``out``'s [B, ROWS, D] rows: ``programs_per_head``
    programs per row, each over a slice of D; ``launch``: its PDL constexpr and launch options."""
    B, rows, D = out.shape
    BDC = min(BD, 128)
    n_chunks = triton.cdiv(D, BDC)
    per_head = max(1, min(int(programs_per_head), n_chunks))
    if n_chunks % per_head:
        raise ValueError(f"mla_decode: combine_programs_per_head {per_head} must divide the "
                         f"{n_chunks} chunks of {BDC} channels")
    mla_decode_combine_kernel[(B, rows, per_head)](
        o_part, lse_part, out, out.stride(0), out.stride(1), NS,
        H=rows, D=D, BS=max(2, triton.next_power_of_2(NS)), BDC=BDC, CHUNKS=n_chunks // per_head,
        num_warps=4 if NS <= 32 else 8, **launch,
    )


def mla_decode(
    q: torch.Tensor, cache: torch.Tensor, lengths: torch.Tensor, *, scale: float,
    length_offset: int = 0, max_len: int | None = None, num_splits: int | None = None,
    block_t: int | None = None, block_h: int = 16, layout: str = "head_major",
    num_warps: int | None = None, num_stages: int = 2, out: torch.Tensor | None = None,
    min_chunk: int = MIN_CHUNK, max_splits: int = MAX_SPLITS, waves: float = WAVES,
    combine_programs_per_head: int = 1,
) -> torch.Tensor:
    """Absorbed MLA decode attention (layouts in the module docstring).

    Attends to positions ``t < lengths[b] + length_offset`` (K3's DecodeState: the step writes its
    latent at ``lengths[b]`` then attends with ``length_offset=1``). ``max_len`` bounds
    ``lengths + length_offset`` (default: the cache capacity); it and the batch choose the split
    count unless ``num_splits`` is given (``split_plan``: ``waves`` waves of SMs, each split ≥
    ``min_chunk`` positions, at most ``max_splits`` splits). ``layout`` picks the split kernel:
    "head_major" (heads as the MMA's M) or "kv_major" (positions as M;
    ``mla_decode_split_kvmajor_kernel``). The combine runs
    ``combine_programs_per_head`` programs per (sequence, head), each over a slice of D.
    Returns out [B, H, D] (q's dtype).
    """
    if layout not in LAYOUTS:
        raise ValueError(f"mla_decode: unknown layout {layout!r}; choose one of {sorted(LAYOUTS)}")
    B, H, D = q.shape
    assert cache.shape[0] == B and cache.shape[2] == D, (q.shape, cache.shape)
    assert q.stride(-1) == 1 and cache.stride(-1) == 1
    T = cache.shape[1] if max_len is None else min(int(max_len), cache.shape[1])
    BH = max(16, min(block_h, triton.next_power_of_2(H)))
    HB = triton.cdiv(H, BH)
    BD = triton.next_power_of_2(D)
    kv_major = layout == "kv_major"
    BT = block_t or (64 if kv_major or BD < 256 else 32)
    # at least two tiles per kv-major split: with one (a loop of one trip) the kv-major kernel
    # gave wrong outputs on the H200 (Triton 3.6, sm_90; right under the interpreter) — seen in
    # lab/gpu_attn_sweep.py at context 1024 with BT 128 or 16 splits
    NS, split_len = split_plan(B, HB, T, BT, sm_count=_sm_count(q.device), min_chunk=min_chunk,
                               max_splits=max_splits, waves=waves, min_tiles=2 if kv_major else 1,
                               num_splits=num_splits)
    if out is None:
        out = torch.empty((B, H, D), dtype=q.dtype, device=q.device)
    o_part, lse_part = split_partials(out, NS)
    trace.engaged(COMPONENT, LAYOUTS[layout], batch=B, heads=H, latent=D, max_len=T,
                  num_splits=NS, block_t=BT)
    ieee = q.dtype == torch.float32
    split_kernel = mla_decode_split_kvmajor_kernel if kv_major else mla_decode_split_kernel
    split_kernel[(B, NS, HB)](
        q, cache, lengths, out, o_part, lse_part,
        q.stride(0), q.stride(1), cache.stride(0), cache.stride(1), out.stride(0), out.stride(1),
        float(scale), int(split_len), int(length_offset), NS,
        H=H, D=D, BD=BD, BH=BH, BT=BT, DIRECT=NS == 1, IEEE=ieee, n_tiles=split_len // BT,
        num_warps=num_warps or (8 if BD >= 256 else 4), num_stages=num_stages,
        **pdl.launch_args(),
    )
    if NS > 1:
        combine_splits(o_part, lse_part, out, NS, BD, combine_programs_per_head, pdl.launch_args())
    return out


# ----------------------------------------------------------------------------------------------
# references

def _attend(q, cache, lengths, scale, length_offset, dtype, max_len=None):
    """Masked softmax attention over the first ``max_len`` cached positions (default: the
    longest sequence, which needs a host sync; pass ``max_len`` for CUDA-graph capture)."""
    B, H, D = q.shape
    n = (lengths.long() + length_offset).clamp(min=0)
    if max_len is None:
        max_len = int(n.max().item()) if B else 0
    T = int(min(cache.shape[1], max_len))
    c = cache[:, :T].to(dtype)
    qq = q.to(dtype)
    if T == 0:
        return torch.zeros(B, H, D, dtype=dtype, device=q.device)
    s = torch.matmul(qq, c.transpose(1, 2)).float() * scale  # [B, H, T]
    valid = torch.arange(T, device=q.device)[None, :] < n[:, None]  # [B, T]
    s = s.masked_fill(~valid[:, None, :], float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)  # rows with n == 0 -> 0
    return torch.matmul(p.to(dtype), c)


def oracle(q, cache, lengths, *, scale, length_offset=0, max_len=None, **_):
    """fp32 torch reference: masked softmax attention in latent space, out [B, H, D] fp32."""
    return _attend(q, cache, lengths, scale, length_offset, torch.float32, max_len)


def standard(q, cache, lengths, *, scale, length_offset=0, max_len=None, **_):
    """The standard path's way: torch matmuls in the working dtype, fp32 softmax."""
    return _attend(q, cache, lengths, scale, length_offset, q.dtype, max_len).to(q.dtype)


def fast(q, cache, lengths, *, scale, length_offset=0, max_len=None, num_splits=None, block_h=16,
         layout="head_major", block_t=None, waves=WAVES, max_splits=MAX_SPLITS, **_):
    return mla_decode(q, cache, lengths, scale=scale, length_offset=length_offset,
                      max_len=max_len, num_splits=num_splits, block_h=block_h, layout=layout,
                      block_t=block_t, waves=waves, max_splits=max_splits)


def make_inputs(shape: dict, value_class: str = "normal", dtype: Any = torch.float32,
                device: Any = "cpu", seed: int = 0) -> dict:
    """shape: {"batch", "heads", "latent" (kv_lora), "context" (cache length / max_len),
    "num_splits", "block_h", "layout", "block_t", "waves", "max_splits" (optional: the wrapper's
    arguments), "qk_head" (for the scale, default 128)}. value classes: normal (unit-RMS
    latents, full lengths), large (x16 q: peaked softmax), near_zero (1e-3 scale), masked
    (random per-sequence lengths in [0, context], incl. 0 and 1)."""
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    device = torch.device(device)
    g = torch.Generator(device=device).manual_seed(seed)  # on the device: 32k contexts are large
    B, H, D, T = shape["batch"], shape["heads"], shape["latent"], shape["context"]
    amp_q = {"normal": 1.0, "large": 16.0, "near_zero": 1e-3, "masked": 1.0}[value_class]
    amp_c = 1e-3 if value_class == "near_zero" else 1.0
    q = (torch.randn(B, H, D, generator=g, device=device) * amp_q).to(dtype)
    cache = torch.empty(B, T, D, dtype=dtype, device=device)
    for b in range(B):  # per sequence: bounds the fp32 temporary
        cache[b] = torch.randn(T, D, generator=g, device=device) * amp_c
    if value_class == "masked":
        lengths = torch.randint(0, T + 1, (B,), generator=g, device=device).cpu()
        lengths[0] = T
        if B > 1:
            lengths[1] = 1
        if B > 2:
            lengths[2] = 0
    else:
        lengths = torch.full((B,), T)
    out = dict(q=q, cache=cache, lengths=lengths.to(torch.int32).to(device),
               scale=shape.get("qk_head", 128) ** -0.5, max_len=T)
    if shape.get("num_splits"):
        out["num_splits"] = shape["num_splits"]
    for key in ("block_h", "layout", "block_t", "waves", "max_splits"):
        if shape.get(key):
            out[key] = shape[key]
    return out


def kernel_entry(device: Any = None) -> KernelSpec:
    on_cuda = str(device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda")
    if on_cuda:
        hd = dict(heads=32, latent=512)
        kv = dict(hd, layout="kv_major", block_h=32, block_t=64)  # as the H200 table runs it
        shapes = [dict(batch=bs, context=1024, **kv) for bs in (1, 2, 4, 8, 16, 32, 64)]
        # batch 1 at the step's 32k capacity with the table's one wave (129 splits of 4 tiles);
        # batch 2 with 3 tiles per split (a trip count that is not a power of two)
        shapes += [dict(batch=1, context=32832, waves=1, max_splits=256, **kv),
                   dict(batch=4, context=8192, **kv), dict(batch=2, context=20000, **kv),
                   dict(batch=3, context=1000, **kv), dict(batch=64, context=8192, **kv),
                   dict(batch=5, context=4099, heads=20, latent=512, layout="kv_major", block_t=64),
                   # the one-tile-per-split case the wrapper avoids (16 splits of 64 asked)
                   dict(batch=2, context=1024, num_splits=16, **kv),
                   dict(batch=2, context=40, **kv),
                   # the head-major kernel (16 and 32 heads per program)
                   dict(batch=2, context=1024, **hd), dict(batch=8, context=8192, block_h=32, **hd)]
    else:  # Triton interpreter: small latent / contexts
        hd = dict(heads=2, latent=16, qk_head=16)
        shapes = [dict(batch=bs, context=40, **hd) for bs in (1, 2, 4, 8, 16, 32, 64)]
        shapes += [dict(batch=3, context=77, num_splits=3, **hd),
                   dict(batch=5, context=130, heads=3, latent=24, qk_head=16, num_splits=4),
                   dict(batch=2, context=300, **hd),
                   dict(batch=3, context=77, num_splits=2, layout="kv_major", block_t=16, **hd),
                   dict(batch=4, context=300, layout="kv_major", block_t=16, **hd),
                   # one wave as the batch-1 table asks: 3 splits of 7 tiles
                   dict(batch=1, context=300, layout="kv_major", block_t=16, waves=1, max_splits=256, **hd)]
    return KernelSpec(
        name="mla_decode", component=COMPONENT, fast=fast, standard=standard, oracle=oracle,
        make_inputs=make_inputs, shapes=shapes,
        value_classes=["normal", "large", "near_zero", "masked"], dtypes=default_dtypes(device),
        k=2.0, deterministic=True,
        kernel_patterns=[r"mla_decode_split_kernel", r"mla_decode_combine_kernel"],
    )
