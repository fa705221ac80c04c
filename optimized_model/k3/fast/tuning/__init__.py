"""Per-device tuning tables of the fast kernels, as data (fast/tuning/*.json).

Every table is checked when it is loaded (``schema.check_table``: known kernels and fields,
allowed values, buckets in order): a bad value fails here, naming file, key and what is
allowed, never in the middle of a decode step.

A table file holds ``{"device": NAME, "kernels": {KERNEL: {"buckets": [ENTRY, ...]}}}``: ENTRY
has ``max_batch`` (the bucket covers batch sizes up to it, buckets in increasing order) and the
kernel's parameters (block sizes, ``SPLIT_K`` — an int or "auto" —, ``num_warps``, ``variant``
such as "triton" or "cute") and optionally ``overrides``: a list of ``{N, K, epilogue, ...}``
entries — the call sites whose shape matches every shape key given (N, K, epilogue) take the
entry's other parameters instead (measured per call site: e.g. one SwiGLU projection wants
another tile than the plain projection of the same N x K). Device names: ``torch.cuda.get_device_name()`` (e.g.
"NVIDIA H200") or ``"cpu-interpreter"`` (Triton's interpreter on CPU). An unknown GPU uses the
"default" table. No code branches per device: add a JSON file.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

from .schema import L2_SITES, TableError, check_table  # noqa: F401  (L2_SITES: the plan reads it here)

TABLE_DIR = Path(__file__).resolve().parent
CPU_DEVICE = "cpu-interpreter"


def load_table(path: Path) -> dict:
    """One table file, parsed and checked (``TableError`` naming file, key and allowed values)."""
    try:
        data = json.loads(Path(path).read_text())
    except json.JSONDecodeError as exc:
        raise TableError(f"tuning table {Path(path).name}: not JSON ({exc}); fix the file") from None
    check_table(data, Path(path).name)
    return data


@lru_cache(maxsize=None)
def tables() -> dict[str, dict]:
    out = {}
    for p in sorted(TABLE_DIR.glob("*.json")):
        data = load_table(p)
        out[data["device"]] = data
    return out


def device_name(device: Any = None) -> str:
    """The tuning-table key of ``device`` (a torch device or string)."""
    dev = str(device) if device is not None else "cuda"
    interp = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    if interp or not dev.startswith("cuda"):
        return CPU_DEVICE
    import torch

    if not torch.cuda.is_available():
        return CPU_DEVICE
    return torch.cuda.get_device_name(torch.device(dev))


def table_for(device: Any = None) -> dict:
    t = tables()
    name = device_name(device)
    if name in t:
        return t[name]
    return t["default"] if name != CPU_DEVICE else t[CPU_DEVICE]


def entry(kernel: str, batch: int, device: Any = None) -> dict:
    """The raw bucket entry for ``kernel`` at ``batch`` (the smallest bucket ≥ batch; the
    largest bucket beyond)."""
    tab = table_for(device)
    try:
        buckets = tab["kernels"][kernel]["buckets"]
    except KeyError as exc:
        raise KeyError(f"tuning table {tab['device']!r} has no kernel {kernel!r}") from exc
    for b in buckets:
        if batch <= b["max_batch"]:
            return dict(b)
    return dict(buckets[-1])


def batch_boundaries(device: Any = None, kernel: str | None = None) -> list[int]:
    """The batch sizes where the table in use changes a choice (of ``kernel``, or of any):
    every bucket's ``max_batch`` but each kernel's last (a batch past it still takes that
    bucket). Tests run both sides of each (b and b + 1: the next bucket, usually a partial
    tile there)."""
    kernels = table_for(device)["kernels"]
    chosen = [kernels[kernel]] if kernel else list(kernels.values())
    return sorted({b["max_batch"] for k in chosen for b in k["buckets"][:-1]})


SHAPE_KEYS = ("N", "K", "epilogue")


def lookup(kernel: str, batch: int, device: Any = None, **shape: Any) -> dict:
    """Resolved parameters: like ``entry`` with the matching ``overrides`` applied (in order)
    and ``SPLIT_K: "auto"`` turned into an int from the shape (enough programs to fill the GPU:
    ``target_programs``, at least ``min_k_iters`` BLOCK_K steps per split)."""
    cfg = entry(kernel, batch, device)
    for over in cfg.pop("overrides", []):
        keys = [k for k in SHAPE_KEYS if k in over]
        if keys and all(shape.get(k) == over[k] for k in keys):
            cfg.update({k: v for k, v in over.items() if k not in SHAPE_KEYS and k != "note"})
    return resolve_split(cfg, batch, shape.get("N"), shape.get("K"))


def resolve_split(cfg: dict, batch: int, N: int | None, K: int | None) -> dict:
    """A copy of ``cfg`` with ``SPLIT_K: "auto"`` turned into an int (1 when the shape is not
    known); also used by the GPU sweeps on their candidate configs."""
    cfg = dict(cfg)
    if cfg.get("SPLIT_K") == "auto":
        if N is None or K is None:
            cfg["SPLIT_K"] = 1
        else:
            bm = int(cfg.get("BLOCK_M") or 1)
            progs = -(-N // int(cfg["BLOCK_N"])) * -(-batch // bm)
            target = int(cfg.get("target_programs", 1))
            want = max(1, -(-target // progs))
            k_steps = -(-K // int(cfg["BLOCK_K"]))
            cap = max(1, k_steps // int(cfg.get("min_k_iters", 1)))
            cfg["SPLIT_K"] = int(min(want, cap, int(cfg.get("max_split", 16))))
    return cfg
