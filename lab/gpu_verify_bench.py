"""First look at verify steps on the H200: the step time of ``decode_step(batch, context, draft)``
on the fast path, the compiled standard path (``standard_compile_verify``: its verify step
compiled too; the build time, compile included, is printed) and the eager one (CUDA-graph
replays where the path captures),
with the bytes the step must move (``step_traffic``) and the MBU against the copy bandwidth
measured in the same run. Not the perf suite (no A/B rounds, no CI): a quick figure per shape.

    python3 -m lab.gpu_verify_bench --shapes 1x0,1x3,1x7,8x3,8x7,16x3 --context 1024,8192
"""

from __future__ import annotations

import argparse
import statistics
import time

from fastpath.engine import create_engine
from fastpath.measure import copy_bandwidth, time_calls


def step_ms(step, replays: int, rounds: int, device: str) -> float:
    for _ in range(3):
        step()
    return 1e3 * statistics.median(time_calls(step, replays, device) for _ in range(rounds))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1x0,1x3,1x7,8x3,8x7,16x3", help="BATCHxDRAFT, comma list")
    ap.add_argument("--context", default="1024", help="context lengths, comma list")
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--config", default="mini")
    ap.add_argument("--device", default="cuda", help="cpu: a check of the script on the tiny config")
    ap.add_argument("--compile", default=None,
                    help="the compiled standard step's mode (off: none; default: 'default' on cuda, off on cpu, "
                         "where Inductor cannot trace the MoE's bf16-only grouped matmul in fp32)")
    ap.add_argument("--max-verify-rows", type=int, default=0,
                    help="time fast verify steps past the spec's max_verify_rows (the buffers cover 64)")
    a = ap.parse_args()
    if a.compile is None:
        a.compile = "default" if a.device == "cuda" else "off"
    if a.max_verify_rows:
        from lab.sweep_util import allow_verify_rows

        allow_verify_rows(a.max_verify_rows)
    t0 = time.monotonic()
    dtype = "bfloat16" if a.device == "cuda" else "float32"
    engine = create_engine("embedded", config=a.config, device=a.device, dtype=dtype,
                           standard_compile=a.compile, standard_compile_verify=a.compile != "off")
    models = {"fast": engine.load("fast", additional_config={"decode_backend": "latency_specialized"}),
              "standard_eager": engine.load("standard_eager")}
    if a.compile != "off":
        models["standard"] = engine.load("standard")
    bw = copy_bandwidth(a.device)
    print(f"copy bandwidth {bw / 1e12:.3f} TB/s; set-up {time.monotonic() - t0:.0f} s", flush=True)
    print("| ctx | batch | draft | rows | compiled std ms (build s) | eager std ms | fast ms | fast / best std | "
          "bytes/step (GB) | fast MBU |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for context, shape in ((int(c), s) for c in a.context.split(",") for s in a.shapes.split(",")):
        b, d = (int(x) for x in shape.split("x"))
        ms, built = {}, {}
        for p, m in models.items():
            t = time.monotonic()
            step = m.decode_step(b, context, d)
            built[p] = time.monotonic() - t
            ms[p] = step_ms(step, a.replays, a.rounds, a.device)
        traffic = models["standard_eager"].step_traffic(b, context, d)["total"]
        mbu = traffic / (ms["fast"] / 1e3) / bw
        best = min(v for p, v in ms.items() if p != "fast")
        compiled = f"{ms['standard']:.3f} ({built['standard']:.0f})" if "standard" in ms else "-"
        print(f"| {context} | {b} | {d} | {b * (d + 1)} | {compiled} | {ms['standard_eager']:.3f} | {ms['fast']:.3f} | "
              f"{best / ms['fast']:.2f}x | {traffic / 1e9:.3f} | {100 * mbu:.1f} % |", flush=True)


if __name__ == "__main__":
    main()
