"""fastpath.perf_timing: the ABBA order is what the timer saw, rounds come from the right
segments, the CPU timer times real calls, the roofline arithmetic and the summary table."""

from __future__ import annotations

import pytest

from fastpath import perf_timing as pt


class RecordingTimer:
    """A timer that records which step it timed and how many calls; A takes 2 s, B 1 s per
    call, plus a drift of 0.1 s per segment timed so far."""

    def __init__(self, a, b):
        self.names = {id(a): "A", id(b): "B"}
        self.seen: list[tuple[str, int]] = []

    def __call__(self, step, calls):
        for _ in range(calls):
            step()
        name = self.names[id(step)]
        t = (2.0 if name == "A" else 1.0) + 0.1 * len(self.seen)
        self.seen.append((name, calls))
        return t


def test_abba_order_is_what_the_timer_saw_and_drift_cancels():
    calls = {"A": 0, "B": 0}

    def a():
        calls["A"] += 1

    def b():
        calls["B"] += 1

    timer = RecordingTimer(a, b)
    r = pt.abba_rounds(a, b, rounds=3, replays=5, timer=timer)
    assert [n for n, _ in timer.seen] == list("ABBA" * 3) and r.order() == "ABBA" * 3
    assert all(c == 5 for _, c in timer.seen) and calls == {"A": 30, "B": 30}
    # round k: segments 4k..4k+3; A = mean of the 1st and 4th, B = mean of the 2nd and 3rd:
    # the linear drift is the same for both, so the ratio of the round means is drift-free
    for k in range(3):
        d = 0.1 * (4 * k + 1.5)
        assert r.a[k] == pytest.approx(2.0 + d) and r.b[k] == pytest.approx(1.0 + d)
        assert r.a[k] - r.b[k] == pytest.approx(1.0)
    # more rounds append (a straddling case's extra batch)
    pt.abba_rounds(a, b, rounds=1, replays=5, timer=timer, into=r)
    assert len(r.a) == len(r.b) == 4 and r.order() == "ABBA" * 4


def test_bad_round_counts_are_refused():
    with pytest.raises(ValueError, match="must be >= 1"):
        pt.abba_rounds(lambda: None, lambda: None, rounds=0, replays=1, timer=lambda s, n: 1.0)


def test_cpu_timer_measures_real_work():
    import time

    timer = pt.segment_timer("cpu")
    slow = timer(lambda: time.sleep(0.01), 2)
    fast = timer(lambda: None, 2)
    assert 0.009 < slow < 0.5 and fast < slow


def test_roofline_arithmetic():
    r = pt.roofline({"total": 4e9}, bandwidth=4e12, step_s=2e-3)
    assert r["min_step_s"] == pytest.approx(1e-3) and r["mbu"] == pytest.approx(0.5)
    with pytest.raises(ValueError):
        pt.roofline({"total": 1}, bandwidth=0, step_s=1)


def test_summary_table_has_one_block_per_context():
    cases = [dict(batch=b, context=c, std_tok_s=100.0 * b, fast_tok_s=150.0 * b, speedup=1.5, ci_low=1.4,
                  ci_high=1.6, mbu=0.8 if b == 1 else None, outcome="pass") for b in (2, 1) for c in (64, 16)]
    text = pt.summary_table(cases)
    assert text.index("### context 16") < text.index("### context 64")
    block = text.split("### context 16")[1].split("###")[0]
    rows = [line for line in block.splitlines() if line.startswith("| ") and "batch" not in line]
    assert rows[0].startswith("| 1 |") and "1.50x [1.40, 1.60]" in rows[0] and "80 %" in rows[0]
    assert rows[1].startswith("| 2 |") and "–" in rows[1]


def test_tokens_at_a_draft_length_count_the_acceptance_length():
    # a verify step at draft 7 with a synthetic AL of 6 emits 6 tokens per sequence
    assert pt.output_tokens(4, 6.0) == 24 and pt.output_tokens(1, 1.0) == 1
    assert pt.tokens_per_s(4, 6.0, 0.5) == pytest.approx(48.0)
    assert pt.tokens_per_s(4, 1.0, 0.5) == pytest.approx(8.0)  # draft 0: one token per sequence
    assert pt.time_per_output_token(0.012, 6.0) == pytest.approx(0.002)
    with pytest.raises(ValueError, match="acceptance length 0.5 < 1"):
        pt.output_tokens(1, 0.5)


def test_draft_cases_get_their_own_synthetic_table():
    base = dict(context=16, std_tok_s=100.0, fast_tok_s=150.0, speedup=1.5, ci_low=1.4, ci_high=1.6, outcome="pass")
    cases = [dict(base, batch=1, draft=0, acceptance_length=1.0, tpot_ms=6.7),
             dict(base, batch=1, draft=7, acceptance_length=6.0, tpot_ms=2.1, fast_tok_s=480.0),
             dict(base, batch=2, draft=3, acceptance_length=3.5, tpot_ms=None)]
    text = pt.summary_table(cases)
    main = text.split("### draft lengths")[0]
    assert [line for line in main.splitlines() if line.startswith("| 1 |")] and "| 2 |" not in main  # draft 0 only
    drafts = text.split("### draft lengths, context 16")[1]
    assert "SYNTHETIC acceptance length" in text.split("\n")[[i for i, line in enumerate(text.split("\n"))
                                                              if "draft lengths" in line][0]]
    rows = [line for line in drafts.splitlines() if line.startswith("| ") and "batch" not in line]
    assert rows[0].startswith("| 1 | 0 | 1 |") and "6.7" in rows[0]
    assert rows[1].startswith("| 1 | 7 | 6 synthetic |") and "480" in rows[1] and "2.1" in rows[1]
    assert rows[2].startswith("| 2 | 3 | 3.5 synthetic |") and "–" in rows[2]
    assert "### draft lengths" not in pt.summary_table([cases[0]])  # no draft case: as before
