"""The standard sampler against the Sampling contract (docs/architecture.md)."""

from __future__ import annotations

import math

import pytest
import torch
from scipy import stats

from optimized_model.k3.sampling import (
    Sampler,
    SamplingParams,
    bitmask_to_bool,
    draw_noise,
    make_generators,
)

P = SamplingParams


def _noise(params, V):
    return draw_noise(make_generators(params), V)


def _support(sampler, logits, params, bitmask=None):
    return [set(torch.nonzero(row > 0).flatten().tolist()) for row in sampler.probs(logits, params, bitmask)]


def test_greedy_argmax_lowest_id_on_ties():
    logits = torch.tensor([[0.0, 3.0, 1.0, 3.0], [5.0, 5.0, 5.0, 5.0], [-1.0, -2.0, -0.5, -3.0]])
    tok, lp = Sampler().sample(logits, [P()] * 3)
    assert tok.tolist() == [1, 0, 2]
    ref = torch.log_softmax(logits, -1)
    assert torch.allclose(lp, ref[torch.arange(3), tok])


def test_top_k_mask_exact_with_boundary_ties():
    logits = torch.tensor([[1.0, 4.0, 2.0, 3.0, 2.0, 0.0]] * 3)
    params = [P(1.0, 1.0, 2), P(1.0, 1.0, 3), P(1.0, 1.0, 0)]
    sup = _support(Sampler(), logits, params)
    assert sup[0] == {1, 3}
    assert sup[1] == {1, 3, 2, 4}  # the 3rd largest value (2.0) is tied: both kept
    assert sup[2] == set(range(6))
    # renormalised softmax over the kept set
    q = Sampler().probs(logits, params)[0]
    ref = torch.softmax(torch.tensor([4.0, 3.0]), -1)
    assert torch.allclose(q[[1, 3]], ref)


@pytest.mark.parametrize(
    "top_p,expected",
    [(0.35, {0}), (0.6, {0, 1}), (0.75, {0, 1, 2}), (0.95, {0, 1, 2, 3}), (1.0, {0, 1, 2, 3, 4}), (1e-6, {0})],
)
def test_top_p_mask_exact(top_p, expected):
    probs = torch.tensor([0.4, 0.3, 0.2, 0.08, 0.02])
    logits = probs.log().unsqueeze(0)
    sampler = Sampler()
    assert _support(sampler, logits, [P(1.0, top_p)])[0] == expected
    q = sampler.probs(logits, [P(1.0, top_p)])[0]
    idx = sorted(expected)
    assert torch.allclose(q[idx], probs[idx] / probs[idx].sum(), atol=1e-6)
    assert math.isclose(float(q.sum()), 1.0, rel_tol=1e-6)


def test_top_p_boundary_ties_kept_and_combined_with_top_k():
    logits = torch.tensor([[0.3, 0.3, 0.3, 0.1]]).log()
    assert _support(Sampler(), logits, [P(1.0, 0.5)])[0] == {0, 1, 2}
    logits2 = torch.tensor([[0.4, 0.3, 0.2, 0.08, 0.02]]).log()
    # top-k 3 -> renormalised [0.444, 0.333, 0.222]; top-p 0.7 -> {0, 1}
    assert _support(Sampler(), logits2, [P(1.0, 0.7, 3)])[0] == {0, 1}


def test_temperature_scales_logits():
    logits = torch.tensor([[1.0, 2.0, 0.5]])
    q = Sampler().probs(logits, [P(0.5)])[0]
    assert torch.allclose(q, torch.softmax(logits[0] / 0.5, -1))


def test_bitmask_and_padding_respected():
    V = 70  # 3 words, last one partial
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(8, V, generator=g) * 3
    bitmask = torch.randint(-(2**31), 2**31 - 1, (8, 3), generator=g, dtype=torch.int64).to(torch.int32)
    allowed = bitmask_to_bool(bitmask, V)
    # the layout is xgrammar's: bit j of word i is token 32*i + j
    assert bool(allowed[0, 33]) == bool((int(bitmask[0, 1]) >> 1) & 1)
    sampler = Sampler(n_valid=64)
    params = [P(0.0)] * 2 + [P(1.0, 0.9, 10, seed=s) for s in range(6)]
    for step in range(20):
        noise = _noise([P(1.0, seed=step * 10 + b) for b in range(8)], V)
        tok, _ = sampler.sample(logits, params, noise, bitmask)
        for b, t in enumerate(tok.tolist()):
            assert allowed[b, t] and t < 64
    q = sampler.probs(logits, params, bitmask)
    assert (q[~allowed] == 0).all() and (q[:, 64:] == 0).all()
    # greedy rows pick the best allowed id
    masked = logits.masked_fill(~allowed, float("-inf"))[:, :64]
    tok, _ = sampler.sample(logits, params, _noise(params, V), bitmask)
    assert tok[:2].tolist() == masked[:2].argmax(-1).tolist()


