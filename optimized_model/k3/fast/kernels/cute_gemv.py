"""Small-M dense GEMV ``y = prologue(x) @ W^T (+ r)`` in CuTe DSL (nvidia-cutlass-dsl 4.8.1) — the
hottest decode op at small batch (every projection is one). Variant "cute" of component
``dense_gemv``; the Triton twin lives in ``gemv.py`` and the tuning table picks, per call site
(``gemv`` bucket or override ``"variant": "cute"``), whichever measured faster in the step.

Kernel (``cute_gemv_kernel``): W [N, K] row-major bf16/fp16, x [M, K] (M = 1..MAX_M), y [M, N].
W and x are viewed as 16-byte vectors (``zipped_divide`` by (1, VEC), VEC = 128 / element bits),
so every load is one 128-bit ``ld.global``. A CTA of WARPS warps owns a slab of
WARPS * ROWS_PER_WARP consecutive rows; each warp owns ROWS_PER_WARP rows; lane ``l`` reads the
vectors ``l, l + 32, l + 64, ...`` of each of its rows (coalesced: a warp reads 512 contiguous
bytes per row per step), multiplies them with the matching x vectors in fp32, and the fp32 partial
sums are reduced across the warp with butterfly shuffles; lane 0 writes y. Several rows per warp
keep several independent 16-byte loads in flight per lane (memory-level parallelism: a GEMV is
bound by HBM bandwidth).

The same fusions as the Triton twin, with its roundings, so a call site can switch kernels
without changing what it computes beyond fp32 summation order:

* RMSNorm prologue (``norm_weight``), folded: each lane gathers Σ x² from the x vectors it loads
  anyway and multiplies x by the norm weight (rounded to the working dtype, as the Triton
  prologue rounds x before its products); the warp's sum of squares gives rstd, which scales
  the row's sum at the end. A warp covers all of K, so no CTA needs another's partial sums.
* residual epilogue (``residual``): y = x Wᵀ + r in fp32, rounded once.
* programmatic dependent launch (kernels/pdl.py): inside ``pdl.scope(True)`` the kernel loads its
  first W vectors (weights are never written), then waits for its predecessor and lets the next
  kernel launch — the same contract as the Triton kernels.

Requirements: CUDA device, K % VEC == 0, unit stride along K, 16-byte aligned rows, W contiguous.
Anything else: ``available()`` / ``supports()`` say why and the caller uses the Triton twin.

On CPU (or without nvidia-cutlass-dsl) the module still imports: ``available()`` returns
(False, reason) and ``kernel_entry()`` reports the reason (the kernel suite skips it).
"""

from __future__ import annotations

from typing import Any

import torch

from fastpath import trace

from .entry import KernelSpec, default_dtypes

COMPONENT = "dense_gemv"
VARIANT = "cute"
MAX_M = 4

try:  # the DSL is optional: CPU builds and CI run without it
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import from_dlpack

    _IMPORT_ERROR = ""
except Exception as exc:  # pragma: no cover - depends on the environment
    cutlass = cute = from_dlpack = None  # type: ignore[assignment]
    _IMPORT_ERROR = f"nvidia-cutlass-dsl not importable ({type(exc).__name__}: {exc})"


def available() -> tuple[bool, str]:
    """(True, "") when the CuTe DSL kernel can run here, else (False, the reason)."""
    if _IMPORT_ERROR:
        return False, _IMPORT_ERROR
    if not torch.cuda.is_available():
        return False, "no CUDA device (CuTe DSL kernels never run on CPU; the Triton twin does)"
    major, _ = torch.cuda.get_device_capability()
    if major < 8:
        return False, f"needs sm_80+ (got sm_{major}x)"
    return True, ""


def _rows_ok(t: torch.Tensor) -> bool:
    """Unit stride along the last dim and every row starting on a 16-byte boundary."""
    return t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and (t.shape[0] == 1 or (t.stride(0) * t.element_size()) % 16 == 0)


