"""Speculative decoding on K3-mini's standard path (tiny, CPU): the verify step and its rollback,
the drafters, greedy identity, the rejection sampler's distribution, structured output."""

from __future__ import annotations

import hashlib
import json
import re

import pytest
import torch

from fastpath.engine import GenerationRequest
from optimized_model.k3.drafters import NgramDrafter, SyntheticDrafter
from optimized_model.k3.engine import EmbeddedEngine
from optimized_model.k3.generate import generate
from optimized_model.k3.model import K3Model
from optimized_model.k3.sampling import SamplingParams, final_probs
from optimized_model.k3.speculative import SpecConfig, accept
from optimized_model.k3.tokenizer import K3Tokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TOK = K3Tokenizer()


@pytest.fixture(scope="module")
def std():
    return EmbeddedEngine(config="tiny", device="cpu", dtype="float32").load("standard")


def _close_states(a, b, atol=1e-5):
    """Equal states of one sequence; the latent cache up to its length (beyond it a right-padded
    prefill leaves its padding's latents, never attended)."""
    n = int(b.lengths[0])
    for name, x, y in zip(("conv", "kda", "latent", "lengths"), a.tensors(), b.tensors()):
        assert x.shape == y.shape, name
        if name == "latent":
            x, y = x[:, :, :n], y[:, :, :n]
        assert torch.allclose(x.float(), y.float(), atol=atol, rtol=0), (name, (x.float() - y.float()).abs().max())


# -- the verify step ----------------------------------------------------------------------------
ON_GPU = pytest.mark.skipif(not torch.cuda.is_available(),
                            reason="needs a CUDA GPU: the standard path's KDA step runs fla's kernel there")


@pytest.mark.parametrize("device,dtype,atol", [
    ("cpu", torch.float32, 1e-5), ("cpu", torch.float16, 2e-2),
    # on CUDA the KDA step is fla's kernel, fed token t of [B, T, ...] tensors (it once read
    # rows b >= 1 at a dense batch stride: every row but the first went wrong)
    pytest.param("cuda", torch.bfloat16, 5e-2, marks=ON_GPU)])
def test_verify_equals_decoding_and_commit_rolls_back_per_row(device, dtype, atol):
    """A verify step's logits are those of decoding its tokens one by one, and after commit
    (a different accepted length per row) the KDA states, conv windows, latent cache and
    lengths equal those plain decoding of the accepted tokens leaves."""
    m = K3Model.build("tiny", device=device, dtype=dtype, seed=3)
    gen = torch.Generator().manual_seed(0)
    B, T = 4, 8
    prompts = torch.randint(0, 265, (B, 12), generator=gen).to(device)
    st = m.new_state(B, 64)
    m.prefill(prompts, torch.tensor([12, 5, 9, 1], device=device), st)
    toks = torch.randint(0, 265, (B, T), generator=gen).to(device)
    spec = st.clone()
    logits, trail = m.verify(toks, spec)
    plain = st.clone()
    ref = torch.stack([m.decode(toks[:, t], plain) for t in range(T)], 1)
    real = slice(0, m.cfg.n_real_tokens)
    assert torch.allclose(logits[..., real], ref[..., real], atol=atol * 10, rtol=0)
    keep = [1, 8, 3, 5]
    m.commit(spec, trail, torch.tensor(keep, device=device))
    for b, n in enumerate(keep):
        row = st.select([b])
        for t in range(n):
            m.decode(toks[b:b + 1, t], row)
        _close_states(spec.select([b]), row, atol)


def test_decode_step_with_a_draft_is_a_verify_step_at_a_fixed_context(std):
    step = std.decode_step(2, 40, draft=3)
    for _ in range(2):
        step()
    from optimized_model.k3.fast import dispatch

    assert dispatch.decide(2, 40, "verify", 3) is None  # the fast path runs it (tests/test_fast_verify.py)
    assert dispatch.decide(2, 40, "verify", 8) == "draft_out_of_scope"


