"""The generation loop against a fake runner (a tiny deterministic logits function)."""

from __future__ import annotations

import hashlib
import os

# read when @triton.jit decorates the sampler kernel: set at collection, before any test (here or
# in another module collected with this one) imports it, or its in-loop test cannot run it
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from fastpath import trace
from fastpath.engine import GenerationRequest, GenerationResult as ResultProtocol
from optimized_model.k3.generate import GenerationResult, generate
from optimized_model.k3.sampling import Sampler
from optimized_model.k3.tokenizer import K3Tokenizer

TOK = K3Tokenizer()


class FakeRunner:
    """Logits depend only on each sequence's full token history (seeded per history), so a
    request's outputs do not depend on its batch. ``script``: a fixed per-position boost
    (history length -> token id) to steer generations in tests. Padding ids get huge logits:
    generate() must mask them."""

    def __init__(self, vocab: int, scale: float = 2.0, script: dict[int, int] | None = None):
        self.vocab_size = vocab
        self.device = "cpu"
        self.scale = scale
        self.script = script or {}
        self.calls = {"prefill": 0, "decode": 0}

    def _logits(self, hist: list[int]) -> torch.Tensor:
        h = int.from_bytes(hashlib.sha256(str(hist).encode()).digest()[:8], "little")
        x = torch.randn(self.vocab_size, generator=torch.Generator().manual_seed(h)) * self.scale
        x[TOK.n_real_tokens:] = 1e4
        boost = self.script.get(len(hist))
        if boost is not None:
            x[boost] = 1e3
        return x

    def prefill(self, prompts):
        self.calls["prefill"] += 1
        state = [list(p) for p in prompts]
        return torch.stack([self._logits(h) for h in state]), state

    def decode(self, tokens, state):
        self.calls["decode"] += 1
        assert tokens.dtype == torch.long and tokens.shape == (len(state),)
        assert (tokens < TOK.n_real_tokens).all(), "padding fed back into the model"
        for h, t in zip(state, tokens.tolist()):
            h.append(t)
        return torch.stack([self._logits(h) for h in state])


def req(prompt="hi", **kw) -> GenerationRequest:
    return GenerationRequest(prompt_ids=TOK.encode(prompt), **kw)


def test_max_tokens_and_result_type():
    runner = FakeRunner(TOK.vocab_size)
    out = generate(runner, TOK, [req(max_tokens=7)])
    assert len(out) == 1 and isinstance(out[0], ResultProtocol) and isinstance(out[0], GenerationResult)
    r = out[0]
    # random logits can hit eos early; otherwise exactly max_tokens
    assert r.finish_reason == "length" and len(r.token_ids) == 7 or r.token_ids[-1] == TOK.eos_id
    assert all(t < TOK.n_real_tokens for t in r.token_ids)
    assert r.text == TOK.decode(r.token_ids) and r.logprobs is None
    assert runner.calls == {"prefill": 1, "decode": len(r.token_ids) - 1}


def test_greedy_matches_manual_argmax():
    runner = FakeRunner(TOK.vocab_size)
    r = generate(runner, TOK, [req("abc", max_tokens=5, logprobs=True)])[0]
    hist = TOK.encode("abc")
    ref = FakeRunner(TOK.vocab_size)
    for t in r.token_ids:
        x = ref._logits(hist)[: TOK.n_real_tokens]
        assert t == int(torch.argmax(x))
        hist.append(t)
    assert len(r.logprobs) == len(r.token_ids) and all(lp <= 0 for lp in r.logprobs)


def test_eos_stops_and_is_excluded_from_text():
    n = len(TOK.encode("x"))
    runner = FakeRunner(TOK.vocab_size, script={n: ord("o"), n + 1: ord("k"), n + 2: TOK.eos_id})
    r = generate(runner, TOK, [req("x", max_tokens=20)])[0]
    assert r.token_ids == [ord("o"), ord("k"), TOK.eos_id]
    assert r.finish_reason == "stop" and r.text == "ok"


def test_ignore_eos_generates_past_eos():
    n = len(TOK.encode("x"))
    runner = FakeRunner(TOK.vocab_size, script={n: ord("o"), n + 1: TOK.eos_id})
    r = generate(runner, TOK, [GenerationRequest(prompt_ids=TOK.encode("x"), max_tokens=5, ignore_eos=True)])[0]
    assert len(r.token_ids) == 5 and r.token_ids[1] == TOK.eos_id
    assert r.finish_reason == "length"


