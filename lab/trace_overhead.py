"""Micro-benchmark: per-call cost of fastpath.trace.engaged() (near-free when idle).

    python3 -m lab.trace_overhead [--number N] [--repeat R]

Prints ns per call (best of R timeit repeats) for: an empty function call (the floor),
engaged() with no recorder, engaged() with a recorder open, and engaged() inside a capture.
A benchmark, not a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import timeit

from rich.console import Console
from rich.table import Table

from fastpath import trace


def _empty(component, variant, **shape):
    return None


def _ns_per_call(stmt, number: int, repeat: int, setup=None) -> float:
    if setup:
        setup()
    best = min(timeit.repeat(stmt, number=number, repeat=repeat))
    return best / number * 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--number", type=int, default=200_000, help="calls per timing")
    ap.add_argument("--repeat", type=int, default=5, help="timings; the best is reported")
    args = ap.parse_args()
    n, r = args.number, args.repeat

    rows = [("empty function call", _ns_per_call(lambda: _empty("kda_decode", "fused", batch=1), n, r))]
    rows.append(("engaged(), no recorder", _ns_per_call(lambda: trace.engaged("kda_decode", "fused", batch=1), n, r)))
    with trace.recording() as rec:
        # Clear between repeats so the list growth stays bounded.
        rows.append(("engaged(), recorder open",
                     _ns_per_call(lambda: trace.engaged("kda_decode", "fused", batch=1), n, r, setup=rec.clear)))
        rec.clear()
    with trace.capturing("bench-graph"):
        rows.append(("engaged(), capturing (no recorder)",
                     _ns_per_call(lambda: trace.engaged("kda_decode", "fused", batch=1), n, r)))
    trace.forget("bench-graph")

    floor = rows[0][1]
    table = Table(title=f"fastpath.trace.engaged() cost (best of {r} x {n} calls)")
    table.add_column("case")
    table.add_column("ns/call", justify="right")
    table.add_column("vs empty call", justify="right")
    for name, ns in rows:
        table.add_row(name, f"{ns:.1f}", f"{ns / floor:.2f}x")
    Console().print(table)


if __name__ == "__main__":
    main()
