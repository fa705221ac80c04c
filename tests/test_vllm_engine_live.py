"""The vllm engine, live on vLLM's CPU build: the fixture plugin model (a tiny random Llama with
a switchable "fast path", tests/doubles/vllm_plugin) loaded once with the switch on.
Generation (seeded sampling, regex and JSON-schema structured outputs, logprobs), teacher-forced
scoring through real decode steps, the decode / prefill / mixed steps' trace events from vLLM's
worker process, vLLM's own backend log lines and its decode latency."""

from __future__ import annotations

import json
import math
import os
import re

import pytest

from fastpath import trace
from fastpath.engine import GenerationRequest, create_engine

from vllm_live import SWITCH, engine_options, make_fixture_model, network_interfaces, requires_vllm

pytestmark = requires_vllm

# Bounded fields: a random model fills an unbounded integer with digits up to max_tokens, and
# writes raw control characters into a free string (xgrammar's JSON grammar admits them;
# Python's strict json rejects them).
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "pattern": "^[a-z ]{1,8}$"},
                                           "ok": {"type": "boolean"}, "tag": {"enum": ["x", "y", "z"]}},
          "required": ["name", "ok", "tag"], "additionalProperties": False}


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    model_dir = make_fixture_model(tmp_path_factory.mktemp("model"))
    eng = create_engine("vllm", **engine_options(model_dir))
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def fast(engine):
    return engine.load("fast", additional_config=dict(SWITCH))


def test_runs_with_only_loopback_when_ci_says_so():
    if os.environ.get("FASTPATH_VLLM_NETNS") != "1":
        pytest.skip("not run under .ci/vllm-tests' network namespace")
    assert network_interfaces() == ["lo"]


def test_seeded_sampling_is_reproducible_and_the_seed_matters(fast):
    prompt = fast.tokenizer.encode("the model reads a long document")
    reqs = [GenerationRequest(prompt, max_tokens=12, temperature=1.0, top_p=0.95, top_k=50, seed=s, ignore_eos=True)
            for s in (1, 1, 2, 3)]
    a, b, c, d = fast.generate(reqs)
    assert len(a.token_ids) == 12 and a.finish_reason == "length"
    assert a.token_ids == b.token_ids
    assert len({tuple(a.token_ids), tuple(c.token_ids), tuple(d.token_ids)}) > 1


def test_regex_structured_output(fast):
    prompt = fast.tokenizer.encode("prices dates names")
    pattern = r"[0-9]{3}-[a-z]{2,4}"
    outs = fast.generate([GenerationRequest(prompt, max_tokens=16, temperature=0.8, seed=s,
                                            structured={"regex": pattern}) for s in range(3)])
    for o in outs:
        assert re.fullmatch(pattern, o.text), o.text


def test_json_schema_structured_output(fast):
    jsonschema = pytest.importorskip("jsonschema")
    prompt = fast.tokenizer.encode("json records")
    outs = fast.generate([GenerationRequest(prompt, max_tokens=64, temperature=0.7, seed=s,
                                            structured={"json_schema": SCHEMA}) for s in range(2)])
    for o in outs:
        assert o.finish_reason == "stop", o.text  # the grammar ended it
        jsonschema.validate(json.loads(o.text), SCHEMA)


def test_logprobs_are_the_chosen_tokens(fast):
    prompt = fast.tokenizer.encode("the decoder keeps its state")
    (o,) = fast.generate([GenerationRequest(prompt, max_tokens=6, logprobs=True, ignore_eos=True)])
    assert o.logprobs is not None and len(o.logprobs) == 6
    assert all(math.isfinite(x) and x <= 0.0 for x in o.logprobs)


def test_score_runs_decode_steps_on_the_fast_path_and_matches_generation(fast):
    """Greedy generation's logprobs equal the teacher-forced rows of the same sequence, and
    every row from the prefill on comes from a step the trace shows on the fast path."""
    prompt = fast.tokenizer.encode("alike including json records regex")
    (g,) = fast.generate([GenerationRequest(prompt, max_tokens=8, logprobs=True, ignore_eos=True)])
    seq = prompt + g.token_ids
    p = len(prompt)
    (rows,) = fast.score([seq], prefill_len=p)
    assert tuple(rows.shape) == (len(seq), fast.tokenizer.vocab_size)
    for k, tok in enumerate(g.token_ids):
        row = rows[p - 1 + k]
        assert int(row.argmax()) == tok  # greedy: the forced token is the model's own choice
        assert abs(float(row[tok]) - g.logprobs[k]) < 1e-4
    (flags,) = fast.last_score_fast_rows
    assert flags[:p] == [False] * p  # prompt rows and the prefill step's sample
    assert flags[p:] == [True] * (len(seq) - p)  # decode steps, batch 1: in the fixture's scope


def test_forced_tokens_are_not_the_models_choice(fast):
    """Forcing is real: a sequence the model would never generate is scored position by position."""
    ids = fast.tokenizer.encode("the the the numbers")
    seq = ids + [ids[-1]] * 6
    (rows,) = fast.score([seq], prefill_len=len(ids))
    assert rows.shape[0] == len(seq)
    assert all(math.isfinite(float(rows[i][seq[i + 1]])) for i in range(len(seq) - 1))


def test_decode_step_engages_in_the_worker_rank_tagged(fast):
    step = fast.decode_step(2, 24)
    with trace.recording() as rec:
        step()
        step()
    events = rec.engaged("lm_head")
    assert len(events) == 2, rec.events
    assert all(e.shape_dict() == {"batch": 2} and e.rank == 0 for e in events)
    assert not rec.refused()


@pytest.mark.parametrize("kind, batch, reason", [("prefill", 2, "prefill"), ("mixed", 3, "mixed_batch"),
                                                 ("decode", 6, "batch_out_of_scope")])
def test_out_of_scope_steps_refuse_with_the_reason(fast, kind, batch, reason):
    step = {"prefill": fast.prefill_step, "mixed": fast.mixed_step,
            "decode": lambda b, c: fast.decode_step(b, c)}[kind](batch, 20)
    with trace.recording() as rec:
        step()
    assert not rec.engaged(), rec.events
    assert {e.detail for e in rec.refused("lm_head")} == {reason}


def test_vllm_backend_log_lines_are_evidence(engine, fast):
    rows = engine.info()["vllm_log"]
    kinds = {r["kind"] for r in rows}
    assert {"engine", "kv_cache_layout"} <= kinds, rows
    assert any(r["kind"] == "engine" and r["version"] == engine.vllm.__version__ for r in rows)


def test_decode_latency_is_vllms_own_measure(fast):
    lat = fast.decode_latency(batch=2, context=16, tokens=6)
    assert lat["requests"] == 2 and 0.0 < lat["per_token_s_median"] <= lat["per_token_s_max"] < 60.0


def test_vllms_profiler_hook_shows_the_fast_kernel_only_on_fast_steps(fast):
    """torch.profiler through vLLM's own hook, in its worker: the fixture's fast LM head (a
    record_function annotation on CPU) appears in decode steps and not in prefill steps."""
    from fastpath_vllm_fixture.fast_head import PROFILE_NAME

    decode = fast.profile_names(fast.decode_step(2, 16), 2)
    prefill = fast.profile_names(fast.prefill_step(2, 16), 1)
    assert PROFILE_NAME in decode, decode[:50]
    assert PROFILE_NAME not in prefill
    assert any(n.startswith("aten::") for n in prefill)  # the capture itself worked
