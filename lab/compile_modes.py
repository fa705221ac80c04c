"""Which torch.compile mode makes the fastest STANDARD decode step (the perf suite's baseline)?

    python3 -m lab.compile_modes                          # mini, cuda, bf16, batches 1,8,64, context 1024
    python3 -m lab.compile_modes --batches 1,64 --contexts 1024,32768 --modes default
    python3 -m lab.compile_modes --config tiny --device cpu --batches 1 --modes off --rounds 2 --replays 2

Candidates (each the runner's benchmark step ``decode_step``, as the perf suite times it):
``eager`` (the eager-in-graph step, = standard_eager), ``compile:MODE`` for each ``--modes`` entry
(``torch.compile(K3Model.decode_tensors, mode=MODE)``, automatic dynamic shapes, inside the CUDA graph; the
compile runs in the graph's warm-up and its time is the candidate's ``setup_s`` at its first
batch), and ``loop-moe`` (the expert loop instead of ``torch._grouped_mm``: it syncs with the
host, so it cannot be captured and is timed eagerly, for reference only). Each (candidate,
batch, context) step time is the median of ``--rounds`` segments of ``--replays`` calls (CUDA
events). Prints the table (step ms and tokens/s per candidate and shape, the fastest marked; again
after every candidate, the last one printed is the whole table) and writes
``$OUT/compile_modes.json`` (after every candidate too). Pin the fastest capturable mode as ``standard_compile`` in
the spec's ``[tiers.full] engine_options``; report the others once in docs/perf-notes.md.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time
from pathlib import Path

import torch

from fastpath.measure import stopwatch_log, time_calls


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _free(device: str) -> None:
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def time_candidate(model, name: str, batches: list[int], contexts: list[int], rounds: int, replays: int,
                   device: str, log) -> dict:
    from optimized_model.k3.runner import K3Runner

    graphs = device == "cuda"
    mode = name.split(":", 1)[1] if name.startswith("compile:") else None
    saved_backend = model.moe_backend
    if name == "loop-moe":
        model.moe_backend, graphs = "loop", False
    out: dict = {"candidate": name, "graphs": graphs, "shapes": {}}
    try:
        torch._dynamo.reset()  # every candidate compiles from scratch: its setup_s is its own
        runner = K3Runner(model, use_graphs=graphs, compile_mode=mode)
        for ctx in contexts:
            for b in batches:
                key = f"b{b}-c{ctx}"
                try:
                    t0 = time.perf_counter()
                    step = runner.decode_step(b, ctx)
                    step()
                    if device == "cuda":
                        torch.cuda.synchronize()
                    setup = time.perf_counter() - t0
                    for _ in range(3):
                        step()
                    times = [time_calls(step, replays, device) for _ in range(rounds)]
                    ms = 1e3 * statistics.median(times)
                    out["shapes"][key] = {"step_ms": ms, "tok_s": b / ms * 1e3, "setup_s": setup,
                                          "spread": (max(times) - min(times)) / statistics.median(times)}
                    log(f"{name:34s} {key:12s} {ms:8.3f} ms  {b / ms * 1e3:10.0f} tok/s  setup {setup:6.1f} s")
                    del step
                except Exception as exc:  # one shape failing must not hide the others
                    out["shapes"][key] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
                    log(f"{name:34s} {key:12s} FAILED {out['shapes'][key]['error']}")
                _free(device)
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"[:300]
        log(f"{name}: FAILED {out['error']}")
    finally:
        model.moe_backend = saved_backend
    return out


def table(results: list[dict], shapes: list[str]) -> str:
    best = {}
    for s in shapes:
        ok = [(r["shapes"][s]["step_ms"], r["candidate"]) for r in results
              if "step_ms" in r["shapes"].get(s, {}) and r["graphs"]]
        best[s] = min(ok)[1] if ok else None
    head = "| candidate | " + " | ".join(f"{s} ms (tok/s)" for s in shapes) + " | setup s (first shape) |"
    lines = [head, "|" + "---|" * (len(shapes) + 2)]
    for r in results:
        cells = []
        for s in shapes:
            x = r["shapes"].get(s, {})
            cells.append("error" if "step_ms" not in x else
                         f"{x['step_ms']:.3f} ({x['tok_s']:,.0f})" + (" *" if best[s] == r["candidate"] else ""))
        first = next(iter(r["shapes"].values()), {})
        label = r["candidate"] + ("" if r["graphs"] else " (eager, no graph)")
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {first.get('setup_s', float('nan')):.1f} |")
    lines.append("\n* fastest capturable candidate at that shape")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="mini")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--batches", type=_ints, default=[1, 8, 64])
    ap.add_argument("--contexts", type=_ints, default=[1024])
    ap.add_argument("--modes", default="default,max-autotune-no-cudagraphs",
                    help="torch.compile modes to try, comma-separated ('off' = none)")
    ap.add_argument("--no-loop", action="store_true", help="skip the loop-MoE reference")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--replays", type=int, default=30)
    args = ap.parse_args(argv)
    log = stopwatch_log()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("compile_modes: --device cuda needs a CUDA GPU (torch.cuda.is_available() is False); "
                         "use --config tiny --device cpu for a dry run")
    from optimized_model.k3.engine import _parse_dtype
    from optimized_model.k3.model import K3Model

    model = K3Model.build(args.config, device=args.device, dtype=_parse_dtype(args.dtype, args.device), seed=0)
    log(f"{args.config} on {args.device}: kda {model.kda_backend}, moe {model.moe_backend}, torch {torch.__version__}")
    candidates = ["eager"] + [f"compile:{m}" for m in args.modes.split(",") if m and m != "off"]
    if not args.no_loop and model.moe_backend == "grouped":
        candidates.append("loop-moe")
    out = Path(os.environ.get("OUT", "."))
    out.mkdir(parents=True, exist_ok=True)
    shapes = [f"b{b}-c{c}" for c in args.contexts for b in args.batches]
    results = []
    for c in candidates:  # the JSON and the table after every candidate: a timeout keeps what was timed
        results.append(time_candidate(model, c, args.batches, args.contexts, args.rounds, args.replays,
                                      args.device, log))
        (out / "compile_modes.json").write_text(json.dumps({"args": vars(args), "results": results,
                                                            "torch": torch.__version__}, indent=1))
        print(table(results, shapes), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
