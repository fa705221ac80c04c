"""L2 prefetch of an upcoming weight (sm_90 ``cp.async.bulk.prefetch.L2``; component
``dense_gemv``).

Parts of the batch-1 step are latency-bound while the HBM sits mostly idle: the KDA layer's
low-rank gate projection and recurrent update, MLA's chain from q_b to the attention combine.
Launched beside them on its own stream, this kernel asks the L2 for the weight of the
projection that follows (the attention's o_proj), which then streams from L2 instead of HBM.
It moves no extra bytes (the weight is read from HBM once either way), writes nothing and cannot
change a result; where it runs and how much of each weight it asks for is tuning-table data
("l2_prefetch"; measured: perf notes, run M).

Each lane of a program issues one bulk prefetch of ``CHUNK`` bytes; the program ends at once
(the L2 fills in the background). No registry entry: it has no output to hold against an
oracle — the parity suite and the bit-identity of the table A/B's first step check that it
changes nothing. CUDA only: the interpreter cannot run inline PTX (the runtime never launches
it on CPU; tests compile it for sm_90 instead). Kernel name: ``fp_l2_prefetch``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# bulk copies and prefetches move 16-byte units from 16-byte aligned addresses
_ALIGN = 16


@triton.jit
def fp_l2_prefetch_kernel(BASE, n_bytes, CHUNK: tl.constexpr, PER_PROGRAM: tl.constexpr):
    lane = tl.program_id(0) * PER_PROGRAM + tl.arange(0, PER_PROGRAM)
    off = lane.to(tl.int64) * CHUNK
    size = tl.maximum(tl.minimum(n_bytes - off, CHUNK), 0).to(tl.int32)
    # a lane past the end has size 0 and issues nothing; the dummy result keeps nothing alive
    # (is_pure=False: the op has side effects, so it is not removed as dead code)
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.gt.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.b32 $0, 0; }",
        "=r,l,r", [BASE + off, size], dtype=tl.int32, is_pure=False, pack=1)


def prefetch_bytes(w: torch.Tensor, fraction: float) -> int:
    """How many leading bytes of ``w`` a prefetch of ``fraction`` asks for (16-byte units)."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"l2_prefetch: fraction {fraction!r} of a weight; expected 0..1")
    return int(w.numel() * w.element_size() * fraction) // _ALIGN * _ALIGN


def l2_prefetch(w: torch.Tensor, fraction: float = 1.0, *, chunk: int = 16384, per_program: int = 32) -> int:
    """Ask the L2 for the first ``fraction`` of ``w``'s bytes (CUDA, contiguous ``w``); returns
    the number of bytes asked for."""
    if not w.is_cuda:
        raise RuntimeError("l2_prefetch runs on CUDA only (inline PTX; no interpreter path)")
    if not w.is_contiguous():
        raise ValueError("l2_prefetch: the weight must be contiguous (one byte range)")
    if chunk % _ALIGN or chunk <= 0 or per_program & (per_program - 1):
        raise ValueError(f"l2_prefetch: chunk {chunk} must be a positive multiple of {_ALIGN} and "
                         f"per_program {per_program} a power of two")
    n = prefetch_bytes(w, fraction)
    if n == 0:
        return 0
    lanes = triton.cdiv(n, chunk)
    fp_l2_prefetch_kernel[(triton.cdiv(lanes, per_program),)](
        w.view(-1).view(torch.uint8), n, CHUNK=chunk, PER_PROGRAM=per_program,
        num_warps=max(1, per_program // 32))
    return n
