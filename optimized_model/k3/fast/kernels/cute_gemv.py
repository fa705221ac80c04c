"""Small-M dense GEMV ``y = x @ W^T`` in CuTe DSL (nvidia-cutlass-dsl 4.8.1) — the hottest decode
op at batch 1-2 (every projection is one). Variant "cute" of component ``dense_gemv``; the
Triton twin lives in ``gemv.py`` and the tuning table picks whichever measured faster.

Kernel (``cute_gemv_kernel``): W [N, K] row-major bf16/fp16, x [M, K] (M = 1..MAX_M), y [M, N].
W and x are viewed as 16-byte vectors (``zipped_divide`` by (1, VEC), VEC = 128 / element bits),
so every load is one 128-bit ``ld.global``. A CTA of WARPS warps owns a slab of
WARPS * ROWS_PER_WARP consecutive rows; each warp owns ROWS_PER_WARP rows; lane ``l`` reads the
vectors ``l, l + 32, l + 64, ...`` of each of its rows (coalesced: a warp reads 512 contiguous
bytes per row per step), multiplies them with the matching x vectors in fp32, and the fp32 partial
sums are reduced across the warp with butterfly shuffles; lane 0 writes y. Several rows per warp
keep several independent 16-byte loads in flight per lane (memory-level parallelism: a GEMV is
bound by HBM bandwidth).

Requirements: CUDA device, K % VEC == 0, contiguous rows, 16-byte aligned W and x. Anything
else: ``available()`` / ``supports()`` say why and the caller uses the Triton twin.

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
MAX_M = 2

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


def supports(x: torch.Tensor, weight: torch.Tensor) -> tuple[bool, str]:
    """Whether this (x, W) pair is in the kernel's scope; (False, reason) otherwise."""
    ok, why = available()
    if not ok:
        return ok, why
    if weight.dtype not in (torch.bfloat16, torch.float16) or x.dtype != weight.dtype:
        return False, f"dtype {x.dtype}/{weight.dtype} (bf16/fp16 only)"
    if x.dim() != 2 or not 1 <= x.shape[0] <= MAX_M:
        return False, f"M = {x.shape[0] if x.dim() == 2 else x.shape} (small-M kernel: 1..{MAX_M})"
    vec = 16 // weight.element_size()
    if weight.shape[1] % vec or x.shape[1] != weight.shape[1]:
        return False, f"K = {weight.shape[1]} not a multiple of {vec} / mismatched x"
    if not (weight.is_contiguous() and x.is_contiguous()):
        return False, "non-contiguous operand"
    if weight.data_ptr() % 16 or x.data_ptr() % 16:
        return False, "operand not 16-byte aligned"
    return True, ""


_KERNELS: dict[Any, Any] = {}