def test_benchmark_verify_step_keeps_alive_what_its_graph_reads(std, monkeypatch):
    """On a GPU the standard path's benchmark verify step is a CUDA graph that reads its
    ``keep`` counts at every replay: every tensor made for it must live as long as the step (a
    freed one is reused by the next allocation; on the H200 the counts became garbage once a
    neighbour step was freed, and the commit's gather tripped a device-side assert). The
    capture is faked here (no CUDA): what matters is what the returned step holds."""
    import gc
    import weakref

    from optimized_model.k3 import runner as runner_mod

    made, full = [], torch.full

    def spy_full(*args, **kwargs):
        t = full(*args, **kwargs)
        made.append(weakref.ref(t))
        return t

    runner = runner_mod.K3Runner(std.runner.model, use_graphs=False)
    monkeypatch.setattr(runner, "use_graphs", True)
    monkeypatch.setattr(runner, "_capture", lambda state, lengths_base, tokens, decode: runner_mod._Graph(
        None, tokens, None))  # as the real one: it keeps the graph, not the step it captured
    monkeypatch.setattr(torch, "full", spy_full)
    step = runner.decode_step(2, 16, 3)
    monkeypatch.undo()
    gc.collect()
    assert made and all(ref() is not None for ref in made)
    del step
    gc.collect()
    assert all(ref() is None for ref in made)  # held by the step, not leaked


def test_fast_path_refuses_out_of_scope_verify_steps_with_the_declared_reason():
    from fastpath import trace
    from optimized_model.k3.fast import dispatch

    fast = EmbeddedEngine(config="tiny", device="cpu", dtype="float32").load(
        "fast", additional_config=dispatch.switch_config())
    with trace.recording() as rec:
        fast.decode_step(1, 16, draft=8)()
        out = fast.generate([GenerationRequest(prompt_ids=TOK.encode("abab"), max_tokens=6, ignore_eos=True)],
                            speculative={"method": "synthetic", "num_speculative_tokens": 8, "acceptance_length": 3})
    reasons = {e.detail for e in rec.events if e.kind == "refused"}
    assert "draft_out_of_scope" in reasons and len(out[0].token_ids) == 6


# -- drafters --------------------------------------------------------------------------------------
def test_ngram_drafter_longest_then_earliest_match():
    d = NgramDrafter(k=4, prompt_lookup_min=2, prompt_lookup_max=3)
    assert d.propose_one([1, 2, 3, 4, 2, 3]) == [4, 2, 3]  # [4,2,3] has no match; [2,3] at 1
    assert d.propose_one([9, 2, 3, 7, 7, 1, 2, 3, 8, 1, 2, 3]) == [8, 1, 2, 3]  # 3-gram beats earlier 2-gram
    assert d.propose_one([5, 2, 3, 6, 2, 3]) == [6, 2, 3]  # the earliest occurrence, as vLLM
    assert d.propose_one([1, 2, 3, 4]) == []  # no earlier occurrence
    assert d.propose_one([7, 7]) == []  # shorter than min + 1
    assert NgramDrafter(k=2, prompt_lookup_min=1, prompt_lookup_max=1).propose_one([4, 5, 4]) == [5, 4]
    assert d.propose([[1, 2, 1, 2], [1]], [True, False]) == [[1, 2], []]


def test_synthetic_drafter_schedule():
    d = SyntheticDrafter(k=7, acceptance_length=2.5)  # 1.5 correct drafts per step on average
    got = []
    for _ in range(10):
        got.append(d.correct_drafts(0))
        d.steps[0] = d.steps.get(0, 0) + 1
    assert sum(got) == 15 and set(got) == {1, 2}
    assert SyntheticDrafter(k=3, acceptance_length=4).correct_drafts(0) == 3