def supports(x: torch.Tensor, weight: torch.Tensor, *, out: torch.Tensor | None = None,
             norm_weight: torch.Tensor | None = None, residual: torch.Tensor | None = None,
             need_device: bool = True) -> tuple[bool, str]:
    """Whether this call is in the kernel's scope; (False, reason) otherwise. ``need_device``
    False checks only the operands (what a CPU test can check)."""
    if need_device:
        ok, why = available()
        if not ok:
            return ok, why
    if weight.dtype not in (torch.bfloat16, torch.float16) or x.dtype != weight.dtype:
        return False, f"dtype {x.dtype}/{weight.dtype} (bf16/fp16 only)"
    if x.dim() != 2 or not 1 <= x.shape[0] <= MAX_M:
        return False, f"x of shape {tuple(x.shape)} (small-M kernel: [1..{MAX_M}, K])"
    M, K = x.shape
    N = weight.shape[0]
    vec = 16 // weight.element_size()
    if weight.shape[1] % vec or K != weight.shape[1]:
        return False, f"K = {weight.shape[1]} not a multiple of {vec} / mismatched x"
    if not weight.is_contiguous() or weight.data_ptr() % 16:
        return False, "W not contiguous / not 16-byte aligned"
    if not _rows_ok(x):
        return False, "x rows not unit-stride / 16-byte aligned"
    if out is not None and (out.shape != (M, N) or out.dtype != x.dtype or out.stride(-1) != 1):
        return False, f"out must be a [{M}, {N}] {x.dtype} tensor with unit stride along N (got {tuple(out.shape)} {out.dtype})"
    if norm_weight is not None and (norm_weight.shape != (K,) or norm_weight.dtype != x.dtype
                                    or not norm_weight.is_contiguous() or norm_weight.data_ptr() % 16):
        return False, f"norm_weight must be a contiguous 16-byte aligned [{K}] {x.dtype} tensor"
    if residual is not None and (residual.shape[0] != M or residual.shape[-1] < N
                                 or residual.dtype != x.dtype or residual.stride(-1) != 1):
        return False, f"residual must be [{M}, >= {N}] {x.dtype} with unit stride along N"
    return True, ""


_KERNELS: dict[Any, Any] = {}


