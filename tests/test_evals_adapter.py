"""FastpathLM, lm-eval's LM over a fastpath engine (the tiny K3-mini on CPU): registered by
name, chat turns from a document's message list, generation kwargs, per-request seeds that do
not depend on the batch, and loglikelihood through teacher-forced decode steps (the fast path's)."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance  # noqa: E402

from fastpath import trace  # noqa: E402
from fastpath.engine import create_engine  # noqa: E402
from fastpath.evals.adapter import FastpathLM  # noqa: E402

SWITCH = {"decode_backend": "latency_specialized"}


@pytest.fixture(scope="module")
def engine(one_torch_thread):
    return create_engine("embedded", config="tiny", device="cpu", dtype="float16", threads=1)


def gen(doc, ctx, kwargs, task="t", doc_id=0):
    return Instance("generate_until", doc, (ctx, kwargs), 0, (task, doc_id, 1))


def test_registered_by_name_and_buildable_from_model_args():
    from lm_eval.api.registry import get_model

    assert get_model("fastpath") is FastpathLM
    lm = FastpathLM.create_from_arg_string("engine=embedded,path=standard,config=tiny,device=cpu,dtype=float32")
    assert lm.model.path == "standard"
    with pytest.raises(ValueError, match="KEY:VALUE"):
        FastpathLM(engine="embedded", path="fast", switch="decode_backend", config="tiny", device="cpu")


def test_chat_turns_come_from_the_documents_message_list(engine):
    std = engine.load("standard")
    lm = FastpathLM(std, messages_fields={"mrcr": "prompt"})
    msgs = [{"role": "user", "content": "write a poem about owls"}, {"role": "assistant", "content": "Owls:\nhoot"},
            {"role": "user", "content": "Prepend ab to the 1st poem about owls."}]
    conv = gen({"prompt": json.dumps(msgs)}, "rendered text, not used", {"max_gen_toks": 2}, task="mrcr")
    plain = gen({"problem": "x"}, "Question: x\nAnswer:", {"max_gen_toks": 2}, task="aime")
    lm.generate_until([conv, plain])
    assert lm.records[("mrcr", 0, 0)]["prompt_tokens"] == len(std.tokenizer.apply_chat_template(msgs))
    one_turn = std.tokenizer.apply_chat_template([{"role": "user", "content": "Question: x\nAnswer:"}])
    assert lm.records[("aime", 0, 0)]["prompt_tokens"] == len(one_turn)


def test_generation_kwargs_map_to_the_request(engine):
    std = engine.load("standard")
    lm = FastpathLM(std)
    [free] = lm.generate_until([gen({}, "hello", {"max_gen_toks": 6, "until": []})])
    rec = lm.records[("t", 0, 0)]
    assert len(rec["token_ids"]) == 6 and rec["finish_reason"] == "length" and len(rec["logprobs"]) == 6
    stop = free[2:4]  # a stop string the same request must generate: the text is cut before it
    lm2 = FastpathLM(std)
    [cut] = lm2.generate_until([gen({}, "hello", {"max_gen_toks": 6, "until": [stop]})])
    assert free.startswith(cut) and stop not in cut and lm2.records[("t", 0, 0)]["finish_reason"] == "stop"


def test_seeds_follow_the_request_not_its_batch(engine):
    std = engine.load("standard")
    sample = {"max_gen_toks": 5, "do_sample": True, "temperature": 1.0}
    reqs = [gen({}, f"prompt {i} " * (i + 1), sample, doc_id=i) for i in range(4)] + [gen({}, "prompt 0 ", sample)]
    together = FastpathLM(std, max_batch=8)
    apart = FastpathLM(std, max_batch=1, reverse=True)
    assert together.generate_until(reqs) == apart.generate_until(reqs)
    # the second occurrence of document 0 is its repeat 1: another seed, so (here) another sample
    assert together.records[("t", 0, 0)]["token_ids"] != together.records[("t", 0, 1)]["token_ids"]


def test_loglikelihood_is_the_teacher_forced_score_from_decode_steps(engine):
    std, fast = engine.load("standard"), engine.load("fast", additional_config=SWITCH)
    ctx, cont = "The owl", " hoots"
    req = Instance("loglikelihood", {}, (ctx, cont), 0, ("t", 0, 1))
    ids = std.tokenizer.apply_chat_template([{"role": "user", "content": ctx}])
    tail = std.tokenizer.encode(cont, bos=False)
    # the continuation's rows from decode steps: prefill stops before the context's last token
    logits = std.score([ids + tail], prefill_len=len(ids) - 1)[0].double().log_softmax(-1)
    rows = logits[len(ids) - 1:len(ids) + len(tail) - 1]
    want = float(rows.gather(1, torch.as_tensor(tail)[:, None]).sum())
    [(lp, greedy)] = FastpathLM(std).loglikelihood([req])
    assert lp == pytest.approx(want, abs=1e-9) and greedy == bool((rows.argmax(-1) == torch.as_tensor(tail)).all())
    short = Instance("loglikelihood", {}, (ctx, " h"), 0, ("t", 1, 1))
    with trace.recording() as rec:
        [(lp_fast, _)] = FastpathLM(fast).loglikelihood([short])
    assert {e.component for e in rec.engaged()} >= {"mla_decode", "kda_decode"}  # decode steps, fast path
    [(lp_std, _)] = FastpathLM(std).loglikelihood([short])
    assert lp_fast == pytest.approx(lp_std, abs=5e-3)