def test_same_seed_same_samples_and_batch_independence():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 50, generator=g)
    params = [P(1.0, 1.0, 0, 7), P(0.8, 0.9, 0, 8), P(0.0), P(1.2, 1.0, 20, 9)]
    sampler = Sampler()

    def run(ps, lg):
        gens = make_generators(ps)
        return torch.stack([sampler.sample(lg, ps, draw_noise(gens, 50))[0] for _ in range(30)])

    a, b = run(params, logits), run(params, logits)
    assert torch.equal(a, b)
    # a request's samples do not depend on its batch neighbours
    solo = run([params[1]], logits[1:2])
    assert torch.equal(a[:, 1], solo[:, 0])
    other = run([P(1.0, 1.0, 0, 70)] + params[1:], logits)
    assert not torch.equal(a[:, 0], other[:, 0])  # a different seed gives different samples


def test_greedy_rows_consume_no_noise():
    gens = make_generators([P(0.0), P(1.0, seed=3)])
    assert gens[0] is None
    n = draw_noise(gens, 16)
    assert torch.equal(n[0], torch.ones(16))
    ref = torch.empty(16).exponential_(1.0, generator=torch.Generator().manual_seed(3))
    assert torch.equal(n[1], ref)


def test_logprobs_are_log_of_final_distribution():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(5, 40, generator=g)
    params = [P(0.7, 0.8, 0, 1), P(1.0, 1.0, 5, 2), P(1.5, 0.5, 10, 3), P(0.0), P(1.0, seed=4)]
    sampler = Sampler()
    tok, lp = sampler.sample(logits, params, _noise(params, 40))
    q = sampler.probs(logits, params)
    for b in range(5):
        expect = torch.log_softmax(logits[b], -1)[tok[b]] if params[b].greedy else q[b, tok[b]].log()
        assert math.isclose(float(lp[b]), float(expect), rel_tol=1e-5, abs_tol=1e-6)


def _g_test(counts, probs):
    exp = probs * counts.sum()
    keep = exp > 0
    assert counts[~keep].sum() == 0, "sampled a token of probability 0"
    o, e = counts[keep].double(), exp[keep].double()
    g = 2 * float((o[o > 0] * (o[o > 0] / e[o > 0]).log()).sum())
    return stats.chi2.sf(g, int(keep.sum()) - 1)


def test_sampled_frequencies_match_final_distribution():
    """~20k draws on a small vocab; G-test at alpha = 0.001, plus a negative control."""
    V, N = 8, 20000
    logits = torch.tensor([[2.0, 1.5, 1.0, 0.8, 0.5, 0.0, -0.5, -1.0]]).expand(N, V).contiguous()
    p = SamplingParams(0.9, 0.9, 6, seed=0)
    params = [SamplingParams(p.temperature, p.top_p, p.top_k, seed=s) for s in range(N)]
    sampler = Sampler()
    tok, _ = sampler.sample(logits, params, _noise(params, V))
    counts = torch.bincount(tok, minlength=V)
    q = sampler.probs(logits[:1], params[:1])[0]
    assert (q > 0).sum() < 6  # top-p really removed something beyond top-k
    assert _g_test(counts, q) > 1e-3
    # negative control: the same counts are far from the untruncated softmax
    wrong = torch.softmax(logits[0] / 0.9, -1)
    assert stats.chi2.sf(
        float(2 * (counts[counts > 0].double() * (counts[counts > 0].double() / (wrong[counts > 0].double() * N)).log()).sum()),
        V - 1,
    ) < 1e-3


def test_invalid_params_rejected():
    for bad in (P(-1.0), P(1.0, 0.0), P(1.0, 1.5), P(1.0, 1.0, -2)):
        with pytest.raises(ValueError):
            bad.validate()
    with pytest.raises(ValueError, match="noise"):
        Sampler().sample(torch.zeros(1, 4), [P(1.0)], None)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_batched_standard_equals_per_row_reference(seed):
    """Sampler (batched fp32) == sample_reference (row by row, fp32), bit for bit, on mixed
    batches with masks; and == the fp64 oracle's tokens."""
    from optimized_model.k3.sampling import sample_batched, sample_reference

    g = torch.Generator().manual_seed(seed)
    B, V = 40, 100
    logits = torch.randn(B, V, generator=g) * [0.01, 2.0, 30.0][seed]
    if seed == 2:
        logits = logits.round()  # many exact ties
    params = [P([0.0, 0.6, 1.0, 1.7][b % 4], [1.0, 0.9, 0.5, 0.99, 0.2][b % 5], [0, 1, 3, 50, 99, 100, 500][b % 7], b)
              for b in range(B)]
    bitmask = torch.randint(-(2**31), 2**31 - 1, (B, 4), generator=g, dtype=torch.int64).to(torch.int32)
    bitmask[:, 0] |= 1
    noise = _noise(params, V)
    tb, lb, db = sample_batched(logits, params, noise, bitmask, n_valid=90)
    tr, lr, dr = sample_reference(logits, params, noise, bitmask, n_valid=90)
    assert torch.equal(tb, tr) and torch.equal(lb, lr) and torch.equal(db, dr)
    to, _, _ = sample_reference(logits, params, noise, bitmask, n_valid=90, dtype=torch.float64)
    assert torch.equal(tb, to)
    assert torch.equal(Sampler(n_valid=90).probs(logits, params, bitmask), dr)