def test_spec_config_is_checked():
    assert SpecConfig.parse(None) is None and SpecConfig.parse({}) is None
    c = SpecConfig.parse({"method": "ngram", "num_speculative_tokens": 3})
    assert (c.method, c.num_speculative_tokens, c.synthetic) == ("ngram", 3, False)
    for bad in ({"method": "eagle", "num_speculative_tokens": 3}, {"method": "ngram", "num_speculative_tokens": 0},
                {"method": "synthetic", "num_speculative_tokens": 3, "acceptance_length": 5},
                {"method": "ngram", "num_speculative_tokens": 3, "acceptance_length": 2},
                {"method": "ngram", "num_speculative_tokens": 3, "typo": 1}):
        with pytest.raises(ValueError):
            SpecConfig.parse(bad)
    with pytest.raises(ValueError, match="speculative"):
        EmbeddedEngine(config="tiny", speculative={"method": "ngram"})


# -- greedy identity -----------------------------------------------------------------------------
PROMPTS = ["the cat sat on the mat. the cat sat on", "hello world", "abcabcabcabc", "0123 0123 01"]


def _requests(max_tokens=(40, 27, 33, 13), stop=None):
    return [GenerationRequest(prompt_ids=TOK.encode(p), max_tokens=n, ignore_eos=True,
                              stop_token_ids=list(stop[i]) if stop and stop[i] else [])
            for i, (p, n) in enumerate(zip(PROMPTS, max_tokens))]


@pytest.mark.parametrize("spec", [
    {"method": "ngram", "num_speculative_tokens": 3},
    {"method": "ngram", "num_speculative_tokens": 7, "prompt_lookup_min": 1},
    {"method": "synthetic", "num_speculative_tokens": 3, "acceptance_length": 2.5},
    {"method": "synthetic", "num_speculative_tokens": 7, "acceptance_length": 6},
    {"method": "synthetic", "num_speculative_tokens": 7, "acceptance_length": 8},
], ids=["ngram-k3", "ngram-k7", "synthetic-k3-al2.5", "synthetic-k7-al6", "synthetic-k7-al8"])
def test_greedy_with_speculation_equals_without(std, spec):
    """Rows of different lengths finish inside a draft window (max_tokens, a stop token)."""
    base = std.generate(_requests())
    # row 1 stops on a token it generates at index 9 (its first occurrence there)
    t9 = base[1].token_ids[9]
    stop = [None, [t9] if t9 not in base[1].token_ids[:9] else None, None, None]
    base = std.generate(_requests(stop=stop))
    out = std.generate(_requests(stop=stop), speculative=spec)
    for o, b in zip(out, base):
        assert o.token_ids == b.token_ids and o.finish_reason == b.finish_reason and o.text == b.text
        assert o.speculative is not None and o.speculative.synthetic == (spec["method"] == "synthetic")
    if spec["method"] == "synthetic":
        for o in out:  # every step but a row's last is a full step at the configured length
            s = o.speculative
            assert s.drafted == spec["num_speculative_tokens"] * s.steps
            assert abs(s.mean_acceptance_length - spec["acceptance_length"]) <= 1.0 / s.steps + 1e-9, s.as_dict()


def test_synthetic_acceptance_length_is_measured_as_set(std):
    reqs = [GenerationRequest(prompt_ids=TOK.encode(p), max_tokens=1 + 6 * 8, ignore_eos=True) for p in PROMPTS[:2]]
    out = std.generate(reqs, speculative={"method": "synthetic", "num_speculative_tokens": 7, "acceptance_length": 6})
    for o in out:
        s = o.speculative
        assert (s.steps, s.accepted, s.mean_acceptance_length) == (8, 40, 6.0), s.as_dict()
        assert s.as_dict()["synthetic"] is True


