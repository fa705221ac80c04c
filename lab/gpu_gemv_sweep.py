"""Sweep GEMV configurations over the decode step's real projection shapes (GPU only).

    python3 -m lab.gpu_gemv_sweep [--batches 1,64] [--budget 150]

For each call site of the K3-mini (mini) step — its N, K, prologue and epilogue — and each
batch, times the tuning table's config and a set of candidates (one CUDA graph of 20 calls,
median of 3 replays; fastpath.measure.graph_time) and, for plain projections at batch ≤ 2, the CuTe DSL
GEMV. Prints µs and TB/s per (site, batch, candidate) and the best; writes $OUT/gemv_sweep.json.
The data for the tuning table; nothing here changes it.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from fastpath.measure import graph_time
from optimized_model.k3.fast import tuning
from optimized_model.k3.fast.kernels import gemv as G

# site: (N, K, epilogue, norm prologue, x slots, fp32 out[, SwiGLU prologue]); mini config,
# see fast/runtime.py
SITES = {
    "moe.in": (10240, 4096, "none", True, 1, False),
    "shared.w2glu": (4096, 4096, "residual", False, 1, False, True),
    "kda.in": (12576, 4096, "none", True, 1, False),
    "kda.fg": (8192, 256, "none", False, 1, False),
    "attn.o": (4096, 4096, "residual", False, 1, False),
    "mla.in": (6144, 4096, "none", True, 1, False),
    "mla.q_b": (4096, 1536, "none", True, 1, False),
    "dense.w13": (11008, 4096, "swiglu", True, 1, False),
    "dense.w2": (4096, 11008, "residual", False, 1, False),
    "moe.down": (2048, 4096, "none", True, 1, False),
    "moe.up": (4096, 2048, "residual", False, 8, False),
    "moe.up1": (4096, 2048, "residual", False, 1, False),  # the slots summed by the experts' down kernel
    "shared.w13": (4096, 4096, "swiglu", True, 1, False),
    "lm_head": (265, 4096, "none", True, 1, True),  # the 265 real tokens (fast/runtime.py)
}
# per-step launches of each site (8 layers: 6 KDA, 2 MLA, 1 dense FFN, 7 MoE)
COUNT = {"moe.in": 7, "shared.w2glu": 7, "kda.in": 6, "kda.fg": 6, "attn.o": 8 + 7, "mla.in": 2, "mla.q_b": 2, "dense.w13": 1,
         "dense.w2": 1, "moe.down": 7, "moe.up": 7, "moe.up1": 7, "shared.w13": 7, "lm_head": 1}

SMALL_M = [("bn8_t1056", dict(BLOCK_N=8, target_programs=1056)),
           ("bn32_bk256", dict(BLOCK_N=32, BLOCK_K=256)),
           ("bk1024_w8", dict(BLOCK_K=1024, num_warps=8)),
           ("no_prefetch", dict(prefetch=0)),
           ("t1056", dict(target_programs=1056)),
           ("t264", dict(target_programs=264)),
           ("w8", dict(num_warps=8)),
           ("bk256", dict(BLOCK_K=256)),
           ("w2_bn8", dict(BLOCK_N=8, num_warps=2, target_programs=1056)),
           # batch 1: the products reduced across threads once per program, not per K tile
           ("acc2d", dict(acc2d=1)),
           ("acc2d_bk256", dict(acc2d=1, BLOCK_K=256)),
           ("acc2d_w4", dict(acc2d=1, num_warps=4)),
           ("acc2d_bn16_w4", dict(acc2d=1, BLOCK_N=16, num_warps=4)),
           ("acc2d_bk1024_w4", dict(acc2d=1, BLOCK_K=1024, num_warps=4)),
           ("acc2d_nopf", dict(acc2d=1, prefetch=0)),
           ("acc2d_bn4", dict(acc2d=1, BLOCK_N=4, target_programs=2112)),
           ("acc2d_t2112", dict(acc2d=1, target_programs=2112))]
TILED = [("bn64_bk128", dict(BLOCK_N=64, BLOCK_K=128)),
         ("bn32_bk256_t800", dict(BLOCK_N=32, BLOCK_K=256, target_programs=800)),
         ("w8", dict(num_warps=8)),
         ("st5", dict(num_stages=5)),
         ("bn128_bk64", dict(BLOCK_N=128, BLOCK_K=64))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--budget", type=float, default=150.0)
    ap.add_argument("--sites", default=",".join(SITES))
    args = ap.parse_args()
    t0 = time.time()
    dev, bf = "cuda", torch.bfloat16
    rows = []
    for M in [int(b) for b in args.batches.split(",")]:
        for site in args.sites.split(","):
            N, K, epi, norm, slots, f32, *more = SITES[site]
            glu = bool(more and more[0])
            if time.time() - t0 > args.budget:
                print(f"skip {site} M={M}: time budget", flush=True)
                continue
            rowsW = 2 * N if epi == "swiglu" else N
            w = torch.randn(rowsW, K, device=dev, dtype=bf) / K ** 0.5
            x = torch.randn(*((M, slots, K) if slots > 1 else (M, 2 * K if glu else K)), device=dev,
                            dtype=torch.float32 if slots > 1 else bf)
            y = torch.empty(M, N, device=dev, dtype=torch.float32 if f32 else bf)
            kw = {}
            if epi == "residual":
                kw["residual"] = torch.randn(M, N, device=dev, dtype=bf)
            if norm:
                kw["norm_weight"] = torch.ones(K, device=dev, dtype=bf)
            if glu:
                kw["glu_input"] = True
            base = tuning.entry("gemv", M, device=dev)
            cands = [("table", tuning.lookup("gemv", M, device=dev, N=N, K=K, epilogue=epi))]
            for label, upd in (SMALL_M if int(base.get("BLOCK_M") or 1) < 16 else TILED):
                e = dict(base)
                e.update(upd)
                cands.append((label, tuning.resolve_split(e, M, N, K)))
            nbytes = rowsW * K * 2
            best = None
            for label, cfg in cands:
                scratch = G.GemvScratch(M, N, int(cfg.get("SPLIT_K", 1)), epi == "swiglu", dev)
                try:
                    t = graph_time(lambda: G.gemv(x, w, out=y, epilogue=epi, config=cfg, scratch=scratch, **kw))
                except Exception as exc:  # a candidate that does not compile/fit: data too
                    print(f"{site:11s} M={M:3d} {label:16s} error {type(exc).__name__}: {str(exc)[:120]}", flush=True)
                    continue
                r = {"site": site, "M": M, "N": N, "K": K, "cand": label, "us": t * 1e6,
                     "TBps": nbytes / t / 1e12, "split": cfg.get("SPLIT_K"), "count": COUNT[site]}
                rows.append(r)
                if best is None or r["us"] < best["us"]:
                    best = r
                print(f"{site:11s} M={M:3d} {label:16s} {r['us']:8.1f} us {r['TBps']:5.2f} TB/s split={r['split']}",
                      flush=True)
            # the ceiling: cuBLAS on the same weight bytes (plain x Wᵀ, no prologue or epilogue)
            xb = torch.randn(M, K, device=dev, dtype=bf)
            yb = torch.empty(M, rowsW, device=dev, dtype=bf)
            t = graph_time(lambda: torch.mm(xb, w.t(), out=yb))
            rows.append({"site": site, "M": M, "N": N, "K": K, "cand": "cublas_plain", "us": t * 1e6,
                         "TBps": nbytes / t / 1e12, "count": COUNT[site]})
            print(f"{site:11s} M={M:3d} {'cublas_plain':16s} {t * 1e6:8.1f} us {nbytes / t / 1e12:5.2f} TB/s", flush=True)
            if M <= 2 and epi == "none" and not norm and slots == 1:
                try:
                    from optimized_model.k3.fast.kernels import cute_gemv

                    t = graph_time(lambda: cute_gemv.gemv(x, w, out=y))
                    r = {"site": site, "M": M, "N": N, "K": K, "cand": "cute", "us": t * 1e6,
                         "TBps": nbytes / t / 1e12, "count": COUNT[site]}
                    rows.append(r)
                    print(f"{site:11s} M={M:3d} {'cute':16s} {r['us']:8.1f} us {r['TBps']:5.2f} TB/s", flush=True)
                except Exception as exc:
                    print(f"{site:11s} M={M:3d} cute error {type(exc).__name__}: {str(exc)[:120]}", flush=True)
            if best:
                tab = next(r for r in rows if r["site"] == site and r["M"] == M and r["cand"] == "table")
                cub = next(r for r in rows if r["site"] == site and r["M"] == M and r["cand"] == "cublas_plain")
                print(f"  cuBLAS (plain) {cub['us']:.1f} us", flush=True)
                print(f"  best {site} M={M}: {best['cand']} {best['us']:.1f} us vs table {tab['us']:.1f} us "
                      f"(x{COUNT[site]} per step: saves {(tab['us'] - best['us']) * COUNT[site]:.0f} us)", flush=True)
            del w, x, y, xb, yb
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "gemv_sweep.json"), "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
