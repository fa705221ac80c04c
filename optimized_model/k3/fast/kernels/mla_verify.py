"""Absorbed MLA attention of a verify step: T queries per sequence over the latent cache, causal
inside the draft window, in one split-KV launch (+ the combine of ``mla_decode``).

The window's latents are written first (at positions lengths[b] .. lengths[b]+T-1), then query t
of sequence b attends to positions ``p < lengths[b] + length_offset + t`` (length_offset = 1:
itself and everything before it). The T*H query rows of a sequence (row r = t*H + h) share
every latent tile, so the cache is read once per sequence, not once per token.

Layouts: ``q`` [B, T*H, D] (a [B*T, H, D] buffer viewed per sequence), ``cache`` [B, T_cap, D],
``lengths`` [B], out [B, T*H, D]. Split-KV and combine as ``mla_decode`` (module docstring).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from fastpath import trace

from . import mla_decode as MD
from .entry import KernelSpec, default_dtypes

COMPONENT = "mla_decode"  # a variant of it in the trace ("triton_verify", with T)
VARIANT = "triton_splitkv_verify"


@triton.jit
def mla_verify_split_kernel(
    q, cache, lengths, out, o_part, lse_part,
    sq_b, sq_h, sc_b, sc_t, so_b, so_h,
    scale, split_len, length_offset, NS,
    ROWS: tl.constexpr, QH: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BH: tl.constexpr,
    BT: tl.constexpr, DIRECT: tl.constexpr, IEEE: tl.constexpr, n_tiles: tl.constexpr,
):
    """Grid (B, NS, ceil(ROWS / BH)); ROWS = T * QH query rows per sequence, row r is token
    r // QH. A split covers [start, lengths + length_offset + T - 1); each row masks its own end."""
    b = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    hb = tl.program_id(2)
    n0 = tl.load(lengths + b).to(tl.int32) + length_offset
    start = s * split_len
    end = tl.minimum(start + split_len, n0 + ROWS // QH - 1)

    oh = hb * BH + tl.arange(0, BH)
    mh = oh < ROWS
    row_end = n0 + oh // QH  # causal inside the window
    od = tl.arange(0, BD)
    md = od < D
    qt = tl.load(q + b * sq_b + oh[:, None] * sq_h + od[None, :], mask=mh[:, None] & md[None, :], other=0.0)
    acc, m_i, l_i = MD._head_major_split(qt, cache + b * sc_b, sc_t, od, md, start, end, row_end, scale,
                                         BH, BD, BT, IEEE, n_tiles, True)
    MD._head_major_store(acc, m_i, l_i, out, o_part, lse_part, b, s, NS, oh, mh, od, md, so_b, so_h,
                         ROWS, D, DIRECT)


def mla_verify(q: torch.Tensor, cache: torch.Tensor, lengths: torch.Tensor, *, tokens: int, scale: float,
               length_offset: int = 1, max_len: int | None = None, num_splits: int | None = None,
               block_t: int | None = None, block_h: int = 16, num_warps: int | None = None,
               out: torch.Tensor | None = None, min_chunk: int = MD.MIN_CHUNK,
               max_splits: int = MD.MAX_SPLITS, waves: float = MD.WAVES) -> torch.Tensor:
    """Causal absorbed attention of ``tokens`` = T queries per sequence (module docstring).
    ``max_len`` bounds lengths + length_offset + T - 1 (default: the cache capacity)."""
    B, rows, D = q.shape
    T = int(tokens)
    assert rows % T == 0, (rows, T)
    QH = rows // T
    assert cache.shape[0] == B and cache.shape[2] == D and q.stride(-1) == 1 and cache.stride(-1) == 1
    span = cache.shape[1] if max_len is None else min(int(max_len), cache.shape[1])
    BH = max(16, min(block_h, triton.next_power_of_2(rows)))
    HB = triton.cdiv(rows, BH)
    BD = triton.next_power_of_2(D)
    BT = block_t or (64 if BD < 256 else 32)
    NS, split_len = MD.split_plan(B, HB, span, BT, sm_count=MD._sm_count(q.device), min_chunk=min_chunk,
                                  max_splits=max_splits, waves=waves, num_splits=num_splits)
    if out is None:
        out = torch.empty((B, rows, D), dtype=q.dtype, device=q.device)
    o_part, lse_part = MD.split_partials(out, NS)
    trace.engaged(COMPONENT, VARIANT, batch=B, tokens=T, heads=QH, latent=D, max_len=span, num_splits=NS)
    mla_verify_split_kernel[(B, NS, HB)](
        q, cache, lengths, out, o_part, lse_part,
        q.stride(0), q.stride(1), cache.stride(0), cache.stride(1), out.stride(0), out.stride(1),
        float(scale), int(split_len), int(length_offset), NS,
        ROWS=rows, QH=QH, D=D, BD=BD, BH=BH, BT=BT, DIRECT=NS == 1, IEEE=q.dtype == torch.float32,
        n_tiles=split_len // BT, num_warps=num_warps or (8 if BD >= 256 else 4),
    )
    if NS > 1:  # mla_decode's combine, over the T*H rows, one program per row
        MD.combine_splits(o_part, lse_part, out, NS, BD, 1, {"PDL": False})
    return out


# ----------------------------------------------------------------------------------------------
# references: mla_decode's reference per token t (lengths + t), rows t*H + h

def _reference(q, cache, lengths, tokens, scale, length_offset, max_len, dtype):
    B, rows, D = q.shape
    H = rows // tokens
    outs = [MD._attend(q[:, t * H:(t + 1) * H], cache, lengths, scale, length_offset + t, dtype,
                       None if max_len is None else max_len)
            for t in range(tokens)]
    return torch.cat(outs, 1)


def oracle(q, cache, lengths, *, tokens, scale, length_offset=1, max_len=None, **_):
    return _reference(q, cache, lengths, tokens, scale, length_offset, max_len, torch.float32)


def standard(q, cache, lengths, *, tokens, scale, length_offset=1, max_len=None, **_):
    return _reference(q, cache, lengths, tokens, scale, length_offset, max_len, q.dtype).to(q.dtype)


def fast(q, cache, lengths, *, tokens, scale, length_offset=1, max_len=None, num_splits=None,
         block_h=16, block_t=None, **_):
    return mla_verify(q, cache, lengths, tokens=tokens, scale=scale, length_offset=length_offset,
                      max_len=max_len, num_splits=num_splits, block_h=block_h, block_t=block_t)


def make_inputs(shape: dict, value_class: str = "normal", dtype: Any = torch.float32,
                device: Any = "cpu", seed: int = 0) -> dict:
    """mla_decode's inputs with ``tokens`` = T queries per sequence: lengths = context - T (the
    window's latents are at lengths .. lengths + T - 1, inside the cache); ``masked``: random
    lengths in [0, context - T]."""
    T = int(shape["tokens"])
    base = dict(shape, heads=shape["heads"] * T)
    inp = MD.make_inputs(base, value_class, dtype, device, seed)
    room = shape["context"] - T
    inp["lengths"] = inp["lengths"].clamp(max=room)
    if value_class != "masked":
        inp["lengths"].fill_(room)
    inp.pop("layout", None)
    inp.pop("waves", None)
    inp.pop("max_splits", None)
    inp["tokens"] = T
    return inp


def kernel_entry(device: Any = None) -> KernelSpec:
    """``mla_verify``: T = 4 and 8 queries per sequence (drafts 3 and 7), batch up to 16."""
    on_cuda = str(device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda")
    if on_cuda:
        hd = dict(heads=32, latent=512)
        shapes = [dict(batch=bs, tokens=t, context=1024, **hd) for t in (4, 8) for bs in (1, 2, 4, 8, 16)]
        shapes += [dict(batch=1, tokens=8, context=32832, **hd), dict(batch=3, tokens=4, context=1000, **hd)]
    else:
        hd = dict(heads=2, latent=16, qk_head=16)
        shapes = [dict(batch=bs, tokens=t, context=40, **hd) for t in (4, 8) for bs in (1, 3, 16)]
        shapes += [dict(batch=3, tokens=4, context=77, num_splits=3, **hd),
                   dict(batch=2, tokens=8, context=130, heads=3, latent=24, qk_head=16, num_splits=4)]
    return KernelSpec(name="mla_verify", component=COMPONENT, fast=fast, standard=standard, oracle=oracle,
                      make_inputs=make_inputs, shapes=shapes, value_classes=["normal", "large", "near_zero", "masked"],
                      dtypes=default_dtypes(device), k=2.0, deterministic=True,
                      kernel_patterns=[r"mla_verify_split_kernel", r"mla_decode_combine_kernel"],
                      verify_variants=[VARIANT])