def test_stop_token_ids_and_stop_strings():
    n = len(TOK.encode("x"))
    script = {n + i: ord(c) for i, c in enumerate("hello world! more")}
    runner = FakeRunner(TOK.vocab_size, script=script)
    a, b, c, d = generate(runner, TOK, [
        req("x", max_tokens=30, stop_token_ids=[ord(" ")]),
        req("x", max_tokens=30, stop_strings=["o w"]),
        req("x", max_tokens=30, stop_strings=["zzz", "ld!"]),
        req("x", max_tokens=4, stop_strings=["world"]),
    ])
    assert a.finish_reason == "stop" and a.text == "hello" and a.token_ids[-1] == ord(" ")
    assert b.finish_reason == "stop" and b.text == "hell" and TOK.decode(b.token_ids) == "hello w"
    assert c.finish_reason == "stop" and c.text == "hello wor"
    assert d.finish_reason == "length" and d.text == "hell"


def test_stop_string_multibyte():
    n = len(TOK.encode("x"))
    raw = "ab→cd".encode("utf-8")
    runner = FakeRunner(TOK.vocab_size, script={n + i: c for i, c in enumerate(raw)})
    r = generate(runner, TOK, [req("x", max_tokens=20, stop_strings=["→"])])[0]
    assert r.finish_reason == "stop" and r.text == "ab" and len(r.token_ids) == 5


def test_mixed_batch_params_seeds_reproducible_and_batch_independent():
    reqs = [
        req("one", max_tokens=12, temperature=1.0, seed=1, logprobs=True),
        req("two two", max_tokens=5, temperature=0.0),
        req("three", max_tokens=9, temperature=0.8, top_k=20, seed=2),
        req("four", max_tokens=12, temperature=1.2, top_p=0.7, seed=3, logprobs=True),
    ]
    runner = FakeRunner(TOK.vocab_size)
    out1 = generate(runner, TOK, reqs)
    out2 = generate(FakeRunner(TOK.vocab_size), TOK, reqs)
    assert [o.token_ids for o in out1] == [o.token_ids for o in out2]
    for o, r in zip(out1, reqs):
        assert len(o.token_ids) <= r.max_tokens
        assert (o.logprobs is not None) == r.logprobs
    # each request alone gives the same output as in the batch
    for i, r in enumerate(reqs):
        solo = generate(FakeRunner(TOK.vocab_size), TOK, [r])[0]
        assert solo.token_ids == out1[i].token_ids
    # a different seed changes the sampled request
    other = generate(FakeRunner(TOK.vocab_size), TOK, [req("one", max_tokens=12, temperature=1.0, seed=99)])[0]
    assert other.token_ids != out1[0].token_ids


def test_uses_runner_sampler_when_present():
    class Spy(Sampler):
        calls = 0

        def sample(self, *a, **kw):
            Spy.calls += 1
            return super().sample(*a, **kw)

    runner = FakeRunner(TOK.vocab_size)
    runner.sampler = Spy(n_valid=TOK.n_real_tokens)
    r = generate(runner, TOK, [req(max_tokens=3, temperature=0.5, seed=4)])[0]
    assert Spy.calls == len(r.token_ids) >= 1


def test_zero_max_tokens_and_validation():
    runner = FakeRunner(TOK.vocab_size)
    r = generate(runner, TOK, [req(max_tokens=0)])[0]
    assert r.token_ids == [] and r.finish_reason == "length" and runner.calls["prefill"] == 0
    assert generate(runner, TOK, []) == []
    with pytest.raises(ValueError, match="empty prompt"):
        generate(runner, TOK, [GenerationRequest(prompt_ids=[])])
    with pytest.raises(ValueError, match="top_p"):
        generate(runner, TOK, [req(temperature=1.0, top_p=0.0)])


def test_fast_sampler_in_the_loop_gives_the_same_tokens(monkeypatch):
    """The loop with the fused Triton sampler (interpreter) = the loop with the standard one."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from optimized_model.k3.fast.kernels import sampler as fs

    if not fs.interpreter_on():
        pytest.skip("Triton interpreter not available")
    reqs = [req("a", max_tokens=4, temperature=0.9, top_k=30, top_p=0.9, seed=5),
            req("b", max_tokens=3, temperature=0.0)]
    std = generate(FakeRunner(TOK.vocab_size), TOK, reqs)
    runner = FakeRunner(TOK.vocab_size)
    runner.sampler = fs.FastSampler(n_valid=TOK.n_real_tokens)
    with trace.recording() as rec:
        fast = generate(runner, TOK, reqs)
    assert [o.token_ids for o in fast] == [o.token_ids for o in std]
    assert len(rec.engaged("sampler")) == runner.calls["decode"] + 1
