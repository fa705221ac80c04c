"""Fused residual add + RMSNorm (component ``norm_residual``).

``h = x + residual`` (written back when ``residual_out`` is given) and ``y = rmsnorm(h) * w``
in one pass: one program per row, the row held in registers. In the decode step most norms are
fused further into the next gemv's prologue (kernels/gemv.py, ``norm_weight=``); this kernel
serves the places where the normalised row itself is needed. Kernel name: ``fp_add_rmsnorm``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl
from .entry import KernelSpec, default_dtypes
from .pdl import pdl_enter


@triton.jit
def fp_add_rmsnorm_kernel(X, R, W, Y, H, POS, eps, stride_x, stride_r, stride_y, stride_h, stride_pos,
                          N: tl.constexpr, BLOCK: tl.constexpr, HAS_R: tl.constexpr,
                          WRITE_H: tl.constexpr, HAS_POS: tl.constexpr, PDL: tl.constexpr,
                          TQ: tl.constexpr = 1):
    row = tl.program_id(0)
    pdl_enter(PDL)
    if HAS_POS:  # write row b at position pos[b] of a cache [B, T, N] (MLA latent cache)
        if TQ == 1:
            Y += tl.load(POS + row).to(tl.int64) * stride_pos
        else:  # a verify step: row b*TQ + t goes to sequence b, position pos[b] + t
            seq = row // TQ
            Y += (seq - row) * stride_y + (tl.load(POS + seq).to(tl.int64) + row % TQ) * stride_pos
    cols = tl.arange(0, BLOCK)
    ok = cols < N
    h = tl.load(X + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    if HAS_R:
        h += tl.load(R + row * stride_r + cols, mask=ok, other=0.0).to(tl.float32)
    if WRITE_H:
        tl.store(H + row * stride_h + cols, h.to(H.dtype.element_ty), mask=ok)
        h = h.to(H.dtype.element_ty).to(tl.float32)  # normalise the rounded sum, like torch
    rstd = 1.0 / tl.sqrt(tl.sum(h * h, axis=0) / N + eps)
    w = tl.load(W + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(Y + row * stride_y + cols, (h * rstd * w).to(Y.dtype.element_ty), mask=ok)


def add_rmsnorm(x, weight, residual=None, *, eps=1e-6, out=None, residual_out=None, positions=None,
                rows_per_seq=1):
    """Returns y (and writes ``residual_out`` = x + residual when given). x: [M, N].
    ``positions`` (int [M], device): ``out`` is a cache [M, T, N] and row b goes to
    ``out[b, positions[b]]`` (the MLA latent write of a decode step). ``rows_per_seq`` = T > 1
    (a verify step): x has B*T rows, ``positions`` [B], row b*T + t goes to
    ``out[b, positions[b] + t]``."""
    M, N = x.shape
    if positions is not None:
        assert out is not None and out.dim() == 3 and out.stride(2) == 1
    if out is None:
        out = torch.empty_like(x)
    BLOCK = triton.next_power_of_2(N)
    fp_add_rmsnorm_kernel[(M,)](
        x, residual if residual is not None else x, weight, out,
        residual_out if residual_out is not None else out,
        positions if positions is not None else x, float(eps),
        x.stride(0), residual.stride(0) if residual is not None else 0, out.stride(0),
        residual_out.stride(0) if residual_out is not None else 0,
        out.stride(1) if positions is not None else 0,
        N=N, BLOCK=BLOCK, HAS_R=residual is not None, WRITE_H=residual_out is not None,
        HAS_POS=positions is not None, TQ=int(rows_per_seq),
        num_warps=4 if BLOCK <= 4096 else 8, **pdl.launch_args(),
    )
    return out


def add_rmsnorm_reference(x, weight, residual=None, *, eps=1e-6, dtype=None):
    dt = dtype or x.dtype
    h = x.to(dt) if residual is None else (x.to(dt) + residual.to(dt))
    hf = h.float()
    return (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(dt)


def kernel_entry(device=None) -> KernelSpec:
    def make_inputs(shape, value_class="normal", dtype=torch.float16, device="cpu", seed=0):
        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        g = torch.Generator(device="cpu").manual_seed(seed)
        M, N = shape["M"], shape["N"]
        scale = {"normal": 1.0, "large": 100.0, "near_zero": 1e-4}.get(value_class, 1.0)
        return {
            "x": (torch.randn(M, N, generator=g) * scale).to(dtype).to(device),
            "residual": (torch.randn(M, N, generator=g) * scale).to(dtype).to(device),
            "weight": (1 + 0.1 * torch.randn(N, generator=g)).to(dtype).to(device),
        }

    on_gpu = str(device or "").startswith("cuda") or (device is None and torch.cuda.is_available())
    shapes = ([{"M": m, "N": 4096} for m in (1, 2, 4, 8, 16, 32, 64)] + [{"M": 3, "N": 1000}]
              if on_gpu else [{"M": 1, "N": 64}, {"M": 3, "N": 100}, {"M": 8, "N": 64}])
    return KernelSpec(
        name="add_rmsnorm", component="norm_residual",
        fast=lambda **i: add_rmsnorm(i["x"], i["weight"], i["residual"]),
        standard=lambda **i: add_rmsnorm_reference(i["x"], i["weight"], i["residual"]),
        oracle=lambda **i: add_rmsnorm_reference(i["x"].float(), i["weight"].float(), i["residual"].float()),
        make_inputs=make_inputs, shapes=shapes, value_classes=["normal", "large", "near_zero"],
        dtypes=default_dtypes(device), kernel_patterns=[r"^fp_add_rmsnorm"],
    )
