"""Statistics shared by the suites.

- ``g_test``: goodness of fit of observed category counts to expected probabilities (G-test,
  the log-likelihood ratio form of Pearson's chi-square), with low-count bins pooled so that
  every tested bin has an expected count >= ``min_expected``; ``g_test_pooled`` combines
  several independent tests (one per prompt) by summing G and degrees of freedom.
- ``paired_bootstrap_ci``: percentile CI of a paired statistic (default: mean difference).
- ``bootstrap_ratio_ci``: CI of median(a) / median(b) of timing samples (unpaired, or paired
  by perf round).
- perf: ``judge_speedup`` (one look at the gate), ``sequential_speedup`` (one more batch of
  rounds for a straddling case, up to a fixed maximum; then "inconclusive"), ``look_confidence``
  and ``control_alarm`` (the standard-vs-standard control).

Bootstraps are ``scipy.stats.bootstrap`` (percentile method).
- ``mcnemar_exact``: exact two-sided McNemar test for paired binary outcomes.
- ``kl_divergence`` / ``top1_agreement``: per-position comparisons of logits.

Everything is deterministic given its ``seed``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
from scipy import stats as _st

__all__ = [
    "GTestResult",
    "pool_low_count_bins",
    "g_test",
    "g_test_pooled",
    "paired_bootstrap_ci",
    "bootstrap_ratio_ci",
    "SpeedupJudgement",
    "look_confidence",
    "judge_speedup",
    "sequential_speedup",
    "control_alarm",
    "mcnemar_exact",
    "log_softmax",
    "kl_divergence",
    "top1_agreement",
]


@dataclass
class GTestResult:
    statistic: float  # G
    df: int
    p_value: float
    n: int  # total observations
    bins: int  # bins tested after pooling
    impossible: int = 0  # observations in categories of expected probability 0
    detail: dict = field(default_factory=dict)

    def passed(self, alpha: float) -> bool:
        return self.impossible == 0 and self.p_value >= alpha

    def as_dict(self) -> dict:
        return {
            "G": self.statistic,
            "df": self.df,
            "p_value": self.p_value,
            "n": self.n,
            "bins": self.bins,
            "impossible": self.impossible,
            **self.detail,
        }


def pool_low_count_bins(observed: Sequence[float], expected: Sequence[float], min_expected: float = 5.0):
    """Pool categories with expected count < ``min_expected``.

    Categories are sorted by expected count; the small ones are merged (smallest first) into
    one pooled bin until it reaches ``min_expected``. If the pooled bin is still too small after
    taking every small category, it is merged with the smallest remaining bin. Returns
    (observed, expected) arrays of the tested bins. Categories with expected 0 must be removed
    by the caller (they are a separate, exact check).
    """
    o = np.asarray(observed, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    if o.shape != e.shape:
        raise ValueError(f"observed and expected differ in shape: {o.shape} vs {e.shape}")
    order = np.argsort(e, kind="stable")
    o, e = o[order], e[order]
    small = e < min_expected
    big_o, big_e = list(o[~small]), list(e[~small])
    if small.any():
        po, pe = float(o[small].sum()), float(e[small].sum())
        if pe < min_expected and big_e:
            # merge with the smallest big bin (big_* are sorted ascending)
            po += big_o.pop(0)
            pe += big_e.pop(0)
        big_o.insert(0, po)
        big_e.insert(0, pe)
    return np.asarray(big_o), np.asarray(big_e)


def g_test(observed: Sequence[float], probs: Sequence[float], *, min_expected: float = 5.0) -> GTestResult:
    """G-test of ``observed`` counts against category probabilities ``probs``.

    ``probs`` need not sum exactly to 1 (renormalised). Observations in categories with
    probability 0 are counted as ``impossible`` (p_value forced to 0): a correct sampler never
    produces them, whatever the sample size.
    """
    o = np.asarray(observed, dtype=np.float64)
    p = np.asarray(probs, dtype=np.float64)
    if o.shape != p.shape:
        raise ValueError(f"observed and probs differ in shape: {o.shape} vs {p.shape}")
    if np.any(p < 0) or not np.all(np.isfinite(p)) or p.sum() <= 0:
        raise ValueError("probs must be finite, non-negative and not all zero")
    n = int(round(o.sum()))
    p = p / p.sum()
    zero = p == 0
    impossible = int(round(o[zero].sum()))
    o_pos, p_pos = o[~zero], p[~zero]
    e = p_pos * n
    po, pe = pool_low_count_bins(o_pos, e, min_expected)
    bins = len(po)
    df = max(bins - 1, 0)
    if n == 0 or df == 0:
        g, pv = 0.0, 1.0
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            terms = np.where(po > 0, po * np.log(po / pe), 0.0)
        g = float(2.0 * terms.sum())
        pv = float(_st.chi2.sf(g, df))
    if impossible:
        pv = 0.0
    return GTestResult(g, df, pv, n, bins, impossible)


def g_test_pooled(tests: Sequence[GTestResult]) -> GTestResult:
    """Combine independent G-tests (e.g. one per prompt): G and df add up."""
    g = float(sum(t.statistic for t in tests))
    df = int(sum(t.df for t in tests))
    n = int(sum(t.n for t in tests))
    bins = int(sum(t.bins for t in tests))
    imp = int(sum(t.impossible for t in tests))
    pv = float(_st.chi2.sf(g, df)) if df > 0 else 1.0
    if imp:
        pv = 0.0
    return GTestResult(g, df, pv, n, bins, imp, {"parts": len(tests)})


def _percentile_ci(data: tuple, statistic: Callable, *, paired: bool, n_resamples: int, confidence: float,
                   seed: int, vectorized: bool = True) -> tuple[float, float]:
    """(low, high) of a percentile bootstrap CI by ``scipy.stats.bootstrap``. Percentile, not BCa:
    BCa's jackknife is undefined for medians of a few tied values (it returns NaN)."""
    res = _st.bootstrap(data, statistic, n_resamples=n_resamples, paired=paired, vectorized=vectorized,
                        confidence_level=confidence, method="percentile", rng=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def paired_bootstrap_ci(
    a: Sequence[float],
    b: Sequence[float],
    *,
    statistic: Callable[[np.ndarray, np.ndarray], float] | None = None,
    n_resamples: int = 10_000,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[float, float, float]:
    """(estimate, low, high) of ``statistic(a, b)`` (default mean(a - b)), resampling pairs."""
    x = np.asarray(a, dtype=np.float64)
    y = np.asarray(b, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1 or len(x) == 0:
        raise ValueError("paired samples must be non-empty 1-D arrays of equal length")
    if statistic is None:
        est = float(np.mean(x - y))
        if len(x) == 1:
            return est, est, est
        lo, hi = _percentile_ci((x, y), lambda u, v, axis=-1: np.mean(u - v, axis=axis), paired=True,
                                n_resamples=n_resamples, confidence=confidence, seed=seed)
    else:
        est = float(statistic(x, y))
        if len(x) == 1:
            return est, est, est
        lo, hi = _percentile_ci((x, y), lambda u, v: float(statistic(u, v)), paired=True, vectorized=False,
                                n_resamples=n_resamples, confidence=confidence, seed=seed)
    return est, lo, hi


def _median_ratio(u: np.ndarray, v: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.median(u, axis=axis) / np.median(v, axis=axis)


def bootstrap_ratio_ci(
    a: Sequence[float],
    b: Sequence[float],
    *,
    n_resamples: int = 10_000,
    confidence: float = 0.95,
    seed: int = 0,
    paired: bool = False,
) -> tuple[float, float, float]:
    """(median(a)/median(b), low, high): percentile bootstrap (speedup = std/fast). ``paired``:
    a[i] and b[i] were measured together (one perf round) and are resampled together."""
    x = np.asarray(a, dtype=np.float64)
    y = np.asarray(b, dtype=np.float64)
    if len(x) == 0 or len(y) == 0:
        raise ValueError("empty sample")
    if paired and x.shape != y.shape:
        raise ValueError(f"paired samples differ in length: {len(x)} vs {len(y)}")
    est = float(np.median(x) / np.median(y))
    if len(x) == 1 and len(y) == 1:
        return est, est, est  # one round: no spread to resample
    lo, hi = _percentile_ci((x, y), _median_ratio, paired=paired, n_resamples=n_resamples,
                            confidence=confidence, seed=seed)
    return est, lo, hi


# ------------------------------------------------------------------------------ perf
# The unit of the perf statistics is the ROUND: one A B B A block of timed segments (each
# segment many CUDA-graph replays). Replays inside a segment are not independent samples (they
# share clocks, thermal state, neighbours), rounds nearly are; a round's time of a path is the
# mean of its two segments, so a linear drift over the round cancels between the paths.

@dataclass
class SpeedupJudgement:
    """The gate's view of one case: speedup = median(standard) / median(fast) over rounds."""

    outcome: str  # "pass" | "fail" | "inconclusive"
    speedup: float
    ci_low: float
    ci_high: float
    confidence: float  # of the CI judged (per look, see look_confidence)
    min_speedup: float
    rounds: int
    looks: int  # judgements made (1 + extra batches measured)

    @property
    def passed(self) -> bool:
        return self.outcome == "pass"

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("outcome", "speedup", "ci_low", "ci_high", "confidence",
                                              "min_speedup", "rounds", "looks")}


def look_confidence(confidence: float, max_extra_batches: int) -> float:
    """CI level of each look when a straddling case may be judged up to ``1 + max_extra_batches``
    times: the one-sided error (1 - confidence) / 2 is split evenly over the looks (Bonferroni),
    so the false-pass rate of a case over all its looks stays <= (1 - confidence) / 2."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence {confidence!r} must lie strictly between 0 and 1")
    if max_extra_batches < 0:
        raise ValueError(f"max_extra_batches {max_extra_batches!r} must be >= 0")
    return 1.0 - (1.0 - confidence) / (1 + int(max_extra_batches))


def judge_speedup(std_rounds: Sequence[float], fast_rounds: Sequence[float], *, min_speedup: float = 1.0,
                  confidence: float = 0.95, n_resamples: int = 4000, seed: int = 0,
                  looks: int = 1) -> SpeedupJudgement:
    """One look: pass iff the CI's lower bound > ``min_speedup``; fail iff its upper bound <=
    ``min_speedup`` (clearly not better); else the CI straddles it: "inconclusive"."""
    est, lo, hi = bootstrap_ratio_ci(std_rounds, fast_rounds, n_resamples=n_resamples, confidence=confidence,
                                     seed=seed, paired=True)
    if not all(math.isfinite(v) for v in (est, lo, hi)):
        outcome = "inconclusive"
    elif lo > min_speedup:
        outcome = "pass"
    elif hi <= min_speedup:
        outcome = "fail"
    else:
        outcome = "inconclusive"
    return SpeedupJudgement(outcome, est, lo, hi, confidence, float(min_speedup), len(std_rounds), looks)


def sequential_speedup(measure: Callable[[int], tuple[Sequence[float], Sequence[float]]], *, rounds: int,
                       max_extra_batches: int = 1, min_speedup: float = 1.0, confidence: float = 0.95,
                       n_resamples: int = 4000, seed: int = 0) -> SpeedupJudgement:
    """Measure ``rounds`` rounds (``measure(n)`` -> (standard times, fast times) of n more rounds),
    judge; while the CI straddles ``min_speedup`` and extra batches are left (a maximum fixed
    before measuring), measure one more batch of ``rounds`` rounds and judge all rounds so far.
    Still straddling after the last batch = "inconclusive" (not passed)."""
    if rounds < 1:
        raise ValueError(f"rounds {rounds!r} must be >= 1")
    level = look_confidence(confidence, max_extra_batches)
    std: list[float] = []
    fast: list[float] = []
    for look in range(1, max_extra_batches + 2):
        s, f = measure(rounds)
        if len(s) != rounds or len(f) != rounds:
            raise ValueError(f"measure({rounds}) returned {len(s)} standard and {len(f)} fast rounds")
        std += [float(v) for v in s]
        fast += [float(v) for v in f]
        verdict = judge_speedup(std, fast, min_speedup=min_speedup, confidence=level,
                                n_resamples=n_resamples, seed=seed + look, looks=look)
        if verdict.outcome != "inconclusive":
            return verdict
    return verdict


def control_alarm(a_rounds: Sequence[float], b_rounds: Sequence[float], *, confidence: float = 0.999,
                  tolerance: float = 0.0, n_resamples: int = 4000, seed: int = 0) -> dict:
    """Standard-vs-standard control: the same step timed as both paths. Its speedup should sit
    at 1.0; the alarm rings only when the CI at the stricter ``confidence`` lies wholly outside
    [1 - tolerance, 1 + tolerance] (the method then sees a difference where there is none)."""
    est, lo, hi = bootstrap_ratio_ci(a_rounds, b_rounds, n_resamples=n_resamples, confidence=confidence,
                                     seed=seed, paired=True)
    alarm = bool(lo > 1.0 + tolerance or hi < 1.0 - tolerance)
    return {"speedup": est, "ci_low": lo, "ci_high": hi, "confidence": confidence, "tolerance": tolerance,
            "alarm": alarm, "rounds": len(a_rounds)}


def mcnemar_exact(a_correct: Sequence[bool], b_correct: Sequence[bool]) -> dict:
    """Exact two-sided McNemar test. Returns b (a right, b wrong), c (a wrong, b right), p."""
    x = np.asarray(a_correct, dtype=bool)
    y = np.asarray(b_correct, dtype=bool)
    if x.shape != y.shape:
        raise ValueError("paired outcomes differ in length")
    nb = int(np.sum(x & ~y))
    nc = int(np.sum(~x & y))
    n = nb + nc
    p = 1.0 if n == 0 else float(min(1.0, 2.0 * _st.binom.cdf(min(nb, nc), n, 0.5)))
    return {"b": nb, "c": nc, "n_discordant": n, "p_value": p}


def log_softmax(logits) -> np.ndarray:
    """Row-wise log-softmax in float64; -inf entries stay -inf."""
    x = np.asarray(logits, dtype=np.float64)
    m = np.max(x, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        lse = np.log(np.sum(np.exp(x - m), axis=-1, keepdims=True)) + m
        return x - lse


def kl_divergence(p_logits, q_logits) -> np.ndarray:
    """KL(P || Q) per row, P and Q the softmax of the given logits (float64).

    Terms with p == 0 contribute 0; p > 0 where q == 0 gives +inf; NaN input gives NaN.
    """
    lp = log_softmax(p_logits)
    lq = log_softmax(q_logits)
    p = np.exp(lp)
    with np.errstate(invalid="ignore"):
        diff = np.where(p > 0, lp - lq, 0.0)
        terms = np.where(p > 0, p * diff, 0.0)
    out = terms.sum(axis=-1)
    bad = np.isnan(np.asarray(p_logits, dtype=np.float64)).any(axis=-1) | np.isnan(
        np.asarray(q_logits, dtype=np.float64)
    ).any(axis=-1)
    out = np.where(bad, np.nan, out)
    return np.maximum(out, 0.0)  # rounding can give -1e-17; NaN propagates


def top1_agreement(a_logits, b_logits) -> float:
    """Fraction of rows whose argmax (lowest id on ties) agrees."""
    a = np.asarray(a_logits, dtype=np.float64)
    b = np.asarray(b_logits, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"logit shapes differ: {a.shape} vs {b.shape}")
    if a.shape[0] == 0:
        return math.nan
    return float(np.mean(np.argmax(a, axis=-1) == np.argmax(b, axis=-1)))


def randomized_pit(probs, token: int, u: float) -> float:
    """Randomized probability integral transform of a discrete draw: with categories ordered by
    descending probability (ties: lower id first), F(before token) + u * p(token). Uniform on
    [0, 1] iff ``token`` was drawn from ``probs`` (u ~ U(0, 1) independent), so draws made in
    different contexts can be pooled into one uniformity test."""
    p = np.asarray(probs, dtype=np.float64)
    p = p / p.sum()
    order = np.lexsort((np.arange(len(p)), -p))
    rank = int(np.nonzero(order == token)[0][0])
    before = float(p[order[:rank]].sum())
    return min(1.0, before + u * float(p[token]))


def uniformity_g_test(values: Sequence[float], bins: int = 10, *, min_expected: float = 5.0) -> GTestResult:
    """G-test that ``values`` are uniform on [0, 1] over ``bins`` equal bins (pooled if low)."""
    v = np.clip(np.asarray(values, dtype=np.float64), 0.0, 1.0 - 1e-12)
    counts = np.bincount((v * bins).astype(int), minlength=bins)[:bins]
    return g_test(counts, np.full(bins, 1.0 / bins), min_expected=min_expected)
