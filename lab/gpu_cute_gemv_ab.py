"""The CuTe DSL GEMV against the Triton GEMV as the H200 table configures it, and cuBLAS (GPU only).

    python3 -m lab.gpu_cute_gemv_ab [--shapes 4096x4096,6144x4096] [--l2-mb 50]

y = x Wᵀ in bf16 at M = 1 and 2 (the CuTe kernel's scope, kernels/cute_gemv.py) on K3-mini's
plain projection shapes. Every call reads its weight from HBM: enough weight copies are rotated
to hold twice the L2 (a single 32 MB weight called back to back would mostly come from L2).
Triton runs the tuning table's entry for (M, N, K, epilogue "none"), i.e. what the step would
launch; CuTe runs its default CTA shape and a few others. Prints µs per call (the rotated calls
in one CUDA graph, median of 3 replays), weight TB/s and the largest |difference| from cuBLAS;
writes $OUT/cute_gemv_ab.json. Needs nvidia-cutlass-dsl (carried as wheels, see the README).
"""

from __future__ import annotations

import argparse
import json
import math
import os

import torch

from fastpath.measure import graph_time, stopwatch_log
from optimized_model.k3.fast import tuning
from optimized_model.k3.fast.kernels import cute_gemv
from optimized_model.k3.fast.kernels import gemv as G

CUTE_SHAPES = [(4, 2), (4, 4), (8, 2), (8, 4), (2, 4)]  # (warps, rows per warp); (4, 2) = default


def candidates(x: torch.Tensor, N: int, K: int) -> list[tuple[str, object]]:
    """(name, fn(w, y)) for one x: cuBLAS, the table's Triton config, the CuTe CTA shapes."""
    M = x.shape[0]
    cfg = tuning.lookup("gemv", M, device=x.device, N=N, K=K, epilogue="none")
    split = int(cfg.get("SPLIT_K", 1))
    scratch = G.GemvScratch(M, N, split, False, x.device) if split > 1 else None
    out = [("cublas", lambda w, y: torch.matmul(x, w.t(), out=y)),
           (f"triton_table[{G.variant_name(M, cfg)}]",
            lambda w, y: G.gemv(x, w, out=y, config=cfg, scratch=scratch))]
    for warps, rpw in CUTE_SHAPES:
        out.append((f"cute_w{warps}_r{rpw}",
                    lambda w, y, warps=warps, rpw=rpw: cute_gemv.gemv(x, w, out=y, warps=warps, rows_per_warp=rpw)))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="4096x4096,6144x4096,12576x4096,14336x4096", help="NxK,...")
    ap.add_argument("--l2-mb", type=float, default=50.0, help="L2 size to outrun (twice this is rotated)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("gpu_cute_gemv_ab: no CUDA device here; nothing to measure")
        return 2
    ok, why = cute_gemv.available()
    if not ok:
        raise SystemExit(f"gpu_cute_gemv_ab: the CuTe GEMV cannot run here: {why}. Carry the "
                         "nvidia-cutlass-dsl wheels (README: GPU runs).")
    log = stopwatch_log()
    rows = []
    for shape in args.shapes.split(","):
        N, K = (int(v) for v in shape.lower().split("x"))
        nbytes = N * K * 2
        copies = max(2, math.ceil(2 * args.l2_mb * 2 ** 20 / nbytes))
        ws = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K ** 0.5 for _ in range(copies)]
        for M in (1, 2):
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            ref = torch.matmul(x, ws[0].t()).float()
            ys = [torch.empty(M, N, device="cuda", dtype=torch.bfloat16) for _ in ws]
            for name, fn in candidates(x, N, K):
                try:
                    fn(ws[0], ys[0])
                    torch.cuda.synchronize()
                    diff = float((ys[0].float() - ref).abs().max())
                    us = graph_time(lambda: [fn(w, y) for w, y in zip(ws, ys)]) * 1e6 / copies
                except Exception as exc:  # a CTA shape that does not build: record it, go on
                    log(f"M{M} {N}x{K} {name:24s} FAILED {type(exc).__name__}: {str(exc)[:160]}")
                    rows.append(dict(M=M, N=N, K=K, name=name, error=f"{type(exc).__name__}: {exc}"))
                    continue
                rows.append(dict(M=M, N=N, K=K, name=name, us=us, tbps=nbytes / us / 1e6, max_diff=diff))
                log(f"M{M} {N}x{K} {name:24s} {us:7.2f} us {nbytes / us / 1e6:5.2f} TB/s  diff {diff:.2e}")
        del ws
        torch.cuda.empty_cache()
    path = os.path.join(os.environ.get("OUT", "."), "cute_gemv_ab.json")
    with open(path, "w") as fh:
        json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), fh, indent=1)
    log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
