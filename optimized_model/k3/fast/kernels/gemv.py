"""Decode-shaped matmul ``y = x W^T`` (component ``dense_gemv``; also ``lm_head``, ``shared_expert``,
``norm_residual`` through its prologue/epilogues).

Loop bounds (K) are compile-time constants: Triton 3.6's interpreter cannot iterate over a
runtime range, and on GPU the few distinct K of a model compile once each.

One Triton kernel, specialised at compile time (constexpr) by the tuning table:

* small-M variant (batch 1–4, ``BLOCK_M`` < 16): each program streams a slab of ``BLOCK_N`` rows
  of W with wide vector loads along K; the W tile is multiplied with each row of x in turn
  (2-D products, row loop unrolled: W is loaded once for all rows; no tensor cores: at M ≤ 4
  the step is pure bandwidth);
* tiled variant (batch 4–64): ``tl.dot`` tiles, ``BLOCK_M`` ≥ 16;
* split-K (any variant, ``SPLIT_K`` > 1) when N alone gives too few programs: partial sums go to
  an fp32 workspace and the LAST program of each output tile (atomic ticket) reduces them in a
  fixed order and applies the epilogue — one launch, deterministic (no float atomics).

Fused prologues: RMSNorm of x (``norm_weight``; folded: the K loop accumulates Σ (x·nw)·W and
Σ x² from the x tiles it loads anyway, rstd scales the accumulator at the end — no separate pass
over the row before W streams; split-K carries the partial Σ x² in its workspace), sum over
slots of x (``x`` of shape [M, S, K]: the routed experts' per-slot outputs are reduced here),
SwiGLU of x (``glu_input``: x = [g | u] of width 2K, the prologue forms silu(g)·u with the
standard path's roundings: the shared expert's down projection reading the raw gate|up that a
wider launch wrote, see fast/moe_block.py). Fused epilogues: ``residual`` (y = xWᵀ + r), ``swiglu``
(W = [gate; up] concatenated, y = silu(x Wgᵀ)·(x Wuᵀ), one pass), ``sigmoid_gate``
(y = xWᵀ · sigmoid(g)).

Kernel names start with ``fp_gemv`` (profiler patterns in fast/registry.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl
from .entry import KernelSpec, default_dtypes
from .pdl import pdl_enter

EPILOGUES = {"none": 0, "residual": 1, "swiglu": 2, "sigmoid_gate": 3}


@triton.jit
def fp_gemv_kernel(
    X, W, Y, R, NW, WS, CNT,
    M, N, N_TILES, eps,
    stride_xm, stride_xs, stride_wn, stride_ym, stride_rm,
    stride_xg, stride_wg, stride_yg, stride_rg,
    K: tl.constexpr, K_SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr, XSLOTS: tl.constexpr, NORM: tl.constexpr, XGLU: tl.constexpr,
    EPI: tl.constexpr, USE_DOT: tl.constexpr, PREFETCH: tl.constexpr, ACC2D: tl.constexpr,
    PDL: tl.constexpr,
):
    pid0 = tl.program_id(0)
    pid_s = tl.program_id(1)
    pid_m = tl.program_id(2)
    # groups (per-head weights, e.g. MLA's absorbed W_uk / W_uv): axis 0 = group * N_TILES + n
    grp = pid0 // N_TILES
    pid_n = pid0 % N_TILES
    X += grp * stride_xg
    W += grp * stride_wg
    Y += grp * stride_yg
    R += grp * stride_rg
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_ok = rn < N

    # RMSNorm prologue, folded: y = rstd · Σ_k (x·nw)_k W_k, so the sum of squares is gathered
    # in the main loop from the x tiles it loads anyway (no separate pass over the row before
    # the first W byte moves) and rstd is applied to the accumulator at the end; under split-K
    # the partial sums of squares go through the workspace with the partial products.
    ss = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    if ACC2D:
        # one row of x: products accumulate elementwise over the K tiles and are reduced across
        # threads once after the loop, not once per tile (the loop is then loads and FMAs only)
        accw = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        accw2 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        ssw = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.float32)
    k_lo = pid_s * K_SPLIT
    if PREFETCH:
        # small M: register double buffer of the W tile (Triton does not pipeline loads that do
        # not feed a tl.dot): the next tile is in flight while this one is reduced
        kk0 = k_lo + rk
        wmask0 = n_ok[:, None] & (kk0[None, :] < K)
        w_nx = tl.load(W + rn[:, None] * stride_wn + kk0[None, :], mask=wmask0, other=0.0)
        if EPI == 2:
            w2_nx = tl.load(W + (rn[:, None] + N) * stride_wn + kk0[None, :], mask=wmask0, other=0.0)
    # weights are never written: the first W tile is in flight while the previous kernel ends
    pdl_enter(PDL)
    for k0 in range(0, K_SPLIT, BLOCK_K):
        kk = k_lo + k0 + rk
        k_ok = kk < K
        if PREFETCH:
            w = w_nx
            if EPI == 2:
                w2 = w2_nx
            kn = kk + BLOCK_K
            nmask = n_ok[:, None] & (kn[None, :] < K) & (k0 + BLOCK_K < K_SPLIT)
            w_nx = tl.load(W + rn[:, None] * stride_wn + kn[None, :], mask=nmask, other=0.0)
            if EPI == 2:
                w2_nx = tl.load(W + (rn[:, None] + N) * stride_wn + kn[None, :], mask=nmask, other=0.0)
        else:
            wmask = n_ok[:, None] & k_ok[None, :]
            w = tl.load(W + rn[:, None] * stride_wn + kk[None, :], mask=wmask, other=0.0)
            if EPI == 2:
                w2 = tl.load(W + (rn[:, None] + N) * stride_wn + kk[None, :], mask=wmask, other=0.0)
        xmask = m_ok[:, None] & k_ok[None, :]
        xk = tl.load(X + rm[:, None] * stride_xm + kk[None, :], mask=xmask, other=0.0).to(tl.float32)
        for s in tl.static_range(1, XSLOTS):
            xk += tl.load(X + rm[:, None] * stride_xm + s * stride_xs + kk[None, :],
                          mask=xmask, other=0.0).to(tl.float32)
        if XGLU:
            # x = silu(g) * u, g = x[:, k], u = x[:, K + k]: silu rounded to the working dtype
            # before the product, as torch's F.silu(g) * u in bf16 (the product is rounded below)
            xu = tl.load(X + rm[:, None] * stride_xm + K + kk[None, :], mask=xmask, other=0.0).to(tl.float32)
            sg = (xk / (1.0 + tl.exp(-xk))).to(X.dtype.element_ty).to(tl.float32)
            xk = sg * xu
        if NORM:
            if ACC2D:
                ssw += xk * xk
            else:
                ss += tl.sum(xk * xk, axis=1)
            nw = tl.load(NW + kk, mask=k_ok, other=0.0).to(tl.float32)
            xk = xk * nw[None, :]
        if USE_DOT:
            xd = xk.to(w.dtype)
            acc += tl.dot(xd, tl.trans(w))
            if EPI == 2:
                acc2 += tl.dot(xd, tl.trans(w2))
        else:
            # round x like a matmul in the working dtype would, then reduce in fp32. The W tile
            # is loaded once (2-D) and multiplied with each row of x in turn: no 3-D broadcast,
            # so M = 2 does not load (or hold) W twice.
            xr = xk.to(w.dtype).to(tl.float32)
            wf = w.to(tl.float32)
            if EPI == 2:
                w2f = w2.to(tl.float32)
            if ACC2D:
                x1 = tl.sum(xr, axis=0)
                accw += wf * x1[None, :]
                if EPI == 2:
                    accw2 += w2f * x1[None, :]
            else:
                rl = tl.arange(0, BLOCK_M)
                for mi in tl.static_range(BLOCK_M):
                    if BLOCK_M == 1:
                        xm = tl.sum(xr, axis=0)
                    else:
                        xm = tl.sum(tl.where(rl[:, None] == mi, xr, 0.0), axis=0)
                    acc += tl.where(rl[:, None] == mi, tl.sum(wf * xm[None, :], axis=1)[None, :], 0.0)
                    if EPI == 2:
                        acc2 += tl.where(rl[:, None] == mi, tl.sum(w2f * xm[None, :], axis=1)[None, :], 0.0)
    if ACC2D:
        ss = tl.sum(ssw, axis=1)
        acc = tl.sum(accw, axis=1)[None, :]
        if EPI == 2:
            acc2 = tl.sum(accw2, axis=1)[None, :]

    out_mask = m_ok[:, None] & n_ok[None, :]
    is_last = True
    if SPLIT_K > 1:
        # deterministic split-K: store the partial, take a ticket; the last one reduces in order
        tile = pid_m * N_TILES + pid_n
        wofs = rm[:, None] * N + rn[None, :]
        plane = M * N
        tl.store(WS + pid_s * plane + wofs, acc, mask=out_mask)
        if EPI == 2:
            tl.store(WS + (SPLIT_K + pid_s) * plane + wofs, acc2, mask=out_mask)
        ss_base = WS + (2 * SPLIT_K if EPI == 2 else SPLIT_K) * plane
        if NORM:  # every N tile writes the same partial sums of squares (same bits)
            tl.store(ss_base + pid_s * M + rm, ss, mask=m_ok)
        tl.debug_barrier()
        ticket = tl.atomic_add(CNT + tile, 1, sem="acq_rel")
        is_last = ticket == SPLIT_K - 1
        if is_last:
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            acc2 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for s in range(0, SPLIT_K):
                acc += tl.load(WS + s * plane + wofs, mask=out_mask, other=0.0, cache_modifier=".cg")
                if EPI == 2:
                    acc2 += tl.load(WS + (SPLIT_K + s) * plane + wofs, mask=out_mask, other=0.0,
                                    cache_modifier=".cg")
            if NORM:
                ss = tl.zeros([BLOCK_M], dtype=tl.float32)
                for s in range(0, SPLIT_K):
                    ss += tl.load(ss_base + s * M + rm, mask=m_ok, other=0.0, cache_modifier=".cg")
            tl.atomic_xchg(CNT + tile, 0)  # re-arm for the next launch / graph replay
    if is_last:
        if NORM:
            rstd = 1.0 / tl.sqrt(ss / K + eps)
            acc = acc * rstd[:, None]
            if EPI == 2:
                acc2 = acc2 * rstd[:, None]
        if EPI == 1:
            r = tl.load(R + rm[:, None] * stride_rm + rn[None, :], mask=out_mask, other=0.0)
            acc = acc + r.to(tl.float32)
        elif EPI == 2:
            acc = acc / (1.0 + tl.exp(-acc)) * acc2
        elif EPI == 3:
            g = tl.load(R + rm[:, None] * stride_rm + rn[None, :], mask=out_mask, other=0.0)
            acc = acc / (1.0 + tl.exp(-g.to(tl.float32)))
        tl.store(Y + rm[:, None] * stride_ym + rn[None, :], acc.to(Y.dtype.element_ty), mask=out_mask)


# ------------------------------------------------------------------------------------- host
def _pow2_at_least(v: int) -> int:
    return 1 << max(0, (int(v) - 1).bit_length())


def default_config(M: int, N: int, K: int, device: torch.device | str = "cpu", epilogue: str = "none") -> dict:
    """Tuning-table entry for this shape (see fast/tuning/)."""
    from .. import tuning

    return tuning.lookup("gemv", M, device=device, N=N, K=K, epilogue=epilogue)


class GemvScratch:
    """Preallocated split-K workspace + zeroed tickets for one call site (graph-safe)."""

    def __init__(self, M: int, N: int, split_k: int, swiglu: bool, device):
        planes = split_k * (2 if swiglu else 1)
        # partial products, then the partial sums of squares of the folded RMSNorm (split_k x M)
        self.ws = torch.empty(max(1, planes * M * N + split_k * M), dtype=torch.float32, device=device)
        self.cnt = torch.zeros(4096, dtype=torch.int32, device=device)


def gemv(
    x: torch.Tensor,
    w: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    epilogue: str = "none",
    residual: torch.Tensor | None = None,
    gate: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    config: dict | None = None,
    scratch: GemvScratch | None = None,
    groups: tuple[int, int, int, int, int] | None = None,
    glu_input: bool = False,
) -> torch.Tensor:
    """y[M, N] = prologue(x) @ W^T with an optional fused epilogue.

    x: [M, K] or [M, S, K] (S slots summed in the prologue); K contiguous. ``glu_input``: x is
    [M, 2K] = [g | u] and the prologue forms silu(g)·u (no norm, no slots).
    w: [N, K] (``swiglu``: [2N, K] = [gate; up]). norm_weight: [K] → RMSNorm prologue.
    epilogue: none | residual (needs ``residual`` [M, N]) | swiglu | sigmoid_gate (needs ``gate``).
    groups: (G, stride_xg, stride_wg, stride_yg, stride_rg) — G independent problems, group g
    reading x + g*stride_xg, W + g*stride_wg and writing y + g*stride_yg (element strides; x, w,
    out, residual/gate are then the group-0 views). No split-K with groups.
    """
    epi = EPILOGUES[epilogue]
    slots = 1
    if x.dim() == 3:
        slots = x.shape[1]
        assert x.stride(2) == 1 and norm_weight is None, "slot-sum prologue: no norm, K contiguous"
        stride_xs = x.stride(1)
    else:
        assert x.dim() == 2
        stride_xs = 0
    if x.stride(-1) != 1:
        x = x.contiguous()
    if w.stride(1) != 1:
        w = w.contiguous()
    M, K = x.shape[0], x.shape[-1]
    if glu_input:
        assert slots == 1 and norm_weight is None and groups is None, "SwiGLU prologue: plain [M, 2K] x"
        assert K % 2 == 0, f"SwiGLU prologue: x width {K} is not 2K"
        K //= 2
    N = w.shape[0] // 2 if epi == 2 else w.shape[0]
    assert w.shape[1] == K, f"gemv: x has K={K}, W has {w.shape[1]}"
    G, sxg, swg, syg, srg = groups if groups is not None else (1, 0, 0, 0, 0)
    cfg = dict(config) if config is not None else default_config(M, N, K, x.device, epilogue)
    BM = int(cfg.get("BLOCK_M") or min(_pow2_at_least(M), 64))
    BN, BK = int(cfg["BLOCK_N"]), int(cfg["BLOCK_K"])
    use_dot = BM >= 16
    if use_dot:
        BN, BK = max(BN, 16), max(BK, 16)
    split = max(1, int(cfg.get("SPLIT_K", 1)))
    k_split = triton.cdiv(triton.cdiv(K, split), BK) * BK
    split = triton.cdiv(K, k_split)
    if G > 1:
        split, k_split = 1, triton.cdiv(K, BK) * BK
        assert out is not None, "grouped gemv writes into a given output view"
    if out is None:
        out = torch.empty((M, N), dtype=x.dtype if x.dtype != torch.float32 or w.dtype == torch.float32 else w.dtype,
                          device=x.device)
    assert out.stride(-1) == 1
    aux = residual if epi == 1 else gate if epi == 3 else None
    if epi in (1, 3):
        assert aux is not None and aux.shape[0] == M and aux.shape[-1] >= N and aux.stride(-1) == 1, \
            f"epilogue {epilogue} needs a [{M}, {N}] tensor"
    n_tiles = triton.cdiv(N, BN)
    grid = (G * n_tiles, split, triton.cdiv(M, BM))
    if split > 1:
        if scratch is None:
            scratch = GemvScratch(M, N, split, epi == 2, x.device)
        assert scratch.ws.numel() >= split * (2 if epi == 2 else 1) * M * N + split * M
        assert n_tiles * grid[2] <= scratch.cnt.numel()
        ws, cnt = scratch.ws, scratch.cnt
    else:
        ws = cnt = out  # unused
    fp_gemv_kernel[grid](
        x, w, out, aux if aux is not None else out, norm_weight if norm_weight is not None else w,
        ws, cnt,
        M, N, n_tiles, float(eps),
        x.stride(0), stride_xs, w.stride(0), out.stride(0), aux.stride(0) if aux is not None else 0,
        sxg, swg, syg, srg,
        K=K, K_SPLIT=k_split,
        BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, SPLIT_K=split, XSLOTS=slots,
        NORM=norm_weight is not None, XGLU=glu_input, EPI=epi, USE_DOT=use_dot,
        PREFETCH=bool(int(cfg.get("prefetch", 0))) and not use_dot,
        ACC2D=bool(int(cfg.get("acc2d", 0))) and BM == 1,
        num_warps=int(cfg.get("num_warps", 4)), num_stages=_stages(cfg, BM, BN, BK, slots, epi, x, w, use_dot, glu_input),
        **pdl.launch_args(),
    )
    return out


SMEM_BUDGET = 200 * 1024  # H100/H200: 227 KB per block; keep a margin


def _stages(cfg, BM, BN, BK, slots, epi, x, w, use_dot, glu=False) -> int:
    """Pipeline depth: the table's, lowered until the tl.dot operand buffers fit in shared memory
    (the slot-sum prologue multiplies the x tile by the number of slots)."""
    stages = int(cfg.get("num_stages", 3))
    if not use_dot:
        return stages
    per_stage = BM * BK * x.element_size() * slots * (2 if glu else 1) + BN * BK * w.element_size() * (2 if epi == 2 else 1)
    while stages > 1 and (stages - 1) * per_stage > SMEM_BUDGET:
        stages -= 1
    return stages


def variant_name(M: int, cfg: dict) -> str:
    """Trace variant label: small_m | tiled, with split-K (or "cute" for the CuTe twin)."""
    if cfg.get("variant") == "cute":
        return "cute"
    bm = int(cfg.get("BLOCK_M") or min(_pow2_at_least(M), 64))
    base = "tiled" if bm >= 16 else "small_m"
    sk = int(cfg.get("SPLIT_K", 1))
    return f"triton_{base}" + (f"_splitk{sk}" if sk > 1 else "")


# ---------------------------------------------------------------------------- references
def gemv_reference(x, w, *, epilogue="none", residual=None, gate=None, norm_weight=None, eps=1e-6,
                   dtype=None, glu_input=False):
    """The math in ``dtype`` (default x.dtype) with torch ops: the standard path's way when
    ``dtype`` is the working dtype, the oracle when it is float32."""
    dt = dtype or x.dtype
    xx = x.to(torch.float32)
    if xx.dim() == 3:
        xx = xx.sum(1)
    if norm_weight is not None:
        xx = xx * torch.rsqrt(xx.pow(2).mean(-1, keepdim=True) + eps) * norm_weight.float()
    xx = xx.to(dt)
    if glu_input:  # the standard path's swiglu(): F.silu(a) * b in the working dtype
        a, b = xx.chunk(2, dim=-1)
        xx = torch.nn.functional.silu(a) * b
    ww = w.to(dt)
    if epilogue == "swiglu":
        n = ww.shape[0] // 2
        g, u = (xx @ ww[:n].T), (xx @ ww[n:].T)
        return (torch.nn.functional.silu(g.float()) * u.float()).to(dt)
    y = xx @ ww.T
    if epilogue == "residual":
        y = (y.float() + residual.float()).to(dt)
    elif epilogue == "sigmoid_gate":
        y = (y.float() * torch.sigmoid(gate.float())).to(dt)
    return y


# ------------------------------------------------------------------------------ registry
_VARIANTS = {  # registry entry name -> (epilogue, norm prologue, slots, SwiGLU prologue)
    "gemv": ("none", False, 1, False),
    "gemv_residual": ("residual", False, 1, False),
    "gemv_norm_swiglu": ("swiglu", True, 1, False),
    "gemv_sigmoid_gate": ("sigmoid_gate", False, 1, False),
    "gemv_slots_residual": ("residual", False, 4, False),
    "gemv_glu_residual": ("residual", False, 1, True),
}


def tiling_shapes(device=None) -> list[dict]:
    """Shapes on both sides of every batch bucket edge of the gemv table in use (M = b, b + 1),
    each with more than one N tile and a partial last one, and more than one K step per split
    with a partial last one, at the tiles that bucket chooses."""
    from .. import tuning

    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    shapes = []
    for M in sorted({m for b in tuning.batch_boundaries(dev, "gemv") for m in (b, b + 1)}):
        cfg = tuning.lookup("gemv", M, device=dev)
        bn, bk = int(cfg["BLOCK_N"]), int(cfg["BLOCK_K"])
        N, K = 2 * bn - 7, 2 * bk * max(1, int(cfg.get("max_split", cfg.get("SPLIT_K", 1)))) + 24
        shapes.append({"M": M, "N": N, "K": K})
    return shapes


def _make_entry(name: str, epilogue: str, norm: bool, slots: int, glu: bool, device=None) -> KernelSpec:
    def make_inputs(shape, value_class="normal", dtype=torch.float16, device="cpu", seed=0):
        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        g = torch.Generator(device="cpu").manual_seed(seed)
        M, N, K = shape["M"], shape["N"], shape["K"]
        scale = {"normal": 1.0, "large": 30.0, "near_zero": 1e-3}.get(value_class, 1.0)
        xs = (M, slots, K) if slots > 1 else (M, 2 * K if glu else K)
        x = torch.randn(xs, generator=g) * scale
        rows = 2 * N if epilogue == "swiglu" else N
        w = torch.randn(rows, K, generator=g) / K ** 0.5
        inp = {"x": x.to(dtype).to(device), "w": w.to(dtype).to(device)}
        if epilogue == "residual":
            inp["residual"] = torch.randn(M, N, generator=g).to(dtype).to(device)
        if epilogue == "sigmoid_gate":
            inp["gate"] = (torch.randn(M, N, generator=g) * 2).to(dtype).to(device)
        if norm:
            inp["norm_weight"] = (1 + 0.1 * torch.randn(K, generator=g)).to(dtype).to(device)
        return inp

    def fast(**inp):
        return gemv(epilogue=epilogue, glu_input=glu, **inp)

    def standard(**inp):
        return gemv_reference(epilogue=epilogue, glu_input=glu, **inp)

    def oracle(**inp):
        return gemv_reference(epilogue=epilogue, dtype=torch.float32, glu_input=glu,
                              **{k: v.float() for k, v in inp.items()})

    on_gpu = str(device or "").startswith("cuda") or (device is None and torch.cuda.is_available())
    if on_gpu:
        shapes = [{"M": m, "N": 4096, "K": 4096} for m in (1, 2, 4, 8, 16, 32, 64)]
        shapes += [{"M": 3, "N": 1000, "K": 2048 + 72}, {"M": 64, "N": 512, "K": 4096}]
    else:
        shapes = [{"M": 1, "N": 48, "K": 64}, {"M": 2, "N": 40, "K": 96}, {"M": 5, "N": 33, "K": 80},
                  {"M": 16, "N": 64, "K": 64}]
    return KernelSpec(
        name=name, component="norm_residual" if (norm or epilogue == "residual") and name != "gemv" else "dense_gemv",
        fast=fast, standard=standard, oracle=oracle, make_inputs=make_inputs, shapes=shapes,
        value_classes=["normal", "large", "near_zero"], dtypes=default_dtypes(device),
        kernel_patterns=[r"^fp_gemv_kernel"],
        # the base entry carries the table's edges (the variants share its tiling code)
        boundary_shapes=tiling_shapes(device) if name == "gemv" else [],
    )


def kernel_entry(device=None) -> list[KernelSpec]:
    return [_make_entry(n, *v, device=device) for n, v in _VARIANTS.items()]
