"""The fast verify step with ``kda_verify`` in several variants, on the GPU: for each (context,
batch, draft) one step is captured per variant (FORM, or FORM@BLOCK_V to fix the V tile: set in
``kda_verify`` before its capture) and the steps are timed in interleaved rounds of graph replays
(A B C, then C B A; ``fastpath.measure.time_calls``), with the MBU against the copy bandwidth
measured in the run. A lab comparison, not the perf suite: the median over rounds, no CI.

    python3 -m lab.gpu_kda_verify_ab --shapes 1x3,1x7,8x3,8x7,16x3 --context 1024,8192 \
        --variants serial,chunk,chunk@32,chunk@64
"""

from __future__ import annotations

import argparse
import statistics
import time

from fastpath.engine import create_engine
from fastpath.measure import copy_bandwidth, time_calls
from optimized_model.k3.fast.kernels import kda_verify as KV


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1x3,1x7,8x3,8x7,16x3", help="BATCHxDRAFT, comma list")
    ap.add_argument("--context", default="1024", help="context lengths, comma list")
    ap.add_argument("--variants", default="serial,chunk", help="FORM or FORM@BLOCK_V, comma list (the first is the base)")
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=4, help="rounds of every variant forth and back")
    ap.add_argument("--config", default="mini")
    ap.add_argument("--device", default="cuda", help="cpu: a check of the script on the tiny config")
    a = ap.parse_args()
    t0 = time.monotonic()
    dtype = "bfloat16" if a.device == "cuda" else "float32"
    engine = create_engine("embedded", config=a.config, device=a.device, dtype=dtype, standard_compile="off")
    fast = engine.load("fast", additional_config={"decode_backend": "latency_specialized"})
    traffic_model = engine.load("standard_eager")
    bw = copy_bandwidth(a.device)
    variants = a.variants.split(",")
    default_form, default_tile = KV.FORM, KV.choose_block_v
    print(f"copy bandwidth {bw / 1e12:.3f} TB/s; set-up {time.monotonic() - t0:.0f} s", flush=True)
    print("| ctx | batch | draft | " + " | ".join(f"{v} ms (MBU)" for v in variants) + " | best |")
    print("|---:|---:|---:|" + "---:|" * len(variants) + "---|")
    for context, shape in ((int(c), s) for c in a.context.split(",") for s in a.shapes.split(",")):
        b, d = (int(x) for x in shape.split("x"))
        steps = {}
        for v in variants:
            form, _, tile = v.partition("@")
            KV.FORM = form
            KV.choose_block_v = (lambda *_a, _t=int(tile): _t) if tile else default_tile
            steps[v] = fast.decode_step(b, context, d)
            for _ in range(3):
                steps[v]()
        KV.FORM, KV.choose_block_v = default_form, default_tile
        ms = {v: [] for v in variants}
        for _ in range(a.rounds):
            for v in variants + variants[::-1]:
                ms[v].append(1e3 * time_calls(steps[v], a.replays, a.device))
        med = {v: statistics.median(x) for v, x in ms.items()}
        traffic = traffic_model.step_traffic(b, context, d)["total"]
        cells = [f"{med[v]:.3f} ({100 * traffic / (med[v] / 1e3) / bw:.1f} %)" for v in variants]
        print(f"| {context} | {b} | {d} | " + " | ".join(cells) + f" | {min(med, key=med.get)} |", flush=True)
        del steps


if __name__ == "__main__":
    main()