def _build(warps: int, rows_per_warp: int, norm: bool = False, residual: bool = False,
           use_pdl: bool = False) -> Any:
    """The host launcher for one CTA configuration and fusion set (the kernel is defined once,
    lazily: it needs cutlass). The configuration is closed over, so the launcher's arguments
    are exactly the runtime ones (W, x, norm weight, y, residual, eps, stream)."""
    key = ("launch", warps, rows_per_warp, norm, residual, use_pdl)
    if key in _KERNELS:
        return _KERNELS[key]
    if "kernel" not in _KERNELS:
        _KERNELS["kernel"] = _define_kernel()
    cute_gemv_kernel = _KERNELS["kernel"]

    @cute.jit
    def cute_gemv_launch(mW: cute.Tensor, mX: cute.Tensor, mNW: cute.Tensor, mY: cute.Tensor,
                         mR: cute.Tensor, eps: cutlass.Float32, stream):
        vec = 128 // mW.element_type.width
        gW = cute.zipped_divide(mW, (1, vec))
        gX = cute.zipped_divide(mX, (1, vec))
        gNW = cute.zipped_divide(mNW, (1, vec))
        n = cute.size(mW, mode=[0])
        kv = cute.size(mW, mode=[1]) // vec
        m = cute.size(mX, mode=[0])
        rows_per_cta = warps * rows_per_warp
        cute_gemv_kernel(gW, gX, gNW, mY, mR, eps, n, kv * vec, kv, m, warps, rows_per_warp,
                         norm, residual, use_pdl).launch(
            grid=[(n + rows_per_cta - 1) // rows_per_cta, 1, 1],
            block=[warps * 32, 1, 1],
            stream=stream,
            use_pdl=use_pdl,
        )

    _KERNELS[key] = cute_gemv_launch
    return cute_gemv_launch


def _define_kernel() -> Any:

    def accumulate(gW, gX, gNW, acc, ss, j, w_row, M, RPW, NORM):
        """Add one 16-byte vector column ``j`` of this lane's rows to its sums (traced inline;
        ``w_row[r]`` is row r's W vector at j). With NORM, Σ x² gathers the sum of squares and
        x·nw is rounded to the working dtype, as the Triton prologue rounds x."""
        xs = []
        for m in range(M):
            xv = gX[(None, (m, j))].load().to(cutlass.Float32)
            if NORM:
                ss[m] = ss[m] + (xv * xv).reduce(cute.ReductionOp.ADD, cutlass.Float32(0.0), 0)
                xv = (xv * gNW[(None, (0, j))].load().to(cutlass.Float32)).to(gW.element_type).to(cutlass.Float32)
            xs.append(xv)
        for r in range(RPW):
            w = w_row[r].to(cutlass.Float32)
            for m in range(M):
                acc[r * M + m] = acc[r * M + m] + (w * xs[m]).reduce(
                    cute.ReductionOp.ADD, cutlass.Float32(0.0), 0)

    def w_vectors(gW, row0, j, N, RPW):
        # rows past N: a clamped read, never stored
        return [gW[(None, (cutlass.min(row0 + r, N - 1), j))].load() for r in range(RPW)]

    @cute.kernel
    def cute_gemv_kernel(
        gW: cute.Tensor,  # ((1, VEC), (N, KV)) vector view of W
        gX: cute.Tensor,  # ((1, VEC), (M, KV)) vector view of x
        gNW: cute.Tensor,  # ((1, VEC), (1, KV)) vector view of the norm weight (NORM only)
        mY: cute.Tensor,  # (M, N)
        mR: cute.Tensor,  # (M, >= N) residual (RESID only)
        eps: cutlass.Float32,
        N: cutlass.Constexpr,
        K: cutlass.Constexpr,
        KV: cutlass.Constexpr,
        M: cutlass.Constexpr,
        WARPS: cutlass.Constexpr,
        RPW: cutlass.Constexpr,
        NORM: cutlass.Constexpr,
        RESID: cutlass.Constexpr,
        PDL: cutlass.Constexpr,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        warp = tidx // 32
        lane = tidx % 32
        row0 = (bidx * WARPS + warp) * RPW

        acc = cute.make_rmem_tensor((RPW * M,), cutlass.Float32)
        for a in cutlass.range_constexpr(RPW * M):
            acc[a] = cutlass.Float32(0.0)
        ss = cute.make_rmem_tensor((M,), cutlass.Float32)  # Σ x² over this lane's x vectors
        for m in cutlass.range_constexpr(M):
            ss[m] = cutlass.Float32(0.0)

        # vector column `lane` of W is loaded before waiting on the previous kernel (weights are
        # never written); lanes past KV load a clamped column they never use
        w_first = w_vectors(gW, row0, cutlass.min(lane, KV - 1), N, RPW)
        if cutlass.const_expr(PDL):
            cute.arch.griddepcontrol_wait()
            cute.arch.griddepcontrol_launch_dependents()
        if lane < KV:
            accumulate(gW, gX, gNW, acc, ss, lane, w_first, M, RPW, NORM)
        for i in cutlass.range(1, (KV + 31) // 32, unroll=4):
            j = lane + 32 * i
            if j < KV:
                accumulate(gW, gX, gNW, acc, ss, j, w_vectors(gW, row0, j, N, RPW), M, RPW, NORM)

        if cutlass.const_expr(NORM):
            # each lane summed a different part of K: the warp's sum covers all of it
            for m in cutlass.range_constexpr(M):
                ss[m] = cute.math.rsqrt(cute.arch.warp_reduction_sum(ss[m]) / K + eps)
        for r in cutlass.range_constexpr(RPW):
            row = row0 + r
            for m in cutlass.range_constexpr(M):
                total = cute.arch.warp_reduction_sum(acc[r * M + m])
                if cutlass.const_expr(NORM):
                    total = total * ss[m]
                if lane == 0:
                    if row < N:
                        if cutlass.const_expr(RESID):
                            total = total + mR[m, row].to(cutlass.Float32)
                        mY[m, row] = total.to(mY.element_type)

    return cute_gemv_kernel


_COMPILED: dict[tuple, Any] = {}
DEFAULT_CONFIG = {"warps": 4, "rows_per_warp": 2}


def _wrap(t: torch.Tensor):
    return from_dlpack(t, assumed_align=16)


def gemv(x: torch.Tensor, weight: torch.Tensor, *, out: torch.Tensor | None = None,
         norm_weight: torch.Tensor | None = None, residual: torch.Tensor | None = None,
         eps: float = 1e-6, warps: int | None = None, rows_per_warp: int | None = None) -> torch.Tensor:
    """y = rmsnorm(x) @ weight^T (+ residual) with the CuTe DSL kernel. x [M, K] (M <= MAX_M),
    weight [N, K] (bf16/fp16, contiguous, 16-byte aligned), norm_weight [K] (optional RMSNorm
    prologue), residual [M, N] (optional epilogue); returns y [M, N] in x's dtype. Compiled once
    per (shapes, strides, dtype, config, fusions, PDL) and cached: the static layouts fix the
    loop trip counts."""
    ok, why = supports(x, weight, out=out, norm_weight=norm_weight, residual=residual)
    if not ok:
        raise RuntimeError(f"cute gemv unavailable for this call: {why}")
    warps = warps or DEFAULT_CONFIG["warps"]
    rpw = rows_per_warp or DEFAULT_CONFIG["rows_per_warp"]
    M, K = x.shape
    N = weight.shape[0]
    if out is None:
        out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if residual is not None:
        residual = residual[:, :N]
    # imported here, not at the top: pdl defines a @triton.jit helper, which must not be built
    # before the engine chooses Triton's interpreter (this module is imported on CPU too)
    from . import pdl

    use_pdl = pdl.enabled()
    trace.engaged(COMPONENT, VARIANT, m=M, n=N, k=K, norm=norm_weight is not None,
                  residual=residual is not None)
    import cuda.bindings.driver as cuda_drv  # installed with nvidia-cutlass-dsl

    stream = cuda_drv.CUstream(torch.cuda.current_stream(x.device).cuda_stream)
    # the norm weight as one row [1, K] (like x); unused stand-ins keep one signature
    nw = norm_weight.view(1, K) if norm_weight is not None else x[:1]
    res = residual if residual is not None else out
    key = (N, K, M, x.dtype, x.stride(0), out.stride(0), res.stride(0), warps, rpw,
           norm_weight is not None, residual is not None, use_pdl, x.device.index)
    args = (_wrap(weight), _wrap(x), _wrap(nw), _wrap(out), _wrap(res), float(eps), stream)
    fn = _COMPILED.get(key)
    if fn is None:
        fn = cute.compile(_build(warps, rpw, norm_weight is not None, residual is not None, use_pdl), *args)
        _COMPILED[key] = fn
    fn(*args)
    return out


# ----------------------------------------------------------------------------------------------
# registry entry

def _fused(x, weight, dtype=None, norm_weight=None, residual=None, eps=1e-6):
    """The Triton twin's reference semantics (gemv.gemv_reference): RMSNorm of x, matmul,
    residual, in ``dtype`` (the inputs' own dtype for the standard path, fp32 for the oracle)."""
    # imported here, not at the top: gemv.py defines @triton.jit kernels, and importing them
    # before a test turns on Triton's interpreter breaks the tests that run after (9975482)
    from .gemv import gemv_reference

    return gemv_reference(x, weight, epilogue="residual" if residual is not None else "none",
                          residual=residual, norm_weight=norm_weight, eps=eps, dtype=dtype)


def oracle(x, weight, **fusions):
    return _fused(x.float(), weight.float(), torch.float32,
                  **{k: v.float() for k, v in fusions.items()})


def standard(x, weight, **fusions):
    """The standard path's way: torch ops (RMSNorm, cuBLAS matmul) in the working dtype."""
    return _fused(x, weight, **fusions)


def fast(x, weight, **fusions):
    return gemv(x, weight, **fusions)


def make_inputs(shape: dict, value_class: str = "normal", dtype: Any = torch.bfloat16,
                device: Any = "cuda", seed: int = 0) -> dict:
    """shape: {"m", "n", "k"} and optionally "norm" / "residual" (1: add that fusion's operand);
    value classes: normal (x ~ N(0,1), W ~ N(0, 1/K)), large (x64), near_zero (x1e-3)."""
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    g = torch.Generator(device="cpu").manual_seed(seed)
    M, N, K = shape["m"], shape["n"], shape["k"]
    amp = {"normal": 1.0, "large": 64.0, "near_zero": 1e-3}[value_class]
    x = (torch.randn(M, K, generator=g) * amp).to(dtype).to(device)
    w = (torch.randn(N, K, generator=g) * K ** -0.5).to(dtype).to(device)
    inp = dict(x=x, weight=w)
    if shape.get("norm"):
        inp["norm_weight"] = (1 + 0.1 * torch.randn(K, generator=g)).to(dtype).to(device)
    if shape.get("residual"):
        inp["residual"] = torch.randn(M, N, generator=g).to(dtype).to(device)
    return inp


def kernel_entry(device: Any = None) -> KernelSpec:
    """Registry entry. Off CUDA / without the DSL, ``dtypes`` is empty and ``unavailable``
    carries the reason (the kernel suite records a waiver with it). Shapes: K3-mini's
    projections at M = 1, 2, 4 — plain, with the RMSNorm prologue (the in-projections), with the
    residual epilogue (o_proj), both — and ragged N / K tails."""
    ok, why = available()
    shapes = [dict(m=m, n=n, k=k) for m in (1, 2) for n, k in ((14336, 4096), (4096, 4096))]
    shapes += [dict(m=m, n=6144, k=4096, norm=1) for m in (1, 2, 4)]
    shapes += [dict(m=m, n=4096, k=4096, residual=1) for m in (1, 2, 4)]
    shapes += [dict(m=3, n=2048, k=4096, norm=1), dict(m=4, n=4096, k=2048, residual=1)]
    shapes += [dict(m=1, n=1000, k=4104), dict(m=2, n=4097, k=512, norm=1, residual=1)]
    dts = [d for d in default_dtypes(device) if d in ("bfloat16", "float16")] if ok else []
    spec = KernelSpec(
        name="gemv_cute", component=COMPONENT, fast=fast, standard=standard, oracle=oracle,
        make_inputs=make_inputs, shapes=shapes, value_classes=["normal", "large", "near_zero"],
        dtypes=dts, k=2.0, deterministic=True, kernel_patterns=[r"cute_gemv_kernel"],
    )
    spec.unavailable = "" if ok else why  # type: ignore[attr-defined]
    return spec
