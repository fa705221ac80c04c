"""Dispatch trace: proof that a fast path fired.

Model code calls ``engaged(component, variant, **shape)`` when a fast component runs and
``refused(component, reason, **shape)`` when it falls back to the standard path. The harness
opens a ``recording()`` and reads the events back.

CUDA graphs: kernels launched while a graph is being captured do not run; they run on every
replay. So events reported inside ``capturing(key)`` are bound to that key (whether or not a
recorder is open at capture time), and ``replayed(key)`` re-emits them as executions to the
open recorders.

Layers: events reported inside ``with layer(i):`` name layer ``i`` (a ``layer`` entry in their
shape, unless the call names one itself), so a kernel wrapper that knows nothing of layers is
still attributed to the layer of the model's loop that called it; the coverage gate checks every
layer a component serves (``fastpath.engine.Component.layers``).

Worker processes: in a distributed engine (vLLM's engine core and its workers) the model runs
in a process where the harness has no recorder. Model code there calls ``open_sink_from_env(rank)``
once (at model construction); when the harness set ``FASTPATH_TRACE_SINK`` (a directory) for its
engine, every event is then appended to ``<dir>/rank<R>-pid<P>.jsonl``, tagged with the rank, and
the harness reads them back into its recorders (``fastpath.trace_sink.SinkReader``).

This module is imported by model code, so it has no dependencies beyond the standard library and
costs three global truthiness tests per call (recorders, captures, sink) when nothing is recording.
"""

from __future__ import annotations

import json
import os
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Hashable, Iterator
from contextlib import contextmanager

__all__ = [
    "Event",
    "Recorder",
    "engaged",
    "refused",
    "recording",
    "capturing",
    "replayed",
    "forget",
    "bound_events",
    "is_recording",
    "layer",
    "open_sink_from_env",
    "paused",
    "SINK_ENV",
]

SINK_ENV = "FASTPATH_TRACE_SINK"
# Set (only) in the harness's own process, so an engine that runs its model in process does not
# also write the sink (its events already reach the open recorders).
HARNESS_PID_ENV = "FASTPATH_TRACE_HARNESS_PID"

# Open recorders; a plain list so the hot-path test is a single truthiness check.
_recorders: list["Recorder"] = []
# Graph key -> events bound during its capture (kept after the recorder closes: replays
# of a graph captured during warm-up must still count).
_graphs: dict[Hashable, list["Event"]] = {}
# Capture nesting is per thread: a capture on one thread must not swallow another's events.
_local = threading.local()
_lock = threading.Lock()
# Number of captures open on any thread: lets the idle path skip the thread-local lookup.
_open_captures = 0
# Worker sink: (open file, rank) once open_sink_from_env() found a directory; else None.
_sink: "tuple[Any, int] | None" = None


@dataclass(frozen=True)
class Event:
    """One dispatch decision.

    kind: "engaged" or "refused". detail: the variant (engaged) or the reason (refused).
    phase: "eager" (ran now), "capture" (bound to a graph, did not run) or "replay"
    (a graph replay executed it). graph: the graph key for capture/replay events.
    """

    kind: str
    component: str
    detail: str
    shape: tuple[tuple[str, Any], ...] = ()
    phase: str = "eager"
    graph: Hashable | None = None
    rank: int | None = None  # the worker process that reported it (None: this process)

    @property
    def executed(self) -> bool:
        return self.phase != "capture"

    def shape_dict(self) -> dict[str, Any]:
        return dict(self.shape)

    @property
    def layer(self) -> Any:
        """The layer the event names (None: a whole-step event)."""
        for k, v in self.shape:
            if k == "layer":
                return v
        return None

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "component": self.component,
            "detail": self.detail,
            "shape": self.shape_dict(),
            "phase": self.phase,
            "graph": None if self.graph is None else repr(self.graph),
            "rank": self.rank,
        }


@dataclass(eq=False)  # identity: recording() removes THIS recorder, not an equal nested one
class Recorder:
    """Collects events while open. Read ``events`` or the summaries below."""

    events: list[Event] = field(default_factory=list)

    def executed(self) -> list[Event]:
        return [e for e in self.events if e.executed]

    def counts(self) -> Counter:
        """(kind, component, detail) -> number of executions."""
        return Counter((e.kind, e.component, e.detail) for e in self.executed())

    def engaged(self, component: str | None = None) -> list[Event]:
        return [e for e in self.executed() if e.kind == "engaged" and component in (None, e.component)]

    def refused(self, component: str | None = None) -> list[Event]:
        return [e for e in self.executed() if e.kind == "refused" and component in (None, e.component)]

    def engaged_layers(self, component: str) -> set[Any]:
        """The layers at which ``component`` engaged (events naming no layer are left out)."""
        return {e.layer for e in self.engaged(component) if e.layer is not None}

    def components(self) -> dict[str, set[str]]:
        """component -> the set of variants it ran ("refused:<reason>" for fallbacks)."""
        out: dict[str, set[str]] = {}
        for e in self.executed():
            label = e.detail if e.kind == "engaged" else f"refused:{e.detail}"
            out.setdefault(e.component, set()).add(label)
        return out

    def clear(self) -> None:
        self.events.clear()


