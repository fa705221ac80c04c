"""Interleaved A/B rounds of decode steps and the roofline figures of the perf suite.

A round is four timed segments in A B B A order; a segment is ``replays`` back-to-back calls
of one path's step (a CUDA-graph replay each on GPU), timed by ``segment_timer``: CUDA events
around the calls on ``cuda``, the wall clock on ``cpu`` (fastpath.measure.time_calls). A
round's time of a path is the mean of its two segments (seconds per step), so a drift linear
over the round cancels; the statistics (fastpath.stats) take rounds as their unit.

The roofline: ``roofline(traffic, bandwidth, step_s)`` — the bytes a step must move (the
engine's ``Model.step_traffic``, counted from the real tensors), the copy bandwidth measured in
the same run, the minimum step time at that bandwidth and the MBU of the measured step.

Tokens: a decode step emits one token per sequence; at draft length K > 0 the timed step is one
verify step of K + 1 tokens per sequence, which emits (accepted + 1) of them: the spec's
synthetic acceptance length AL (declared before measuring), so tokens/s = batch x AL / step
time and time per output token = step time / AL (``output_tokens``, ``time_per_output_token``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from fastpath.measure import time_calls

Step = Callable[[], object]
Timer = Callable[[Step, int], float]  # (step, calls) -> seconds per call
ORDER = ("A", "B", "B", "A")


def segment_timer(device: str) -> Timer:
    """Seconds per call of ``calls`` back-to-back calls: CUDA events on cuda, wall clock on cpu.
    A step with a start state (``reset()``: a prompt case's real generation) is reset first,
    before the clock starts, so every segment decodes the same tokens."""
    where = "cuda" if device == "cuda" else "cpu"

    def timed(step: Step, calls: int) -> float:
        _reset(step)
        return time_calls(step, calls, where)

    return timed


def _reset(step: Step) -> None:
    reset = getattr(step, "reset", None)
    if reset is not None:
        reset()


@dataclass
class Rounds:
    """Per-round seconds per step of the two paths, and every segment in the order it was timed."""

    a: list[float] = field(default_factory=list)
    b: list[float] = field(default_factory=list)
    segments: list[tuple[str, float]] = field(default_factory=list)  # ("A" | "B", s/step) as timed

    def order(self) -> str:
        return "".join(p for p, _ in self.segments)


def warm_up(steps: list[Step], calls: int) -> None:
    """Untimed calls of each step (caches, clocks, lazy init): never part of a round."""
    for step in steps:
        _reset(step)
        for _ in range(calls):
            step()


def abba_rounds(a: Step, b: Step, rounds: int, replays: int, timer: Timer, into: Rounds | None = None) -> Rounds:
    """Time ``rounds`` rounds of A B B A segments of ``replays`` calls each (appended to ``into``)."""
    if rounds < 1 or replays < 1:
        raise ValueError(f"rounds ({rounds}) and replays ({replays}) must be >= 1")
    out = into if into is not None else Rounds()
    steps = {"A": a, "B": b}
    for _ in range(rounds):
        seen = {"A": [], "B": []}
        for path in ORDER:
            t = float(timer(steps[path], replays))
            seen[path].append(t)
            out.segments.append((path, t))
        out.a.append(sum(seen["A"]) / 2)
        out.b.append(sum(seen["B"]) / 2)
    return out


def single_rounds(step: Step, rounds: int, replays: int, timer: Timer) -> list[float]:
    """Seconds per step of ``rounds`` segments of one step (a path reported beside the gated pair)."""
    return [float(timer(step, replays)) for _ in range(rounds)]


def roofline(traffic: dict, bandwidth: float, step_s: float) -> dict:
    """Bytes/step, minimum step time at ``bandwidth`` (bytes/s) and MBU of a step of ``step_s`` s."""
    total = float(traffic["total"])
    if bandwidth <= 0 or step_s <= 0:
        raise ValueError(f"bandwidth ({bandwidth}) and step time ({step_s}) must be > 0")
    min_s = total / bandwidth
    return {"bytes_per_step": total, "bandwidth": float(bandwidth), "min_step_s": min_s,
            "step_s": float(step_s), "mbu": min_s / step_s}


def output_tokens(batch: int, acceptance_length: float) -> float:
    """Tokens one step emits: ``acceptance_length`` (1 at draft 0) per sequence."""
    if acceptance_length < 1:
        raise ValueError(f"acceptance length {acceptance_length} < 1: a step emits at least one token per sequence")
    return batch * acceptance_length


def tokens_per_s(batch: int, acceptance_length: float, step_s: float) -> float:
    return output_tokens(batch, acceptance_length) / step_s


def time_per_output_token(step_s: float, acceptance_length: float) -> float:
    """Seconds per emitted token of one sequence (the steps are shared by the batch)."""
    return step_s / output_tokens(1, acceptance_length)


def summary_table(cases: list[dict]) -> str:
    """The K3-style summary (markdown), one block per context: batch | standard tok/s | fast
    tok/s | speedup [CI] | MBU (fast) | MBU (standard) | outcome. ``cases``: dicts with batch,
    context, std_tok_s, fast_tok_s, speedup, ci_low, ci_high, outcome, and optionally mbu,
    mbu_standard (None when unknown), eager_tok_s and baseline (the gated one; "standard_eager":
    the speedup and MBU (standard) are against the eager step, marked "vs eager"). Cases with a
    ``draft`` > 0 go to the draft-length table below it (``draft_table``) instead."""
    lines: list[str] = []
    drafted = any(c.get("draft") for c in cases)
    cases_by_draft, cases = cases, [c for c in cases if not c.get("draft")]
    eager = any(c.get("eager_tok_s") is not None for c in cases)
    for context in sorted({c["context"] for c in cases}):
        lines += [f"### context {context}", ""]
        head = ["batch", "standard tok/s", "fast tok/s", "speedup [CI]", "MBU (fast)", "MBU (standard)", "outcome"]
        if eager:
            head.insert(2, "standard_eager tok/s")
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for c in sorted((c for c in cases if c["context"] == context), key=lambda c: c["batch"]):
            mbu = ["–" if c.get(k) is None else f"{100 * c[k]:.0f} %" for k in ("mbu", "mbu_standard")]
            cells = [str(c["batch"]), f"{c['std_tok_s']:,.0f}", f"{c['fast_tok_s']:,.0f}",
                     f"{c['speedup']:.2f}x [{c['ci_low']:.2f}, {c['ci_high']:.2f}]"
                     + (" vs eager" if c.get("baseline") == "standard_eager" else ""), *mbu, c["outcome"]]
            if eager:
                e = c.get("eager_tok_s")
                cells.insert(2, "–" if e is None else f"{e:,.0f}")
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    if drafted:
        lines.append(draft_table(cases_by_draft))
    return "\n".join(lines)


def draft_table(cases: list[dict]) -> str:
    """One block per context: batch x draft | acceptance length | standard and fast tok/s | fast
    ms per output token | speedup [CI] | outcome. ``cases`` as summary_table's plus ``draft``,
    ``acceptance_length`` and ``tpot_ms``; the tokens at draft > 0 are synthetic (the spec's
    acceptance length, not one measured here), and the header and each cell say so."""
    lines: list[str] = []
    for context in sorted({c["context"] for c in cases if c.get("draft")}):
        lines += [f"### draft lengths, context {context} (draft > 0: tokens from the SYNTHETIC acceptance length, "
                  "[perf] synthetic_acceptance_length)", ""]
        head = ["batch", "draft", "acceptance length", "standard tok/s", "fast tok/s", "fast ms/token",
                "speedup [CI]", "outcome"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for c in sorted((c for c in cases if c["context"] == context), key=lambda c: (c["batch"], c.get("draft", 0))):
            draft = int(c.get("draft") or 0)
            al = float(c.get("acceptance_length") or 1.0)
            tpot = c.get("tpot_ms")
            cells = [str(c["batch"]), str(draft), f"{al:g} synthetic" if draft else "1", f"{c['std_tok_s']:,.0f}",
                     f"{c['fast_tok_s']:,.0f}", "–" if tpot is None else f"{tpot:,.3g}",
                     f"{c['speedup']:.2f}x [{c['ci_low']:.2f}, {c['ci_high']:.2f}]", c["outcome"]]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)
