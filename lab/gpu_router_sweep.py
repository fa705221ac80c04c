"""Sweep the fused MoE router's configurations at K3-mini's shape (GPU only).

    python3 -m lab.gpu_router_sweep [--batches 1,8,32,64] [--baseline PATH] [--table-only]

Router: x [B, 4096] bf16 (normed in the kernel), 64 experts, top-8, with the grouping by
expert for the experts kernels (``align``, BLOCK_M as the experts' table gives it). Times the
tuning table's config and candidates (tile shape, warps), the router + a separate align launch,
and, with ``--baseline``, a copy of an older moe.py. fastpath.measure.graph_time (20 calls in one
CUDA graph, median of 3 replays). Checks every candidate's ids against the reference routing
and its grouping against the standalone align. Writes $OUT/router_sweep.json.
"""

from __future__ import annotations

import argparse
import json
import os

import torch

from fastpath.measure import graph_time, stopwatch_log
from lab.sweep_util import load_module
from optimized_model.k3.fast import tuning
from optimized_model.k3.fast.kernels import moe as MOE

CANDIDATES = [
    ("w4", dict(num_warps=4)),
    ("w2", dict(num_warps=2)),
    ("e4m4k512_w4", dict(BLOCK_E=4, BLOCK_M=4, BLOCK_K=512, num_warps=4)),
    ("e8m4k512_w4", dict(BLOCK_E=8, BLOCK_M=4, BLOCK_K=512, num_warps=4)),
    ("e4m8k256_w4", dict(BLOCK_E=4, BLOCK_M=8, BLOCK_K=256, num_warps=4)),
    ("e2m4k1024_w4", dict(BLOCK_E=2, BLOCK_M=4, BLOCK_K=1024, num_warps=4)),
    ("e2m2k1024_w4", dict(BLOCK_E=2, BLOCK_M=2, BLOCK_K=1024, num_warps=4)),
    ("e4m16k256_w4", dict(BLOCK_E=4, BLOCK_M=16, BLOCK_K=256, num_warps=4)),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,8,32,64")
    ap.add_argument("--baseline", default="")
    ap.add_argument("--table-only", action="store_true", help="time only the table's config (and the baseline's)")
    args = ap.parse_args()
    log = stopwatch_log()
    dev = "cuda"
    D, E, k = 4096, 64, 8
    base_mod = load_module(args.baseline, "moe_baseline") if args.baseline else None
    rows = []

    for B in [int(b) for b in args.batches.split(",")]:
        g = torch.Generator(device=dev).manual_seed(B)
        x = torch.randn(B, D, device=dev, generator=g).to(torch.bfloat16)
        rw = torch.randn(E, D, device=dev, generator=g) / D ** 0.5
        rb = torch.randn(E, device=dev, generator=g) * 0.1
        nw = (1 + 0.1 * torch.randn(D, device=dev, generator=g)).to(torch.bfloat16)
        bm = MOE.experts_block_m(B, tuning.lookup("moe_experts", B, device=dev))
        ref_ids, _ = MOE.router_reference(x, rw, rb, k, norm_weight=nw)
        table = tuning.lookup("moe_router", B, device=dev)
        cands = [("table", dict(table))] + ([] if args.table_only else [(n, {**table, **c}) for n, c in CANDIDATES])
        mods = [("", MOE)] + ([("old_", base_mod)] if base_mod else [])
        for prefix, mod in mods:
            for name, cfg in cands:
                if prefix and name != "table":
                    continue
                al = mod.MoeAlign(B, k, E, bm, dev)
                sc = mod.RouterScratch(B, E, dev)
                ids = torch.empty(B, k, dtype=torch.int32, device=dev)
                w = torch.empty(B, k, dtype=torch.float32, device=dev)
                fn = lambda: mod.moe_router(x, rw, rb, k, norm_weight=nw, ids=ids, weights=w,  # noqa: E731
                                            config=cfg, scratch=sc, align=al)
                us = graph_time(fn) * 1e6
                ok_ids = torch.equal(ids.sort(-1).values, ref_ids.sort(-1).values)
                ref_al = MOE.moe_align(ids, E, bm)
                ok_al = torch.equal(al.bexp, ref_al.bexp) and torch.equal(al.brows, ref_al.brows)
                rows.append(dict(batch=B, config=prefix + name, us=us, ids_ok=ok_ids, align_ok=ok_al))
                log(f"router B={B:3d} {prefix + name:14s} {us:7.1f} us  ids {'ok' if ok_ids else 'DIFFER'}"
                    f"  align {'ok' if ok_al else 'DIFFER'}")
        # the router without the fused grouping + one align launch
        al = MOE.MoeAlign(B, k, E, bm, dev)
        ids = torch.empty(B, k, dtype=torch.int32, device=dev)
        w = torch.empty(B, k, dtype=torch.float32, device=dev)
        sc = MOE.RouterScratch(B, E, dev)

        def split():
            MOE.moe_router(x, rw, rb, k, norm_weight=nw, ids=ids, weights=w, config=table, scratch=sc)
            MOE.moe_align(ids, E, bm, align=al)
        us = graph_time(split) * 1e6
        rows.append(dict(batch=B, config="table+align_launch", us=us))
        log(f"router B={B:3d} {'table+align':14s} {us:7.1f} us")
    with open(os.path.join(os.environ.get("OUT", "."), "router_sweep.json"), "w") as fh:
        json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), fh, indent=1)


if __name__ == "__main__":
    main()
