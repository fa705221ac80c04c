"""Timeline of one fast decode step on the GPU: every kernel in launch order with its stream,
grid and duration, and the idle gaps between kernels on the main stream (GPU only).

    python3 -m lab.gpu_step_timeline [--batches 1,64] [--context 1024] [--path fast] \
        [--drafts 0,3] [--patch '{"l2_prefetch": {"kda_o": 1.0}}']

Where the step time goes that no per-kernel sum shows: a step of ~100 short kernels can lose
a large share of its time between kernels (launch latency inside the graph, ramp-up and tail of
each kernel). Prints per batch: step wall time, busy time per stream, total main-stream gap, the
kernels in order (µs, grid), and writes $OUT/timeline.json when OUT is set. ``--drafts`` gives
each batch verify steps too (draft d: a step of batch × (d + 1) rows). ``--patch`` applies
a tuning-table patch {kernel: {field: value}} to the bucket serving each step's rows (batch ×
(draft + 1): a verify step looks its row-wise kernels up at that many rows; as gpu_table_ab.py's
variants do for decode), so a patch of a verify step reaches the GEMV bucket it runs.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile

from fastpath.engine import create_engine
from fastpath.measure import parse_patch, patched
from lab.sweep_util import allow_verify_rows
from optimized_model.k3.fast import dispatch, tuning


def kernels_of(trace_path: str) -> list[dict]:
    with open(trace_path) as fh:
        events = json.load(fh)["traceEvents"]
    ks = [e for e in events if e.get("cat") == "kernel"]
    ks.sort(key=lambda e: e["ts"])
    return [{"name": e["name"][:60], "ts": float(e["ts"]), "dur": float(e["dur"]),
             "stream": e.get("args", {}).get("stream"), "grid": e.get("args", {}).get("grid")} for e in ks]


def one_step(ks: list[dict], n_steps: int) -> list[dict]:
    """The last of ``n_steps`` steps: a graph replay launches the same kernels every step, so its
    last len(ks) / n_steps launches; else (a count that does not divide) after the n_steps - 1
    largest gaps (steps are separated by a host sync), which a long gap inside a step fools
    (session 31: walls of 184-192 launches, or 20, for steps of 96)."""
    if n_steps == 1 or len(ks) < 2:
        return ks
    if len(ks) % n_steps == 0:
        return ks[-(len(ks) // n_steps):]
    gaps = sorted(range(1, len(ks)), key=lambda i: ks[i]["ts"] - ks[i - 1]["ts"], reverse=True)[: n_steps - 1]
    return ks[max(gaps):]


def per_name(ks: list[dict], n_steps: int) -> list[tuple[str, float, float]]:
    """(kernel name, µs per step, launches per step) over all ``n_steps`` profiled steps, largest
    first: does not depend on finding a step's boundaries."""
    tot: dict = {}
    for k in ks:
        t = tot.setdefault(k["name"], [0.0, 0])
        t[0] += k["dur"]
        t[1] += 1
    return sorted(((nm, us / n_steps, c / n_steps) for nm, (us, c) in tot.items()), key=lambda r: -r[1])


def analyse(step: list[dict]) -> dict:
    t0 = step[0]["ts"]
    end = max(k["ts"] + k["dur"] for k in step)
    streams: dict = {}
    for k in step:
        streams.setdefault(k["stream"], []).append(k)
    main = max(streams, key=lambda s: len(streams[s]))
    gap = 0.0
    mk = streams[main]
    for a, b in zip(mk, mk[1:]):
        gap += max(0.0, b["ts"] - (a["ts"] + a["dur"]))
    return {"wall_us": end - t0, "launches": len(step), "main_stream": main,
            "busy_us": {str(s): sum(k["dur"] for k in v) for s, v in streams.items()},
            "main_gap_us": gap, "kernels": [dict(k, ts=k["ts"] - t0) for k in step]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--path", default="fast")
    ap.add_argument("--drafts", default="0", help="draft lengths, comma list (0: a decode step)")
    ap.add_argument("--max-verify-rows", type=int, default=0,
                    help="profile verify steps past the spec's max_verify_rows (the buffers cover 64)")
    ap.add_argument("--patch", default="{}", help="JSON {kernel: {field: value}} for the bucket of each step's rows")
    args = ap.parse_args()
    patch = parse_patch(args.patch, "--patch")
    if args.max_verify_rows:
        allow_verify_rows(args.max_verify_rows)
    table = tuning.table_for("cuda")
    engine = create_engine("embedded", config="mini", device="cuda", dtype="bfloat16")
    model = engine.load(args.path, additional_config=dispatch.switch_config())
    out = []
    shapes = [(int(b), int(d)) for b in args.batches.split(",") for d in args.drafts.split(",")]
    for b, d in shapes:
        with patched(table, patch, b * (d + 1)):  # the step is captured and replayed under the patch
            step = model.decode_step(b, args.context, d)
            for _ in range(5):
                step()
            torch.cuda.synchronize()
            n = 3
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(n):
                    step()
                    torch.cuda.synchronize()
        with tempfile.NamedTemporaryFile(suffix=".json") as tf:
            prof.export_chrome_trace(tf.name)
            ks = kernels_of(tf.name)
        res = analyse(one_step(ks, n))
        res["per_name"] = per_name(ks, n)
        res.update(batch=b, draft=d, context=args.context, path=args.path, patch=patch)
        out.append(res)
        print(f"\n== {args.path} batch {b} draft {d} ctx {args.context}: wall {res['wall_us']:.0f} us, "
              f"{res['launches']} launches, busy per stream {res['busy_us']}, "
              f"main-stream gaps {res['main_gap_us']:.0f} us")
        print(f"  per step by kernel (all {n} steps): {sum(r[1] for r in res['per_name']):.0f} us busy")
        for nm, us, c in res["per_name"][:14]:
            print(f"    {us:8.1f} us  x{c:5.1f}  {nm[:50]}")
        for k in res["kernels"]:
            side = "" if k["stream"] == res["main_stream"] else "  [side]"
            print(f"  {k['ts']:8.1f} {k['dur']:7.1f} us  {k['name'][:40]:40s} grid={k['grid']}{side}")
    model.close()
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "timeline.json"), "w") as f:
            json.dump(out, f)


if __name__ == "__main__":
    main()
