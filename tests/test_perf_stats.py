"""Perf statistics (fastpath.stats: judge_speedup, sequential_speedup, control_alarm) on
synthetic timings: the false-pass rate of a true 1.00x, a clear win, a noisy near-tie.

Synthetic rounds are made as the runner makes them (fastpath.perf_timing): four segments in
A B B A order, each a per-step time; a round's time of a path is the mean of its two segments.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from fastpath import stats

NOMINAL = (1 - 0.95) / 2  # one-sided: a 95 % CI's lower bound above a true 1.0


def simulate(rng, speedup: float, noise: float, *, walk: float = 0.0, slope: float = 0.0):
    """A ``measure(n)`` callable: n more ABBA rounds of a standard step (time 1) and a fast step
    (time 1 / speedup), each segment with lognormal noise ``noise``, under a clock drift that is
    a random walk (``walk`` per segment) plus a linear trend (``slope`` per segment)."""
    state = {"level": 1.0, "segment": 0}

    def measure(n: int):
        std, fast = [], []
        for _ in range(n):
            seg = []
            for _ in range(4):  # A B B A
                state["level"] *= math.exp(rng.normal(0.0, walk)) if walk else 1.0
                drift = state["level"] * (1.0 + slope * state["segment"])
                state["segment"] += 1
                seg.append(drift * math.exp(rng.normal(0.0, noise)))
            std.append((seg[0] + seg[3]) / 2)
            fast.append((seg[1] + seg[2]) / 2 / speedup)
        return std, fast

    return measure


def false_pass_rate(runs: int, *, noise: float, walk: float, slope: float, rounds: int = 10) -> float:
    rng = np.random.default_rng(20261201)
    passed = 0
    for k in range(runs):
        v = stats.sequential_speedup(simulate(rng, 1.0, noise, walk=walk, slope=slope), rounds=rounds,
                                     max_extra_batches=1, min_speedup=1.0, n_resamples=1000, seed=k)
        passed += v.passed
    return passed / runs


@pytest.mark.parametrize("noise, walk, slope", [(0.02, 0.0, 0.0), (0.02, 0.01, 0.002)],
                         ids=["steady", "drifting"])
def test_true_tie_passes_at_most_at_the_nominal_rate(noise, walk, slope):
    runs = 300
    rate = false_pass_rate(runs, noise=noise, walk=walk, slope=slope)
    # nominal 2.5 % plus 2.33 binomial standard errors at this many runs (one-sided 1 %)
    assert rate <= NOMINAL + 2.33 * math.sqrt(NOMINAL * (1 - NOMINAL) / runs), rate


def test_a_planted_bias_is_caught_by_the_same_rate_check():
    # the check above must be able to fail: a method judging with a 50 % CI passes a tie often
    rng = np.random.default_rng(5)
    passed = 0
    for k in range(200):
        s, f = simulate(rng, 1.0, 0.02)(10)
        passed += stats.judge_speedup(s, f, confidence=0.5, n_resamples=500, seed=k).passed
    assert passed / 200 > NOMINAL + 2.33 * math.sqrt(NOMINAL * (1 - NOMINAL) / 200)


def test_clear_win_with_low_noise_passes():
    v = stats.sequential_speedup(simulate(np.random.default_rng(1), 1.10, 0.01, slope=0.001), rounds=10,
                                 max_extra_batches=1, min_speedup=1.0)
    assert v.outcome == "pass" and v.passed and v.looks == 1
    assert v.ci_low > 1.0 and v.ci_low <= v.speedup <= v.ci_high
    assert v.speedup == pytest.approx(1.10, rel=0.02)


def test_small_win_with_high_noise_is_inconclusive_not_passed():
    calls = []
    measure = simulate(np.random.default_rng(3), 1.02, 0.08)

    def counted(n):
        calls.append(n)
        return measure(n)

    v = stats.sequential_speedup(counted, rounds=10, max_extra_batches=1, min_speedup=1.0)
    assert v.outcome == "inconclusive" and not v.passed
    assert v.ci_low <= 1.0 < v.ci_high
    # straddling: exactly one more batch of rounds, then no more (fixed before measuring)
    assert calls == [10, 10] and v.rounds == 20 and v.looks == 2


def test_clear_loss_fails_at_the_first_look():
    v = stats.sequential_speedup(simulate(np.random.default_rng(2), 0.8, 0.01), rounds=10, max_extra_batches=2)
    assert v.outcome == "fail" and v.looks == 1 and v.ci_high <= 1.0


def test_min_speedup_threshold_is_applied():
    s, f = simulate(np.random.default_rng(4), 1.10, 0.005)(10)
    assert stats.judge_speedup(s, f, min_speedup=1.0).passed
    assert stats.judge_speedup(s, f, min_speedup=1.3).outcome == "fail"


def test_look_confidence_splits_the_error_over_the_looks():
    assert stats.look_confidence(0.95, 0) == pytest.approx(0.95)
    assert stats.look_confidence(0.95, 1) == pytest.approx(0.975)
    assert stats.look_confidence(0.95, 4) == pytest.approx(0.99)
    with pytest.raises(ValueError, match="confidence"):
        stats.look_confidence(1.0, 1)
    with pytest.raises(ValueError, match="max_extra_batches"):
        stats.look_confidence(0.95, -1)


def test_measure_returning_the_wrong_count_is_an_error():
    with pytest.raises(ValueError, match="returned 3 standard"):
        stats.sequential_speedup(lambda n: ([1.0] * 3, [1.0] * 3), rounds=4)


def test_control_alarm_only_beyond_its_stricter_level():
    rng = np.random.default_rng(9)
    quiet = [stats.control_alarm(*simulate(rng, 1.0, 0.02, walk=0.01)(10), n_resamples=1000, seed=k)["alarm"]
             for k in range(100)]
    assert sum(quiet) <= 2  # 99.9 % CIs: an honest control almost never rings
    a, b = simulate(rng, 1.05, 0.005)(10)  # a real 5 % difference between the "same" step
    loud = stats.control_alarm(a, b)
    assert loud["alarm"] and loud["ci_low"] > 1.0
    assert not stats.control_alarm(a, b, tolerance=0.1)["alarm"]
