"""Per-kernel time breakdown of one decode step (GPU only), to see where the step time goes.

    python3 -m lab.gpu_profile [--paths fast,standard] [--batches 1,4,8,64] [--context 1024]

Builds K3-mini (mini, bf16) once, captures each path's decode step (a CUDA-graph replay), runs
it under torch.profiler and prints, per (path, batch), the step time and the top kernels by
total time per step with their launch counts. Writes JSON to $OUT/profile.json when OUT is set.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from fastpath.engine import create_engine
from optimized_model.k3.fast import dispatch
from fastpath.measure import time_calls


def kernel_table(prof, steps: int) -> list[dict]:
    agg: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            name = re.sub(r"\s+", " ", ev.name)[:90]
            agg[name][0] += ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
            agg[name][1] += 1
    rows = [{"kernel": k, "us_per_step": v[0] / steps, "launches_per_step": v[1] / steps} for k, v in agg.items()]
    return sorted(rows, key=lambda r: -r["us_per_step"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--paths", default="fast,standard")
    ap.add_argument("--batches", default="1,4,8,64")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--top", type=int, default=14)
    args = ap.parse_args()
    engine = create_engine("embedded", config="mini", device="cuda", dtype="bfloat16")
    out = []
    for path in args.paths.split(","):
        model = engine.load(path, additional_config=dispatch.switch_config())
        for b in [int(x) for x in args.batches.split(",")]:
            step = model.decode_step(b, args.context)
            for _ in range(3):
                step()
            torch.cuda.synchronize()
            step_us = time_calls(step, 20) * 1e6
            steps = 5
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(steps):
                    step()
                torch.cuda.synchronize()
            table = kernel_table(prof, steps)
            busy = sum(r["us_per_step"] for r in table)
            launches = sum(r["launches_per_step"] for r in table)
            out.append({"path": path, "batch": b, "context": args.context, "step_us": step_us,
                        "kernel_busy_us": busy, "launches": launches, "kernels": table})
            print(f"\n== {path} batch {b} ctx {args.context}: step {step_us:.0f} us, kernels busy "
                  f"{busy:.0f} us, {launches:.0f} launches/step")
            for r in table[: args.top]:
                print(f"  {r['us_per_step']:8.1f} us  x{r['launches_per_step']:5.1f}  {r['kernel']}")
        model.close()
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "profile.json"), "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