class CopyRunner:
    """A 'model' that continues every sequence by copying its token from ``period`` positions
    back (plus seeded noise well below that), with the runner's verify / commit interface."""

    def __init__(self, period: int):
        self.vocab_size, self.device, self.period = TOK.vocab_size, "cpu", period
        self.verified = 0

    def _logits(self, hist):
        h = int.from_bytes(hashlib.sha256(str(hist).encode()).digest()[:8], "little")
        x = torch.randn(self.vocab_size, generator=torch.Generator().manual_seed(h))
        x[hist[-self.period]] += 20.0
        return x

    def prefill(self, prompts):
        state = [list(p) for p in prompts]
        return torch.stack([self._logits(h) for h in state]), state

    def decode(self, tokens, state):
        for h, t in zip(state, tokens.tolist()):
            h.append(t)
        return torch.stack([self._logits(h) for h in state])

    def verify(self, tokens, state):
        self.verified += 1
        rows = tokens.tolist()
        return torch.stack([torch.stack([self._logits(h + r[: j + 1]) for j in range(len(r))])
                            for h, r in zip(state, rows)]), rows

    def commit(self, state, rows, keep):
        for h, r, n in zip(state, rows, keep):
            h.extend(r[:n])


def test_ngram_on_a_copying_sequence_accepts_long_runs():
    prompt = TOK.encode("Prepend 7Qx to the 2nd poem: ")
    reqs = [GenerationRequest(prompt_ids=prompt, max_tokens=120, ignore_eos=True)]
    base = generate(CopyRunner(len(prompt)), TOK, reqs)[0]
    runner = CopyRunner(len(prompt))
    out = generate(runner, TOK, reqs, speculative={"method": "ngram", "num_speculative_tokens": 7})[0]
    assert out.token_ids == base.token_ids
    s = out.speculative
    assert s.mean_acceptance_length > 7.0 and runner.verified <= 120 / 7, s.as_dict()


# -- sampling: the distribution is kept -------------------------------------------------------------
def _g_test_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """G-test p-value of counts against probs; bins expected < 5 pooled, impossible bins must be empty."""
    from scipy.stats import power_divergence

    n = int(counts.sum())
    assert int(counts[probs == 0].sum()) == 0, "a token of probability 0 was emitted"
    exp = probs.double() * n
    small = (exp < 5) & (probs > 0)
    big = exp >= 5
    obs = torch.cat([counts[big].double(), counts[small].double().sum().view(1)])
    ex = torch.cat([exp[big], exp[small].sum().view(1)])
    if ex[-1] == 0:
        obs, ex = obs[:-1], ex[:-1]
    ex = ex * (obs.sum() / ex.sum())  # fp32 probabilities: exact totals for scipy's sum check
    return float(power_divergence(obs.numpy(), ex.numpy(), lambda_="log-likelihood").pvalue)


V, N_VALID = 32, 28


def _bitmask(gen):
    from optimized_model.k3.structured import _pack

    allowed = torch.rand(3, V, generator=gen) < 0.6
    allowed[:, 0] = True
    return torch.stack([_pack(a) for a in allowed])


