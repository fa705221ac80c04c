"""The harness's side of the worker trace sink (``fastpath.trace.open_sink_from_env``).

An engine whose model runs in other processes (vLLM's engine core and its workers, one per
rank) gives them a sink directory through ``FASTPATH_TRACE_SINK``; each worker appends its
events there as JSON lines tagged with its rank. ``SinkReader.drain()`` reads what was added
since the last call and re-emits it into this process's open recorders, so a suite sees a
worker's engaged / refused events exactly as it sees an in-process engine's.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from fastpath import trace


class SinkReader:
    """Reads a sink directory incrementally (per-file offsets; only whole lines)."""

    def __init__(self, directory: str | os.PathLike | None = None):
        self.directory = Path(directory or tempfile.mkdtemp(prefix="fastpath-trace-"))
        self.directory.mkdir(parents=True, exist_ok=True)
        self._offsets: dict[Path, int] = {}

    def env(self) -> dict[str, str]:
        """The variables a worker process needs to write to this sink."""
        return {trace.SINK_ENV: str(self.directory), trace.HARNESS_PID_ENV: str(os.getpid())}

    def read_new(self) -> list[trace.Event]:
        events: list[trace.Event] = []
        for path in sorted(self.directory.glob("rank*-pid*.jsonl")):
            start = self._offsets.get(path, 0)
            with open(path, "rb") as fh:
                fh.seek(start)
                data = fh.read()
            end = data.rfind(b"\n") + 1  # a line still being written waits for the next drain
            self._offsets[path] = start + end
            for line in data[:end].splitlines():
                if line.strip():
                    events.append(_event(json.loads(line)))
        return events

    def drain(self) -> list[trace.Event]:
        """Read the new events and append them to every open recorder; returns them."""
        events = self.read_new()
        for rec in list(trace._recorders):
            rec.events.extend(events)
        return events


def _event(row: dict) -> trace.Event:
    return trace.Event(row["kind"], row["component"], row["detail"],
                       tuple(sorted((row.get("shape") or {}).items())), row.get("phase", "eager"),
                       row.get("graph"), row.get("rank"))
