"""The verify step's KDA kernels on the H200: ``kda_verify`` at each V-tile width, warp count
and gate form (low rank, or f and gate given) and the fast commit (``verify_commit``) against
``K3Model.commit``'s torch ops, each checked against its references (the kernels suite's rule:
error to the fp32 oracle within max(atol floor, k x the standard path's)) and timed
(``fastpath.measure.graph_time``: 20 launches in one CUDA graph, median of 5 replays).

    python3 -m lab.gpu_verify_kernels [--shapes 8x4,16x4,4x8] [--block-v 0,128,64,32,16]
        [--warps 0,4,8] [--ranks 128,0]

block_v 0 is the kernel's default (``choose_block_v``), warps 0 its default. Prints one table
per kernel.
"""

from __future__ import annotations

import argparse

import torch

from fastpath.measure import graph_time
from optimized_model.k3.fast.kernels import kda_verify as KV
from optimized_model.k3.fast.kernels import verify_commit as VC

K3 = dict(heads=32, head_k=128, head_v=128)


def graph_us(fn) -> float:
    """µs per call of ``fn``: 20 calls in one CUDA graph, median of 5 replays."""
    return 1e6 * graph_time(fn, calls=20, replays=5)


def worst(got, ref) -> float:
    return max(float((a.float() - b.float()).abs().max()) for a, b in zip(got, ref))


def kda_verify_table(shapes: list[tuple[int, int]], tiles: list[int], warps: list[int], ranks: list[int]) -> None:
    entry = KV.kernel_entry("cuda")
    floor = entry.atol_floor["bfloat16"]
    print("| batch | T | gates' rank | block_v | warps | µs | err vs oracle | k x std err | ok |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for B, T, rank in ((B, T, r) for B, T in shapes for r in ranks):
        shape = dict(batch=B, tokens=T, **K3, **({"rank": rank} if rank else {}))
        base = KV.make_inputs(shape, "normal", torch.bfloat16, "cuda", 0)
        std, orc = KV.standard(**base), KV.oracle(**base)
        tol = max(floor, entry.k * worst(std, orc))
        for bv, nw in ((b, w) for b in tiles for w in warps):
            inp = dict(base, block_v=bv or None)
            if nw:
                inp["num_warps"] = nw
            err = worst(KV.fast(**inp), orc)
            # timed in place on one input set (the state advances; the work per launch is the same)
            pos, args = KV.call_args(inp)
            H, V = K3["heads"], K3["head_v"]
            out = torch.empty(B * T, H * V, dtype=torch.bfloat16, device="cuda")
            us = graph_us(lambda: KV.kda_verify(*pos, out=out, **args))
            print(f"| {B} | {T} | {rank or 'full (f, gate given)'} | {bv or 'default'} | {nw or 'default'} | "
                  f"{us:.1f} | {err:.2e} | {tol:.2e} | {'yes' if err <= tol else 'NO'} |", flush=True)


def commit_table(shapes: list[tuple[int, int]], context: int) -> None:
    print("| batch | T | fast µs | torch µs (K3Model.commit) | bit-equal |")
    print("|---:|---:|---:|---:|---|")
    cap = -(-(context + 8) // 64) * 64
    for B, T in shapes:
        shape = dict(batch=B, tokens=T, kda_layers=6, mla_layers=2, heads=32, head_k=128, channels=12288,
                     latent=576, capacity=cap)
        inp = VC.make_inputs(shape, "normal", torch.bfloat16, "cuda", 0)
        inp["lengths"].fill_(context)
        same = all(torch.equal(a, b) for a, b in zip(VC.fast(**inp), VC.standard(**inp)))
        st = [inp[k].clone() for k in VC.STATE_FIELDS]  # kda, conv, latent, lengths
        base = inp["lengths"].clone()

        def fast_once():
            st[-1].copy_(base)
            VC.commit(*st, inp["states"], inp["window"], inp["keep"])

        model_cls, owner, state, trail = VC._state_and_trail(inp)

        def torch_once():
            state.lengths.copy_(base)
            model_cls.commit_tensors(owner, state, trail, inp["keep"])

        print(f"| {B} | {T} | {graph_us(fast_once):.1f} | {graph_us(torch_once):.1f} | {same} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1x4,8x4,16x4,4x8,8x8,16x8", help="BATCHxT, comma list")
    ap.add_argument("--block-v", default="0,128,64,32,16")
    ap.add_argument("--warps", default="0", help="num_warps, comma list (0: the kernel's default)")
    ap.add_argument("--ranks", default="128", help="the gates' low rank, comma list (0: f and gate given, no low rank)")
    ap.add_argument("--skip-commit", action="store_true")
    ap.add_argument("--context", type=int, default=8192, help="the commit's context (latent cache size)")
    a = ap.parse_args()
    shapes = [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",")]
    kda_verify_table(shapes, [int(x) for x in a.block_v.split(",")], [int(x) for x in a.warps.split(",")],
                     [int(x) for x in a.ranks.split(",")])
    if not a.skip_commit:
        commit_table(shapes, a.context)


if __name__ == "__main__":
    main()
