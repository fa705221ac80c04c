"""Measuring helpers of the lab tools (lab/): copy bandwidth, CUDA-event and CUDA-graph timing
of a callable, a stopwatch log, and tuning-table patches.

torch is imported inside the functions that need it (the harness is importable without it),
and nothing here knows the subject: a tuning table is passed in as the dict it is.
GPU-only functions raise ``RuntimeError`` with a one-line cause where no CUDA device is present.
"""

from __future__ import annotations

import contextlib
import copy
import json
import time
from typing import Callable, Iterator


# ------------------------------------------------------------------------------ logging
def stopwatch_log(t0: float | None = None) -> Callable[[str], None]:
    """A print that prefixes the seconds since ``t0`` (default: now) and flushes (logs read live)."""
    start = time.time() if t0 is None else t0

    def log(msg: str) -> None:
        print(f"[{time.time() - start:6.1f}s] {msg}", flush=True)

    return log


# ------------------------------------------------------------------------------ timing
def require_cuda(what: str) -> None:
    """Raise a one-line RuntimeError naming ``what`` when there is no CUDA device."""
    try:
        import torch
    except ImportError:
        raise RuntimeError(f"{what} needs torch with CUDA; torch is not installed") from None
    if not torch.cuda.is_available():
        raise RuntimeError(f"{what} needs a CUDA GPU; torch.cuda.is_available() is False here")


def time_calls(fn: Callable[[], object], n: int, device: str = "cuda") -> float:
    """Seconds per call of ``fn`` over ``n`` back-to-back calls: CUDA events around them on
    ``cuda``, the wall clock on ``cpu``."""
    if device != "cuda":
        t = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t) / n
    require_cuda("time_calls(device='cuda')")
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / n


def graph_time(fn: Callable[[], object], calls: int = 20, replays: int = 3, warmup: int = 3,
               eager_fallback: bool = False) -> float:
    """Seconds per call of ``fn`` (a few kernel launches): ``calls`` calls captured in one CUDA
    graph (no Python launch overhead in the figure), median over ``replays`` replays. With
    ``eager_fallback`` a capture that fails is timed as ``calls`` eager calls instead (and
    says so)."""
    require_cuda("graph_time")
    import statistics

    import torch

    side = torch.cuda.Stream()  # warm up off the capture stream, as torch's capture docs ask
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
        run = graph.replay
    except Exception as exc:
        if not eager_fallback:
            raise
        print(f"graph capture failed, timing eagerly: {exc!r}"[:240], flush=True)
        torch.cuda.synchronize()

        def run():
            for _ in range(calls):
                fn()
    run()
    torch.cuda.synchronize()
    return statistics.median(time_calls(run, 1) for _ in range(replays)) / calls


def copy_bandwidth(device: str = "cuda", nbytes: int | None = None, rounds: int = 5) -> float:
    """Bytes/s of a device-to-device copy, read + write bytes counted (median of ``rounds``
    timings of 3 copies): the roofline of every MBU / "% of copy bandwidth" figure, measured in
    the same run. ``nbytes`` per buffer: 2 GiB on cuda (far beyond L2), 256 MiB on cpu."""
    import statistics

    if device == "cuda":
        require_cuda("copy_bandwidth(device='cuda')")
    import torch

    nbytes = nbytes or ((2 << 30) if device == "cuda" else (256 << 20))
    src = torch.empty(nbytes // 2, dtype=torch.float16, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    dst.copy_(src)
    reps = 3 if device == "cuda" else 1
    times = [time_calls(lambda: dst.copy_(src), reps, device) for _ in range(rounds)]
    del src, dst
    if device == "cuda":
        torch.cuda.empty_cache()
    return 2 * nbytes / statistics.median(times)


# ------------------------------------------------------------------------------ table patches
def parse_patch(text: str, what: str = "--variant") -> dict:
    """A table patch {kernel: {field: value}} from JSON text (SystemExit names the problem)."""
    try:
        patch = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SystemExit(f"{what}: not JSON ({exc}): {text!r}") from None
    if not isinstance(patch, dict) or not all(isinstance(v, dict) for v in patch.values()):
        raise SystemExit(f"{what}: JSON must be {{kernel: {{field: value}}}}, got {text!r}")
    return patch


def parse_variant(text: str) -> tuple[str, dict]:
    """NAME=JSON → (name, patch)."""
    name, sep, body = text.partition("=")
    if not sep or not name:
        raise SystemExit(f"--variant {text!r}: expected NAME=JSON, e.g. 'w4={{\"moe_router\": {{\"num_warps\": 4}}}}'")
    return name, parse_patch(body, f"--variant {name}")


def _kernel(table: dict, kernel: str) -> dict:
    if kernel not in table["kernels"]:
        raise SystemExit(f"the patch names kernel {kernel!r}, not in the table {table.get('device')!r}")
    return table["kernels"][kernel]


def serving_bucket(table: dict, kernel: str, batch: int) -> dict:
    """The bucket of ``table`` that serves ``batch`` for ``kernel``, as the tuning lookup chooses
    it: the first with max_batch >= batch, else the last."""
    buckets = _kernel(table, kernel)["buckets"]
    return next((b for b in buckets if batch <= b["max_batch"]), buckets[-1])


def apply_patch(table: dict, base: dict, patch: dict, batch: int) -> None:
    """Reset ``table``'s kernels to ``base``, then patch the buckets serving ``batch`` (the
    table's other buckets are untouched)."""
    table["kernels"] = copy.deepcopy(base)
    for kernel, fields in patch.items():
        serving_bucket(table, kernel, batch).update(fields)


@contextlib.contextmanager
def patched(table: dict, patch: dict, batch: int) -> Iterator[dict]:
    """``table`` with ``patch`` on the buckets serving ``batch`` inside the block, its kernels
    as they were after it (a variant's step must be captured inside the block)."""
    base = copy.deepcopy(table["kernels"])
    try:
        apply_patch(table, base, patch, batch)
        yield table
    finally:
        table["kernels"] = base


def patch_every_bucket(table: dict, patch: dict) -> None:
    """Apply ``patch`` to every bucket of the kernels it names (in place)."""
    for kernel, fields in patch.items():
        for bucket in _kernel(table, kernel)["buckets"]:
            bucket.update(fields)
