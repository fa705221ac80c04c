"""fastpath.stats: each test checks a property that a wrong implementation would break."""

import math

import numpy as np
import pytest
from scipy import stats as st

from fastpath import stats


def test_g_test_matches_scipy_without_pooling():
    obs = np.array([30, 25, 20, 25])
    p = np.array([0.25, 0.25, 0.25, 0.25])
    r = stats.g_test(obs, p)
    ref = st.power_divergence(obs, p * obs.sum(), lambda_="log-likelihood")
    assert r.statistic == pytest.approx(ref.statistic)
    assert r.p_value == pytest.approx(ref.pvalue)
    assert r.df == 3 and r.bins == 4 and r.n == 100


def test_pooling_merges_small_bins():
    o, e = stats.pool_low_count_bins([1, 0, 2, 50, 47], [1.0, 2.0, 3.0, 47.0, 47.0], 5.0)
    assert len(o) == 3
    assert o.sum() == 100 and e.sum() == pytest.approx(100)
    assert min(e) >= 5.0
    # pooled bin still too small -> merged with the smallest big bin
    o, e = stats.pool_low_count_bins([1, 9, 90], [1.0, 9.0, 90.0], 5.0)
    assert list(e) == [10.0, 90.0] and list(o) == [10.0, 90.0]


def test_correct_sampler_passes_and_biased_fails():
    rng = np.random.default_rng(1)
    p = rng.dirichlet(np.ones(300) * 0.3)  # many tiny categories: pooling matters
    n = 20000
    obs = np.bincount(rng.choice(300, size=n, p=p), minlength=300)
    good = stats.g_test(obs, p)
    assert good.passed(0.001), good.as_dict()
    # temperature applied twice: the distribution is sharper -> detected
    q = p**1.25 / (p**1.25).sum()
    obs_b = np.bincount(rng.choice(300, size=n, p=q), minlength=300)
    bad = stats.g_test(obs_b, p)
    assert not bad.passed(0.001), bad.as_dict()


def test_false_positive_rate_near_alpha():
    rng = np.random.default_rng(7)
    p = rng.dirichlet(np.ones(40))
    rejections = 0
    for _ in range(400):
        obs = np.bincount(rng.choice(40, size=2000, p=p), minlength=40)
        rejections += stats.g_test(obs, p).p_value < 0.05
    assert 0.02 <= rejections / 400 <= 0.09


def test_impossible_category_fails_at_any_size():
    r = stats.g_test([10, 10, 1], [0.5, 0.5, 0.0])
    assert r.impossible == 1 and r.p_value == 0.0 and not r.passed(1e-12)


def test_pooled_over_prompts_adds_g_and_df():
    a = stats.g_test([30, 70], [0.3, 0.7])
    b = stats.g_test([40, 60], [0.5, 0.5])
    c = stats.g_test_pooled([a, b])
    assert c.statistic == pytest.approx(a.statistic + b.statistic)
    assert c.df == 2 and c.n == 200
    assert c.p_value == pytest.approx(st.chi2.sf(c.statistic, 2))


def test_paired_bootstrap_ci_covers_and_excludes():
    rng = np.random.default_rng(0)
    a = rng.normal(1.0, 1.0, 200)
    b = a - 0.5 + rng.normal(0, 0.1, 200)
    est, lo, hi = stats.paired_bootstrap_ci(a, b, n_resamples=2000)
    assert lo < 0.5 < hi and est == pytest.approx(np.mean(a - b))
    est0, lo0, hi0 = stats.paired_bootstrap_ci(a, a + rng.normal(0, 0.1, 200), n_resamples=2000)
    assert lo0 < 0 < hi0


def test_bootstrap_ratio_ci():
    rng = np.random.default_rng(0)
    std = rng.normal(2.0, 0.05, 60)
    fast = rng.normal(1.0, 0.05, 60)
    r, lo, hi = stats.bootstrap_ratio_ci(std, fast, n_resamples=2000)
    assert 1.8 < lo <= r <= hi < 2.2


def test_mcnemar_exact():
    a = [True] * 10 + [False] * 0 + [True] * 50
    b = [False] * 10 + [True] * 0 + [True] * 50
    r = stats.mcnemar_exact(a, b)
    assert r["b"] == 10 and r["c"] == 0
    assert r["p_value"] == pytest.approx(2 * 0.5**10)
    assert stats.mcnemar_exact([True, False], [True, False])["p_value"] == 1.0


def test_kl_and_top1():
    p = np.array([[2.0, 1.0, 0.0], [0.0, 0.0, 5.0]])
    assert np.allclose(stats.kl_divergence(p, p), 0.0)
    q = np.array([[1.0, 2.0, 0.0], [0.0, 0.0, 5.0]])
    kl = stats.kl_divergence(p, q)
    pp = np.exp(p[0]) / np.exp(p[0]).sum()
    qq = np.exp(q[0]) / np.exp(q[0]).sum()
    assert kl[0] == pytest.approx(np.sum(pp * np.log(pp / qq)))
    assert stats.top1_agreement(p, q) == 0.5
    # masked logits: p=0 where masked contributes nothing; q masked where p>0 -> inf
    m = np.array([[0.0, -np.inf, 1.0]])
    assert math.isfinite(stats.kl_divergence(m, np.array([[0.0, 3.0, 1.0]]))[0])
    assert stats.kl_divergence(np.array([[0.0, 3.0, 1.0]]), m)[0] == np.inf
    assert math.isnan(stats.kl_divergence(np.array([[np.nan, 0.0]]), np.array([[0.0, 0.0]]))[0])


def test_randomized_pit_uniform_only_for_the_right_distribution():
    rng = np.random.default_rng(3)
    us_good, us_bad = [], []
    for _ in range(3000):
        logits = rng.normal(0, 2, 50)
        p = np.exp(logits) / np.exp(logits).sum()
        q = np.exp(logits / 0.6) / np.exp(logits / 0.6).sum()  # temperature 0.6
        us_good.append(stats.randomized_pit(q, int(rng.choice(50, p=q)), rng.random()))
        us_bad.append(stats.randomized_pit(q, int(rng.choice(50, p=p)), rng.random()))  # temperature ignored
    assert stats.uniformity_g_test(us_good).passed(0.001)
    assert not stats.uniformity_g_test(us_bad).passed(0.001)
    # rank order: the most likely token maps into [0, p_max)
    assert stats.randomized_pit([0.1, 0.7, 0.2], 1, 0.5) == pytest.approx(0.35)
    assert stats.randomized_pit([0.1, 0.7, 0.2], 0, 0.0) == pytest.approx(0.9)