@pytest.mark.parametrize("params,masked", [
    (SamplingParams(temperature=1.0), False),
    (SamplingParams(temperature=0.7, top_k=10), False),
    (SamplingParams(temperature=1.3, top_p=0.8), False),
    (SamplingParams(temperature=1.0, top_k=12, top_p=0.9), True),
], ids=["t1", "t0.7-topk", "t1.3-topp", "masked-topk-topp"])
@pytest.mark.parametrize("drafter", ["deterministic", "random_q"])
def test_rejection_sampler_keeps_the_distribution(params, masked, drafter):
    """Like vLLM's rejection-sampler convergence test: many seeded draws of a verify window of
    2 drafts; the 1st emitted token ~ p_0, the 2nd (given the 1st draft accepted) ~ p_1, the bonus
    (given both accepted) ~ p_2, where p_j is the non-speculative sampler's distribution
    (sampling.final_probs). G-test at alpha = 0.001."""
    gen = torch.Generator().manual_seed(11)
    logits = torch.randn(3, V, generator=gen) * 1.5
    mask = _bitmask(gen) if masked else None
    p = final_probs(logits, [params] * 3, mask, n_valid=N_VALID)
    # a random drafter near the target (so drafts are often accepted), also proposing masked ids
    q = 0.6 * p[:2] + 0.4 * torch.softmax(torch.randn(2, V, generator=gen), -1)
    q[:, N_VALID:] = 0
    q = q / q.sum(-1, keepdim=True)
    # deterministic drafts: p_0's second most likely token (often rejected), p_1's most likely
    fixed = [int(torch.argsort(p[0], descending=True)[1]), int(torch.argmax(p[1]))]
    rng = torch.Generator().manual_seed(12)
    counts = torch.zeros(3, V)
    for i in range(6000):
        if drafter == "random_q":
            drafts = [int(torch.multinomial(q[j], 1, generator=rng)) for j in range(2)]
            toks, lps, a = accept(logits, drafts, params, rng, mask, n_valid=N_VALID, draft_probs=q)
        else:
            drafts = fixed
            toks, lps, a = accept(logits, drafts, params, rng, mask, n_valid=N_VALID)
        assert len(toks) == a + 1 and toks[:a] == drafts[:a]
        for j, t in enumerate(toks):
            counts[j, t] += 1
        if i < 50:
            assert lps == pytest.approx([float(torch.log(p[j, t])) for j, t in enumerate(toks)])
    for j in range(3):
        assert counts[j].sum() > 150, counts.sum(-1)
        assert _g_test_p(counts[j], p[j]) > 0.001, (j, counts[j], p[j])


def test_greedy_acceptance_rule():
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 1.0], [0.0, 0.0, 5.0]])
    g = SamplingParams()
    assert accept(logits, [1, 0], g, None)[0::2] == ([1, 0, 2], 2)
    assert accept(logits, [1, 2], g, None)[0::2] == ([1, 0], 1)
    assert accept(logits, [2, 0], g, None)[0::2] == ([1], 0)


def test_seeded_sampling_with_speculation_is_reproducible(std):
    reqs = [GenerationRequest(prompt_ids=TOK.encode(p), max_tokens=20, temperature=0.9, top_p=0.95, seed=s)
            for s, p in enumerate(PROMPTS)]
    spec = {"method": "synthetic", "num_speculative_tokens": 3, "acceptance_length": 4}
    a, b = std.generate(reqs, speculative=spec), std.generate(reqs, speculative=spec)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    assert [o.logprobs for o in a] == [o.logprobs for o in b]


# -- structured output ---------------------------------------------------------------------------------
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "ok": {"type": "boolean"}},
          "required": ["name", "age", "ok"], "additionalProperties": False}
REGEX = r"(cat|dog)-[0-9]{2,4}(\.[a-z]{1,3})?"


@pytest.mark.parametrize("spec", [
    {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1},
    {"method": "synthetic", "num_speculative_tokens": 7, "acceptance_length": 6},
], ids=["ngram", "synthetic"])
def test_structured_output_with_speculation_stays_valid(std, spec):
    pytest.importorskip("xgrammar")
    jsonschema = pytest.importorskip("jsonschema")
    prompt = TOK.encode('{"name": "dog-12", "age": 7, "ok": true} cat-123.ab')  # drafts to look up
    reqs = []
    for s in range(6):
        structured = {"json_schema": SCHEMA} if s % 2 else {"regex": REGEX}
        reqs.append(GenerationRequest(prompt_ids=prompt, max_tokens=200, temperature=0.0 if s < 2 else 0.8,
                                      seed=s, structured=structured))
    out = std.generate(reqs, speculative=spec)
    greedy = std.generate(reqs[:2])
    for o, r in zip(out, reqs):
        assert o.finish_reason == "grammar", (o.finish_reason, o.text)
        if "regex" in r.structured:
            assert re.fullmatch(REGEX, o.text), o.text
        else:
            jsonschema.validate(json.loads(o.text), SCHEMA)
        assert o.speculative.steps > 0
    assert [o.token_ids for o in out[:2]] == [o.token_ids for o in greedy]  # greedy: identical
