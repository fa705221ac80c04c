"""Structured output through xgrammar bitmasks, end to end through generate()."""

from __future__ import annotations

import json
import re

import pytest
import torch

pytest.importorskip("xgrammar", reason="structured output needs xgrammar")
import jsonschema  # noqa: E402

from fastpath.engine import GenerationRequest  # noqa: E402
from optimized_model.k3.generate import generate  # noqa: E402
from optimized_model.k3.sampling import bitmask_to_bool  # noqa: E402
from optimized_model.k3.structured import GrammarCompilerCache, StructuredBatch, grammar_key  # noqa: E402
from optimized_model.k3.tokenizer import K3Tokenizer  # noqa: E402

TOK = K3Tokenizer()

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
    },
    "required": ["name", "age", "ok"],
    "additionalProperties": False,
}
REGEX = r"(cat|dog)-[0-9]{2,4}(\.[a-z]{1,3})?"


class RandomRunner:
    """Random logits (fresh every step, per row), padding ids boosted: a worst-case 'model'."""

    def __init__(self, seed: int = 0):
        self.vocab_size = TOK.vocab_size
        self.device = "cpu"
        self.gen = torch.Generator().manual_seed(seed)

    def _logits(self, B):
        x = torch.randn(B, self.vocab_size, generator=self.gen) * 3.0
        x[:, TOK.n_real_tokens:] = 1e4
        return x

    def prefill(self, prompts):
        return self._logits(len(prompts)), None

    def decode(self, tokens, state):
        return self._logits(tokens.shape[0])


def _req(structured, seed, temperature=1.0, **kw):
    return GenerationRequest(prompt_ids=TOK.encode("go"), max_tokens=400, temperature=temperature,
                             seed=seed, structured=structured, **kw)


def test_json_schema_samples_parse_and_validate():
    reqs = [_req({"json_schema": SCHEMA}, seed=s) for s in range(20)]
    outs = generate(RandomRunner(1), TOK, reqs)
    texts = set()
    for o in outs:
        assert o.finish_reason == "grammar", (o.finish_reason, o.text)
        assert o.token_ids[-1] == TOK.eos_id
        obj = json.loads(o.text)
        jsonschema.validate(obj, SCHEMA)
        texts.add(o.text)
    assert len(texts) > 10  # temperature 1.0 really sampled


def test_regex_samples_fullmatch_and_mixed_with_unconstrained():
    reqs = [_req({"regex": REGEX}, seed=s, temperature=1.0 if s % 2 else 0.0) for s in range(12)]
    reqs.append(_req(None, seed=3, max_tokens=5) if False else GenerationRequest(
        prompt_ids=TOK.encode("free"), max_tokens=5, temperature=1.0, seed=3))
    outs = generate(RandomRunner(2), TOK, reqs)
    for o in outs[:-1]:
        assert o.finish_reason == "grammar"
        assert re.fullmatch(REGEX, o.text), o.text
    free = outs[-1]
    assert free.finish_reason in ("length", "stop") and len(free.token_ids) <= 5


def test_unconstrained_generation_violates_the_regex():
    """Negative control: without the grammar the same random model does not produce matches."""
    outs = generate(RandomRunner(2), TOK, [GenerationRequest(prompt_ids=TOK.encode("go"), max_tokens=8,
                                                             temperature=1.0, seed=s) for s in range(5)])
    assert not any(re.fullmatch(REGEX, o.text) for o in outs)


def test_bitmask_rows_and_layout():
    sb = StructuredBatch(TOK, [{"regex": "ab"}, None])
    mask = sb.fill_bitmask()
    assert mask.shape == (2, (TOK.vocab_size + 31) // 32) and mask.dtype == torch.int32
    allowed = bitmask_to_bool(mask, TOK.vocab_size)
    assert torch.nonzero(allowed[0]).flatten().tolist() == [ord("a")]
    assert allowed[1].all()  # unconstrained row: all ones
    assert sb.accept(0, ord("a")) and not sb.terminated(0)
    assert torch.nonzero(bitmask_to_bool(sb.fill_bitmask(), TOK.vocab_size)[0]).flatten().tolist() == [ord("b")]
    assert sb.accept(0, ord("b"))
    # complete: only the stop token (eos); never specials or padding
    allowed = bitmask_to_bool(sb.fill_bitmask(), TOK.vocab_size)[0]
    assert torch.nonzero(allowed).flatten().tolist() == [TOK.eos_id]
    assert sb.accept(0, TOK.eos_id) and sb.terminated(0)
    assert StructuredBatch(TOK, [None, None]).fill_bitmask() is None


def test_specials_never_allowed_inside_json():
    sb = StructuredBatch(TOK, [{"json_schema": SCHEMA}])
    for ch in b'{"name": "':
        assert sb.accept(0, ch)
    allowed = bitmask_to_bool(sb.fill_bitmask(), TOK.vocab_size)[0]
    assert not allowed[256:].any()
    assert allowed[ord("x")] and allowed[0xE2]  # ASCII and a UTF-8 lead byte inside a string


def test_utf8_and_control_guard():
    """xgrammar 0.2.9 admits invalid UTF-8 and (under maxLength) raw control characters; the
    guard removes them: after lead byte 0xE0 only 0xA0-0xBF may follow, after 0xF4 only 0x80-0x8F,
    bytes 0xC0/0xC1/0xF5+ never start a character, and JSON rows never get bytes < 0x20."""
    sb = StructuredBatch(TOK, [{"json_schema": SCHEMA}, {"regex": "[^a]{1,4}"}])
    for ch in b'{"name": "':
        assert sb.accept(0, ch)
    allowed = bitmask_to_bool(sb.fill_bitmask(), TOK.vocab_size)
    assert not allowed[0, :0x20].any() and allowed[1, 0x01]  # control bytes: JSON row only
    for row in (0, 1):
        assert not allowed[row, [0x80, 0xBF, 0xC0, 0xC1, 0xF5, 0xFF]].any() and allowed[row, 0xE0]
    assert sb.accept(0, 0xE0) and sb.accept(1, 0xF4)
    allowed = bitmask_to_bool(sb.fill_bitmask(), TOK.vocab_size)
    assert torch.nonzero(allowed[0]).flatten().tolist() == list(range(0xA0, 0xC0))
    assert torch.nonzero(allowed[1]).flatten().tolist() == list(range(0x80, 0x90))


def test_grammar_key_and_errors():
    # property order is part of the grammar: the key keeps it
    assert grammar_key({"json_schema": {"b": 1, "a": 2}}) == ("json_schema", '{"b": 1, "a": 2}')
    assert grammar_key({"json_schema": {"a": 2, "b": 1}}) != grammar_key({"json_schema": {"b": 1, "a": 2}})
    for bad in ({"grammar": "x"}, {"regex": 3}, {}, {"regex": "a", "json_schema": {}}):
        with pytest.raises(ValueError):
            grammar_key(bad)
    cache = GrammarCompilerCache.for_tokenizer(TOK)
    assert cache is GrammarCompilerCache.for_tokenizer(K3Tokenizer())
    assert cache.compile({"regex": "ab"}) is cache.compile({"regex": "ab"})
