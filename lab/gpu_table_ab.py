"""Whole-step A/B of tuning-table variants on the GPU (the fast step as the bench runs it).

    python3 -m lab.gpu_table_ab --batches 64 --context 1024 \\
        --variant 'down_main={"moe_schedule": {"latent_down": "main"}}' \\
        --variant 'router_w4={"moe_router": {"num_warps": 4}}'
    python3 -m lab.gpu_table_ab --batches 2,64 --like nvidia_h200

A variant is NAME=JSON: {kernel: {field: value}}, applied to the bucket that serves the timed
batch (the table's other buckets are untouched). The table as checked in is the baseline.
``--like TABLE`` (a file stem under the tuning folder, e.g. nvidia_h200) adds, per batch, that
table's settings as variants: kernel by kernel where its bucket differs, then all at once
(``sweep_util.variants_like``).
Per batch, each setting's whole step (CUDA graph, fused sampler) is captured once and all are
timed in interleaved rounds (the order reversed every other round; median of the rounds,
``fastpath.measure.time_calls`` over back-to-back replays): a kernel that is faster alone can be
slower inside the step, beside the other streams. Prints ms per step and the ratio to the
baseline, and whether the variant's first step gives the baseline's logits (bit-identical, or
the largest difference); writes $OUT/table_ab.json. The data for the table; nothing here
changes it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch

from fastpath.measure import parse_variant, patched, stopwatch_log, time_calls
from lab.sweep_util import max_finite_diff, variants_like
from optimized_model.k3.fast import dispatch, tuning
from optimized_model.k3.model import K3Model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="64")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--variant", action="append", default=[], help="NAME=JSON (repeatable)")
    ap.add_argument("--like", help="another tuning table's file stem (e.g. nvidia_h200): its settings as variants")
    args = ap.parse_args()
    given = [("table", {})] + [parse_variant(v) for v in args.variant]
    log = stopwatch_log()
    table = tuning.table_for("cuda")
    other = None
    if args.like:
        path = tuning.TABLE_DIR / f"{args.like}.json"
        if not path.is_file():
            stems = ", ".join(sorted(p.stem for p in tuning.TABLE_DIR.glob("*.json")))
            raise SystemExit(f"--like {args.like}: no table {path.name} in {tuning.TABLE_DIR}; one of: {stems}")
        other = tuning.load_table(path)
    model = K3Model.build("mini", device="cuda", dtype=torch.bfloat16, seed=0)
    fd = dispatch.build_fast_decoder(model, lambda b, cap: model.new_state(b, cap))
    rows = []
    for B in [int(b) for b in args.batches.split(",")]:
        variants = given + (variants_like(table, other, B) if other else [])
        steps, first = {}, {}
        for name, patch in variants:
            try:
                with patched(table, patch, B):
                    steps[name] = fd.decode_step(B, args.context)
                    # the first replay starts from the same random state for every variant: its
                    # logits show whether the variant computes the same step (launch-order
                    # variants must be bit-identical; tile variants differ by rounding)
                    steps[name]()
                    torch.cuda.synchronize()
                first[name] = fd.buffers(B).logits.clone()
                time_calls(steps[name], 3)
            except Exception as exc:  # one broken variant must not lose the others
                log(f"B={B} {name}: error {type(exc).__name__}: {exc}")
        times: dict[str, list[float]] = {n: [] for n in steps}
        names = list(steps)
        for r in range(args.rounds):
            for name in (names if r % 2 == 0 else names[::-1]):
                times[name].append(time_calls(steps[name], args.replays) * 1e3)
        med = {n: statistics.median(t) for n, t in times.items()}
        for name in names:
            ratio = med[name] / med["table"] if "table" in med else float("nan")
            same = diff = None
            verdict = "not compared (a first step failed)"
            if "table" in first and name in first:
                ref, got = first["table"], first[name]
                same = bool(torch.equal(ref, got))
                diff = max_finite_diff(ref, got)
                verdict = "bit-identical" if same else f"max diff {diff:.3g}"
            log(f"B={B:3d} ctx {args.context} {name:18s} {med[name]:.3f} ms  vs table {ratio:.3f}  "
                f"first-step logits {verdict}")
            rows.append(dict(batch=B, context=args.context, variant=name, patch=dict(variants)[name],
                             ms=med[name], vs_table=ratio, rounds_ms=times[name],
                             logits_identical=same, logits_max_diff=diff))
        del steps
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    with open(os.path.join(os.environ.get("OUT", "."), "table_ab.json"), "w") as fh:
        json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), fh, indent=1)


if __name__ == "__main__":
    main()