def _build(warps: int, rows_per_warp: int) -> Any:
    """The host launcher for one CTA configuration (the kernel is defined once, lazily: it
    needs cutlass). The configuration is closed over, so the launcher's arguments are exactly
    the runtime ones (W, x, y, stream)."""
    if ("launch", warps, rows_per_warp) in _KERNELS:
        return _KERNELS[("launch", warps, rows_per_warp)]
    if "kernel" not in _KERNELS:
        _KERNELS["kernel"] = _define_kernel()
    cute_gemv_kernel = _KERNELS["kernel"]

    @cute.jit
    def cute_gemv_launch(mW: cute.Tensor, mX: cute.Tensor, mY: cute.Tensor, stream):
        vec = 128 // mW.element_type.width
        gW = cute.zipped_divide(mW, (1, vec))
        gX = cute.zipped_divide(mX, (1, vec))
        n = cute.size(mW, mode=[0])
        kv = cute.size(mW, mode=[1]) // vec
        m = cute.size(mX, mode=[0])
        rows_per_cta = warps * rows_per_warp
        cute_gemv_kernel(gW, gX, mY, n, kv, m, warps, rows_per_warp).launch(
            grid=[(n + rows_per_cta - 1) // rows_per_cta, 1, 1],
            block=[warps * 32, 1, 1],
            stream=stream,
        )

    _KERNELS[("launch", warps, rows_per_warp)] = cute_gemv_launch
    return cute_gemv_launch


def _define_kernel() -> Any:

    @cute.kernel
    def cute_gemv_kernel(
        gW: cute.Tensor,  # ((1, VEC), (N, KV)) vector view of W
        gX: cute.Tensor,  # ((1, VEC), (M, KV)) vector view of x
        mY: cute.Tensor,  # (M, N)
        N: cutlass.Constexpr,
        KV: cutlass.Constexpr,
        M: cutlass.Constexpr,
        WARPS: cutlass.Constexpr,
        RPW: cutlass.Constexpr,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        warp = tidx // 32
        lane = tidx % 32
        row0 = (bidx * WARPS + warp) * RPW

        acc = cute.make_rmem_tensor((RPW * M,), cutlass.Float32)
        for a in cutlass.range_constexpr(RPW * M):
            acc[a] = cutlass.Float32(0.0)

        iters = (KV + 31) // 32
        for i in cutlass.range(iters, unroll=4):
            j = lane + 32 * i
            if j < KV:
                xs = []
                for m in cutlass.range_constexpr(M):
                    xs.append(gX[(None, (m, j))].load().to(cutlass.Float32))
                for r in cutlass.range_constexpr(RPW):
                    row = cutlass.min(row0 + r, N - 1)  # rows past N: clamped read, no store
                    w = gW[(None, (row, j))].load().to(cutlass.Float32)
                    for m in cutlass.range_constexpr(M):
                        acc[r * M + m] = acc[r * M + m] + (w * xs[m]).reduce(
                            cute.ReductionOp.ADD, cutlass.Float32(0.0), 0)

        for r in cutlass.range_constexpr(RPW):
            row = row0 + r
            for m in cutlass.range_constexpr(M):
                total = cute.arch.warp_reduction_sum(acc[r * M + m])
                if lane == 0:
                    if row < N:
                        mY[m, row] = total.to(mY.element_type)

    return cute_gemv_kernel


_COMPILED: dict[tuple, Any] = {}
DEFAULT_CONFIG = {"warps": 4, "rows_per_warp": 2}


def _wrap(t: torch.Tensor):
    return from_dlpack(t, assumed_align=16)


def gemv(x: torch.Tensor, weight: torch.Tensor, *, out: torch.Tensor | None = None,
         warps: int | None = None, rows_per_warp: int | None = None) -> torch.Tensor:
    """y = x @ weight^T with the CuTe DSL kernel. x [M, K] (M <= 2), weight [N, K] (bf16/fp16,
    contiguous, 16-byte aligned), returns y [M, N] in x's dtype. Compiled once per
    (N, K, M, dtype, config) and cached (the static shapes fix the loop trip counts)."""
    ok, why = supports(x, weight)
    if not ok:
        raise RuntimeError(f"cute gemv unavailable for this call: {why}")
    warps = warps or DEFAULT_CONFIG["warps"]
    rpw = rows_per_warp or DEFAULT_CONFIG["rows_per_warp"]
    M, K = x.shape
    N = weight.shape[0]
    if out is None:
        out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    elif out.shape != (M, N) or not out.is_contiguous() or out.dtype != x.dtype:
        # the compiled kernel is specialised on a contiguous [M, N] output layout
        raise RuntimeError(f"cute gemv: out must be a contiguous [{M}, {N}] {x.dtype} tensor")
    trace.engaged(COMPONENT, VARIANT, m=M, n=N, k=K)
    import cuda.bindings.driver as cuda_drv  # installed with nvidia-cutlass-dsl

    stream = cuda_drv.CUstream(torch.cuda.current_stream(x.device).cuda_stream)
    key = (N, K, M, x.dtype, warps, rpw, x.device.index)
    args = (_wrap(weight), _wrap(x), _wrap(out), stream)
    fn = _COMPILED.get(key)
    if fn is None:
        fn = cute.compile(_build(warps, rpw), *args)
        _COMPILED[key] = fn
    fn(*args)
    return out


# ----------------------------------------------------------------------------------------------
# registry entry

def oracle(x, weight, **_):
    return x.float() @ weight.float().t()


def standard(x, weight, **_):
    """The standard path's way: torch matmul (cuBLAS) in the working dtype."""
    return x @ weight.t()


def fast(x, weight, **_):
    return gemv(x, weight)


def make_inputs(shape: dict, value_class: str = "normal", dtype: Any = torch.bfloat16,
                device: Any = "cuda", seed: int = 0) -> dict:
    """shape: {"m", "n", "k"}; value classes: normal (x ~ N(0,1), W ~ N(0, 1/K)), large (x64),
    near_zero (x1e-3)."""
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    g = torch.Generator(device="cpu").manual_seed(seed)
    M, N, K = shape["m"], shape["n"], shape["k"]
    amp = {"normal": 1.0, "large": 64.0, "near_zero": 1e-3}[value_class]
    x = (torch.randn(M, K, generator=g) * amp).to(dtype).to(device)
    w = (torch.randn(N, K, generator=g) * K ** -0.5).to(dtype).to(device)
    return dict(x=x, weight=w)


def kernel_entry(device: Any = None) -> KernelSpec:
    """Registry entry. Off CUDA / without the DSL, ``dtypes`` is empty and ``unavailable``
    carries the reason (the kernel suite records a waiver with it)."""
    ok, why = available()
    shapes = [dict(m=m, n=n, k=k) for m in (1, 2) for n, k in ((14336, 4096), (4096, 4096))]
    shapes += [dict(m=1, n=1000, k=4104), dict(m=2, n=4097, k=512)]  # ragged N / K tails
    dts = [d for d in default_dtypes(device) if d in ("bfloat16", "float16")] if ok else []
    spec = KernelSpec(
        name="gemv_cute", component=COMPONENT, fast=fast, standard=standard, oracle=oracle,
        make_inputs=make_inputs, shapes=shapes, value_classes=["normal", "large", "near_zero"],
        dtypes=dts, k=2.0, deterministic=True, kernel_patterns=[r"cute_gemv_kernel"],
    )
    spec.unavailable = "" if ok else why  # type: ignore[attr-defined]
    return spec
