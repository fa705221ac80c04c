"""Progress from inside a long case (parity over context buckets, evals over samples).

A suite calls ``note("bucket 3/7: context 4096")``; while `fastpath verify` runs the suite, the
line goes to the terminal (or the non-TTY log of a batch job) at once, prefixed with the time
since the case started, and into the suite's log. Outside verify it is a no-op, so suites
run under plain pytest unchanged.
"""

from __future__ import annotations

import contextlib
import time
from typing import Callable, Iterator

_sink: Callable[[str], None] | None = None


def note(text: str) -> None:
    """Report progress inside the running case (cheap; a no-op outside `fastpath verify`)."""
    if _sink is not None:
        _sink(str(text))


@contextlib.contextmanager
def reporting_to(write: Callable[[str], None]) -> Iterator[None]:
    """Send notes to ``write`` (one formatted line each) while the block runs."""
    global _sink
    started = time.monotonic()
    previous = _sink

    def sink(text: str) -> None:
        write(f"    … {time.monotonic() - started:6.1f}s  {text[:300]}")

    _sink = sink
    try:
        yield
    finally:
        _sink = previous