def _capture_key() -> Hashable | None:
    return getattr(_local, "capture", None)


def _with_layer(shape: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    current = getattr(_local, "layer", None)
    if current is not None and "layer" not in shape:
        shape["layer"] = current
    return tuple(sorted(shape.items()))


def _emit(event: Event) -> None:
    key = _capture_key()
    if key is not None:
        event = Event(event.kind, event.component, event.detail, event.shape, "capture", key)
        with _lock:
            _graphs.setdefault(key, []).append(event)
    for r in list(_recorders):
        r.events.append(event)
    if _sink is not None and not _recorders:
        _write_sink(event)


def _write_sink(event: Event) -> None:
    fh, rank = _sink
    row = event.as_dict()
    row["rank"] = rank
    with _lock:  # one line per write: the reader never sees half an event
        fh.write(json.dumps(row, default=str) + "\n")
        fh.flush()


def open_sink_from_env(rank: int = 0) -> bool:
    """In a worker process of a distributed engine: write this process's events to the sink
    directory the harness named in ``FASTPATH_TRACE_SINK`` (no-op if unset, or if this is the
    harness's own process). Returns whether a sink is open."""
    global _sink
    directory = os.environ.get(SINK_ENV)
    if not directory or os.environ.get(HARNESS_PID_ENV) == str(os.getpid()):
        return False
    if _sink is not None:
        return True
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"rank{int(rank)}-pid{os.getpid()}.jsonl")
    _sink = (open(path, "a", encoding="utf-8"), int(rank))
    return True


def engaged(component: str, variant: str, **shape: Any) -> None:
    """The fast path ran ``component`` with ``variant`` on ``shape``."""
    if not _recorders and not _open_captures and _sink is None:
        return
    _emit(Event("engaged", component, variant, _with_layer(shape)))


def refused(component: str, reason: str, **shape: Any) -> None:
    """The fast path declined ``component`` (the standard path ran instead) for ``reason``."""
    if not _recorders and not _open_captures and _sink is None:
        return
    _emit(Event("refused", component, reason, _with_layer(shape)))


def is_recording() -> bool:
    return bool(_recorders)


class layer:
    """``with layer(i):`` events reported in the block name layer ``i`` (per thread; nests,
    the innermost wins). A class, not a generator, so entering it costs two attribute writes."""

    __slots__ = ("index", "_outer")

    def __init__(self, index: int) -> None:
        self.index = index
        self._outer = None

    def __enter__(self) -> "layer":
        self._outer = getattr(_local, "layer", None)
        _local.layer = self.index
        return self

    def __exit__(self, *exc: Any) -> None:
        _local.layer = self._outer


@contextmanager
def recording() -> Iterator[Recorder]:
    """Open a recorder for the duration of the block."""
    rec = Recorder()
    _recorders.append(rec)
    try:
        yield rec
    finally:
        _recorders.remove(rec)


@contextmanager
def paused() -> Iterator[None]:
    """Events reported in this block reach no open recorder (a harness's own set-up work, e.g.
    the prefills an engine runs before the decode step a suite records)."""
    with _lock:
        saved = list(_recorders)
        _recorders.clear()
    try:
        yield
    finally:
        with _lock:
            _recorders[:0] = saved


@contextmanager
def capturing(key: Hashable) -> Iterator[None]:
    """Bind events reported in this block to graph ``key`` (replacing an earlier capture)."""
    if _capture_key() is not None:
        raise RuntimeError(f"nested graph capture: {key!r} inside {_capture_key()!r}")
    global _open_captures
    with _lock:
        _graphs[key] = []
        _open_captures += 1
    _local.capture = key
    try:
        yield
    finally:
        _local.capture = None
        with _lock:
            _open_captures -= 1


def replayed(key: Hashable, times: int = 1) -> None:
    """Graph ``key`` was replayed ``times`` times: its bound events executed again."""
    if not _recorders and _sink is None:
        return
    bound = _graphs.get(key)
    if bound is None:
        raise KeyError(f"graph {key!r} was never captured under fastpath.trace.capturing()")
    for _ in range(times):
        for e in bound:
            _emit(Event(e.kind, e.component, e.detail, e.shape, "replay", key))


def bound_events(key: Hashable) -> list[Event]:
    """The events bound to graph ``key`` at capture (empty if none)."""
    return list(_graphs.get(key, ()))


def forget(key: Hashable) -> None:
    """Drop a graph's bound events (call when the graph is destroyed)."""
    with _lock:
        _graphs.pop(key, None)
