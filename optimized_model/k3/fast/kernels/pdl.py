"""Programmatic dependent launch (PDL, sm_90+) for the kernels of one decode step.

A kernel launched with PDL may start while the kernel before it on the stream is still
finishing: its programs become resident as the previous kernel's last programs retire, so a
step of ~90 short kernels loses less to each kernel's ramp-up and tail. The contract, kept by
every fast kernel that takes ``PDL``:

* ``pdl_enter(PDL)`` — ``griddepcontrol.wait`` (blocks until every kernel this one depends on
  has completed and its writes are visible), then ``griddepcontrol.launch_dependents`` (the
  next kernel may launch once every program of this one got here). Released only after the
  wait, so when a kernel starts, everything upstream of its predecessor has completed.
* Before ``pdl_enter`` a kernel may only load what neither its predecessor nor a concurrent
  stream can be writing: weights (the GEMV's first W tile). It stores nothing before it, and
  what it computes must not depend on the mode: a kernel's PDL and non-PDL builds differ only
  by the two instructions (KDA decode once loaded its state early under PDL, and its arithmetic
  compiled differently — lab/gpu_pdl_check.py showed it; perf notes, run L).

Launches made inside ``scope(True)`` carry the PDL launch attribute (``launch_kwargs()``) and
compile the kernels with ``PDL=True`` (``enabled()``) — every launch passes both at once,
``**launch_args()``, so the two cannot disagree; outside it (the kernels suite, the CPU
interpreter) nothing changes. Where the step uses it is tuning-table data (``launch.pdl``:
"all", "outside_moe" or "off" per batch bucket; step_plan.StepPlan.pdl): on the H200 it
pays only at batch 1 outside the MoE layers, where the routed chain overlaps the shared expert's
stream (perf notes, run K). The CuTe GEMV keeps the same contract (``griddepcontrol`` in CuTe
DSL, kernels/cute_gemv.py). Torch ops and the sampler launch as usual (a kernel launched after
them waits for their completion).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

_enabled = False


@contextlib.contextmanager
def scope(on: bool) -> Iterator[None]:
    """Launches inside this block are programmatic dependent launches when ``on``."""
    global _enabled
    saved, _enabled = _enabled, bool(on)
    try:
        yield
    finally:
        _enabled = saved


def enabled() -> bool:
    """The value of the kernels' ``PDL`` constexpr for a launch made now."""
    return _enabled


def launch_kwargs() -> dict:
    """Extra launch options for a kernel launch made now."""
    return {"launch_pdl": True} if _enabled else {}


def launch_args() -> dict:
    """What a fast kernel's launch made now passes: its ``PDL`` constexpr and the launch option."""
    return {"PDL": _enabled, **launch_kwargs()}


@triton.jit
def pdl_enter(PDL: tl.constexpr):
    """Wait for the kernels this one depends on, then let the next kernel launch."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
