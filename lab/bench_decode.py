"""Decode benchmark for K3-mini: tokens/s, step time and MBU per batch size and
context length, for the standard path (and the fast path when it is available, with speedup).

    python3 -m lab.bench_decode                       # mini, cuda, bf16
    python3 -m lab.bench_decode --config tiny --device cpu --dtype float32 \
        --batches 1,2 --contexts 16,64 --rounds 2 --replays 3       # CPU smoke
    ... --json OUT.json

Method: each (path, batch, context) step comes from ``Model.decode_step`` (random-but-valid
state at ``context`` tokens; on GPU a CUDA-graph replay). Paths are timed in interleaved rounds
(A B B A ...); each round times ``--replays`` back-to-back calls with CUDA events (wall clock
on CPU); the step time is the median over rounds. MBU = bytes a step must move
(``config.bytes_per_step``: weights incl. the expected distinct experts, plus KDA/conv state
read+write and the MLA latent cache read) / step time / copy bandwidth, where the copy
bandwidth is measured in the same run (device-to-device copy of a 2 GiB buffer, read + write
bytes; 256 MiB on CPU).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

from fastpath.measure import copy_bandwidth, time_calls
from optimized_model.k3.config import bytes_per_step
from optimized_model.k3.fast import dispatch


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def bench(engine, paths: list[str], batches: list[int], contexts: list[int], rounds: int = 5,
          replays: int = 50, log=print) -> dict:
    info = engine.info()
    device = info["device"]
    dtype_bytes = {"bfloat16": 2, "float16": 2, "float32": 4}[info["dtype"]]
    bw = copy_bandwidth(device)
    log(f"copy bandwidth (read+write): {bw / 1e12:.3f} TB/s")
    models = {p: engine.load(p, additional_config=dispatch.switch_config()) for p in paths}
    cfg = engine.cfg
    rows = []
    for ctx in contexts:
        for b in batches:
            steps = {p: models[p].decode_step(b, ctx) for p in paths}
            for fn in steps.values():  # warm-up
                for _ in range(3):
                    fn()
            _sync(device)
            times: dict[str, list[float]] = {p: [] for p in paths}
            for r in range(rounds):
                order = paths if r % 2 == 0 else paths[::-1]
                for p in order:
                    times[p].append(time_calls(steps[p], replays, device))
            nbytes = bytes_per_step(cfg, b, ctx, dtype_bytes)
            med = {p: statistics.median(t) for p, t in times.items()}
            for p in paths:
                row = {
                    "path": p, "batch": b, "context": ctx, "step_ms": med[p] * 1e3,
                    "step_ms_min": min(times[p]) * 1e3, "step_ms_max": max(times[p]) * 1e3,
                    "tokens_per_s": b / med[p], "bytes_per_step": nbytes,
                    "achieved_TBps": nbytes / med[p] / 1e12, "mbu": nbytes / med[p] / bw,
                }
                if p != "standard" and "standard" in med:
                    row["speedup"] = med["standard"] / med[p]
                rows.append(row)
            log(" ".join(f"{p}: b{b} c{ctx} {med[p] * 1e3:.3f} ms" for p in paths))
            del steps
            if device == "cuda":
                torch.cuda.empty_cache()
    for m in models.values():
        m.close()
    return {"info": info, "copy_bandwidth_Bps": bw, "rounds": rounds, "replays": replays, "rows": rows}


def format_table(result: dict) -> str:
    has_speedup = any("speedup" in r for r in result["rows"])
    head = f"{'path':9s} {'batch':>5s} {'context':>7s} {'step ms':>9s} {'tok/s':>10s} {'GB/step':>8s} {'MBU':>6s}"
    if has_speedup:
        head += f" {'speedup':>8s}"
    lines = [f"copy bandwidth {result['copy_bandwidth_Bps'] / 1e12:.3f} TB/s (read+write), "
             f"{result['rounds']} rounds x {result['replays']} replays, median", head]
    for r in result["rows"]:
        line = (f"{r['path']:9s} {r['batch']:5d} {r['context']:7d} {r['step_ms']:9.3f} {r['tokens_per_s']:10.1f} "
                f"{r['bytes_per_step'] / 1e9:8.3f} {100 * r['mbu']:5.1f}%")
        if has_speedup:
            line += f" {r['speedup']:7.2f}x" if "speedup" in r else f" {'':>8s}"
        lines.append(line)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="mini")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batches", default="1,2,4,8,16,32,64")
    ap.add_argument("--contexts", default="1024,32768")
    ap.add_argument("--paths", default="auto", help="comma list of standard,fast or 'auto' (fast if available)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--replays", type=int, default=50)
    ap.add_argument("--json", default=None, help="write the full result as JSON here")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: 1 on cpu)")
    args = ap.parse_args(argv)
    if args.threads or args.device == "cpu":
        torch.set_num_threads(args.threads or 1)

    from optimized_model.k3.engine import EmbeddedEngine

    engine = EmbeddedEngine(config=args.config, device=args.device, dtype=args.dtype, seed=args.seed)
    if args.paths == "auto":
        ok, why = engine.fast_path_available()
        if ok and args.device == "cpu":
            ok, why = False, "on CPU the fast path runs in Triton's interpreter (not a performance path); pass --paths standard,fast to time it anyway"
        paths = ["standard", "fast"] if ok else ["standard"]
        if not ok:
            print(f"fast path not benchmarked: {why}", file=sys.stderr)
    else:
        paths = args.paths.split(",")
    result = bench(engine, paths, [int(x) for x in args.batches.split(",")],
                   [int(x) for x in args.contexts.split(",")], args.rounds, args.replays)
    result["argv"] = sys.argv
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2, default=str)
    print(format_table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
