"""Tuning-table variants of the fast path against the fp32 oracle (GPU only).

    python3 -m lab.gpu_oracle_ab --batches 1,2,4 --context 1024 --steps 8 \\
        --variant 'triton={"gemv": {"variant": "triton"}}' --variant 'cute={"gemv": {"variant": "cute"}}'

A speed A/B (gpu_table_ab.py) says which variant is faster; this says whether it computes as
well. Per batch: one random state at ``--context`` tokens and ``--steps`` random tokens; the fp32
oracle model (weights rounded to bf16, exact arithmetic) decodes them teacher-forced, and so
does the fast decoder under each variant (NAME=JSON patches of the batch's table bucket, as in
gpu_table_ab.py; none given: the table as checked in). Prints, per variant, max and mean
|logit difference| from the oracle, top-1 agreement with it and KL(oracle ‖ variant), then the
largest difference between the first two variants. ``--standard`` adds the standard path's
own row (the noise floor: bf16 vs the oracle) and each variant's top-1 agreement with it. A
screen before the full tier (random tokens, not generated text), not a replacement for its
parity suite.
"""

from __future__ import annotations

import argparse

import torch

from fastpath.measure import parse_variant, patched, stopwatch_log
from lab.sweep_util import compare_logits, decode_teacher_forced, teacher_forced_inputs
from optimized_model.k3.fast import dispatch, tuning
from optimized_model.k3.model import K3Model


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,2,4")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--variant", action="append", default=[], help="NAME=JSON (repeatable)")
    ap.add_argument("--standard", action="store_true", help="also decode on the standard path")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("gpu_oracle_ab: no CUDA device here; nothing to measure")
        return 2
    variants = [parse_variant(v) for v in args.variant] or [("table", {})]
    log = stopwatch_log()
    table = tuning.table_for("cuda")
    model = K3Model.build("mini", device="cuda", dtype=torch.bfloat16, seed=0)
    oracle = K3Model.build("mini", device="cuda", dtype=torch.float32, seed=0, oracle=True,
                           round_dtype=torch.bfloat16)
    fd = dispatch.build_fast_decoder(model, lambda b, cap: model.new_state(b, cap))
    for B in (int(b) for b in args.batches.split(",")):
        tokens, start = teacher_forced_inputs(model, B, args.context, args.steps)
        ref = decode_teacher_forced(oracle, tokens, start.to_dtype(torch.float32))
        out, std = {}, None
        if args.standard:
            std = decode_teacher_forced(model, tokens, start)
            m = compare_logits(std, ref)
            top2 = std.topk(2, dim=-1).values
            log(f"B={B} standard: top-1 tied with top-2 (equal {model.dtype} logits) at "
                f"{(top2[..., 0] == top2[..., 1]).float().mean().item():.4f} of positions; "
                f"oracle rounded to {model.dtype} vs standard top1 "
                f"{compare_logits(ref.to(model.dtype).float(), std)['top1']:.4f}")
            log(f"B={B} ctx {args.context} {'standard':10s} vs oracle: max|d| {m['max_diff']:.4f} "
                f"mean|d| {m['mean_diff']:.5f} top1 {m['top1']:.3f} KL {m['kl']:.2e}")
        for name, patch in variants:
            with patched(table, patch, B):
                out[name] = decode_teacher_forced(fd, tokens, start)
            m = compare_logits(out[name], ref)
            log(f"B={B} ctx {args.context} {name:10s} vs oracle: max|d| {m['max_diff']:.4f} "
                f"mean|d| {m['mean_diff']:.5f} top1 {m['top1']:.3f} KL {m['kl']:.2e} "
                f"({B * args.steps} positions)")
            if std is not None:
                vs = compare_logits(out[name], std)
                log(f"B={B} {name} vs standard: top1 {vs['top1']:.4f} KL(standard || {name}) {vs['kl']:.2e}")
                # the standard path's logits are bf16 products widened to fp32: round ours alike
                rd = compare_logits(out[name].to(model.dtype).float(), std)
                log(f"B={B} {name} rounded to {model.dtype} vs standard: top1 {rd['top1']:.4f}")
        if len(out) >= 2:
            (a, ya), (b, yb) = list(out.items())[:2]
            log(f"B={B} {b} vs {a}: max|d| {(yb - ya).abs().max().item():.4f} "
                f"top1 {(yb.argmax(-1) == ya.argmax(-1)).float().mean().item():.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
