"""Check that programmatic dependent launch changes nothing but timing (GPU only).

    python3 -m lab.gpu_pdl_check --batches 1,8,64 --order all,off --steps 8 \
        [--patch '{"moe_schedule": {"shared_in": "separate"}}']

For each batch and each setting of the tuning table's ``launch.pdl`` (in ``--order``), the fast
decoder runs ``--steps`` decode steps from the same random state, as a CUDA graph and eagerly.
Every step's logits and the final state must be bit-identical across all these runs (PDL only
lets a kernel's programs start early; each waits for its inputs). Prints one line per run and
the number of runs that differ (0 expected) with the largest logit difference; a fault (illegal
address, ...) follows the name of the run that raised it. ``--patch`` JSON {kernel: {field:
value}} is applied to every bucket of those kernels first (to bisect a difference).
"""

from __future__ import annotations

import argparse
import sys

import torch

from fastpath.measure import parse_patch, patch_every_bucket
from lab.sweep_util import max_finite_diff
from optimized_model.k3.fast import dispatch, tuning
from optimized_model.k3.model import K3Model


def run(fd, model, B: int, steps: int, seed: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    cap = -(-(1024 + steps + 1) // 64) * 64  # room for every step
    state = model.random_state(B, 1024, cap, seed=seed)
    g = torch.Generator().manual_seed(seed)
    logits = []
    for _ in range(steps):
        tokens = torch.randint(0, model.cfg.n_real_tokens, (B,), generator=g)
        logits.append(fd.decode(tokens, state))
    torch.cuda.synchronize()
    return logits, [t.clone() for t in state.tensors()]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--order", default="all,off", help="launch.pdl settings in the order they run")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--patch", default="{}", help="JSON {kernel: {field: value}} for every bucket")
    args = ap.parse_args()
    table = tuning.table_for("cuda")
    patch_every_bucket(table, parse_patch(args.patch, "--patch"))
    launch = table["kernels"]["launch"]["buckets"]
    model = K3Model.build("mini", device="cuda", dtype=torch.bfloat16, seed=0)
    factory = lambda b, cap: model.new_state(b, cap)  # noqa: E731
    bad = 0
    for B in [int(b) for b in args.batches.split(",")]:
        results = {}
        for i, setting in enumerate(args.order.split(",")):
            for bucket in launch:
                bucket["pdl"] = setting
            for name, graphs in (("graph", True), ("eager", False)):
                # a fresh decoder per run: a graph decoder keys its graphs by the state's
                # addresses, and a new state may reuse the last one's blocks — its graph,
                # captured under the previous setting, would be replayed
                fd = dispatch.build_fast_decoder(model, factory, use_graphs=graphs)
                label = f"B={B} #{i + 1} pdl {setting} {name}"
                print(f"{label}: running", flush=True)
                results[label] = run(fd, model, B, args.steps, seed=B)
                del fd
                torch.cuda.empty_cache()
        ref_label, (ref_logits, ref_state) = next(iter(results.items()))
        for label, (logits, state) in results.items():
            same = all(torch.equal(a, b) for a, b in zip(ref_logits, logits)) and \
                all(torch.equal(a, b) for a, b in zip(ref_state, state))
            bad += not same
            diff = max(max_finite_diff(a, b) for a, b in zip(ref_logits, logits))
            print(f"{label}: {'bit-identical to' if same else f'DIFFERS (logits up to {diff:.3g}) from'} {ref_label}")
    print(f"pdl check: {bad} runs differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
