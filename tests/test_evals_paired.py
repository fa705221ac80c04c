"""The paired non-inferiority gate: a planted 20-point drop at n = 200 fails; runs that differ
only by noise-level flips keep the false-alarm rate at the nominal level; at the margin itself a
fast path passes at most at the nominal rate (the test's size)."""

from __future__ import annotations

import numpy as np
import pytest

from fastpath.evals import paired

ALPHA = 0.05  # confidence 0.95, one-sided
N = 200
MARGIN = 0.05


def _flip(rng, x: np.ndarray, rate: float) -> np.ndarray:
    """x with each outcome flipped with probability ``rate`` (either way: noise, no drift)."""
    return np.where(rng.random(len(x)) < rate, 1.0 - x, x)


def test_a_planted_20_point_drop_at_n_200_fails_both_methods():
    rng = np.random.default_rng(1)
    std = (rng.random(N) < 0.6).astype(float)
    fast = std.copy()
    right = np.flatnonzero(std == 1)
    fast[rng.choice(right, 40, replace=False)] = 0.0  # 40 of 200 right answers lost: -20 points
    ex = paired.exact(std, fast, margin=MARGIN)
    assert ex["estimate"] == pytest.approx(-0.2) and not ex["passed"] and ex["ci_low"] < -0.15
    assert ex["p_value"] > ALPHA
    graded_std = rng.random(N)
    gr = paired.graded(graded_std, np.clip(graded_std - 0.2, 0, 1), margin=MARGIN,
                       n_resamples=2000)
    assert not gr["passed"] and gr["ci_low"] < -0.1


def test_identical_outputs_pass_with_a_zero_difference():
    std = np.array([1, 0, 1, 1, 0], dtype=float)
    assert paired.exact(std, std, margin=MARGIN) | {"b": 0, "c": 0} == paired.exact(std, std, margin=MARGIN)
    assert paired.exact(std, std, margin=MARGIN)["passed"]
    assert paired.graded(std * 0.5, std * 0.5, margin=MARGIN)["passed"]


def _exact_fails(rng, runs: int, flip: float, drop: float) -> float:
    fails = 0
    for _ in range(runs):
        std = (rng.random(N) < 0.5).astype(float)
        fast = _flip(rng, std, flip)
        if drop:  # a true difference: this many right answers lost besides the noise
            right = np.flatnonzero(fast == 1)
            fast[rng.choice(right, int(round(drop * N)), replace=False)] = 0.0
        fails += not paired.exact(std, fast, margin=MARGIN)["passed"]
    return fails / runs


def test_noise_only_runs_keep_the_false_alarm_rate_at_its_nominal_level():
    # noise-level flips: 2 % of the documents change their outcome either way between two runs
    # of correct paths (the standard path against itself re-batched shows this order of noise)
    rng = np.random.default_rng(7)
    runs = 1500
    rate = _exact_fails(rng, runs, flip=0.02, drop=0.0)
    assert rate <= ALPHA + 3 * np.sqrt(ALPHA * (1 - ALPHA) / runs), f"false-alarm rate {rate:.3f} > {ALPHA}"


def test_at_the_margin_a_fast_path_passes_at_most_at_the_nominal_rate():
    # a fast path exactly `margin` worse (plus the same noise): non-inferiority must be refused
    # in all but ~alpha of the runs, and not far below it (the exact bound is not useless)
    rng = np.random.default_rng(11)
    runs = 1500
    passes = 1.0 - _exact_fails(rng, runs, flip=0.02, drop=MARGIN)
    se = np.sqrt(ALPHA * (1 - ALPHA) / runs)
    assert passes <= ALPHA + 3 * se, f"false-pass rate {passes:.3f} > {ALPHA}"
    assert passes >= 0.2 * ALPHA, f"false-pass rate {passes:.4f}: the bound is far more conservative than its level"


def test_graded_noise_only_runs_keep_the_false_alarm_rate():
    rng = np.random.default_rng(3)
    runs, fails = 300, 0
    for _ in range(runs):
        std = rng.random(N)
        noisy = rng.random(N) < 0.05  # 5 % of the scores move by up to +-0.3, no drift
        fast = np.clip(std + noisy * rng.uniform(-0.3, 0.3, N), 0, 1)
        fails += not paired.graded(std, fast, margin=MARGIN, n_resamples=1000, seed=int(rng.integers(1 << 30)))["passed"]
    assert fails / runs <= ALPHA + 3 * np.sqrt(ALPHA * (1 - ALPHA) / runs)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="0/1"):
        paired.exact([0.5], [1.0], margin=MARGIN)
    with pytest.raises(ValueError, match="equal length"):
        paired.graded([0.5, 0.2], [1.0], margin=MARGIN)


def test_length_ratio_ci_separates_a_defect_from_chance():
    std = [320, 300, 280, 320, 310, 290]
    # every generation stopped at about a third: the CI lies below 0.5 (a defect)
    short = paired.length_ratio(std, [s // 3 for s in std], seed=1)
    assert short["ci_high"] < 0.5 and short["estimate"] == pytest.approx(1 / 3, abs=0.01)
    # one document ended early by chance (its first divergent token): the point ratio is far off,
    # the CI still reaches the bounds' interval
    chance = paired.length_ratio([320, 40, 320, 300], [320, 320, 60, 300], seed=1)
    assert chance["ci_low"] < 2.0 and chance["ci_high"] > 0.5
    same = paired.length_ratio(std, std)
    assert same["estimate"] == same["ci_low"] == same["ci_high"] == 1.0
    with pytest.raises(ValueError):
        paired.length_ratio([1, 2], [1])
