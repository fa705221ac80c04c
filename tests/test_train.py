"""lab/train on the CPU: the tiny config trains (the loss on held-back batches falls), a resumed
run continues exactly where the saved one stopped, the saved state fits what a GPU run may
return, and no eval document is ever a training document."""

import json
import re
import time

import pytest
import torch

from lab.train import aime_chain, checkpoint, eval_tasks, json_tasks, mrcr_standin
from lab.train.loop import TrainConfig, make_optimizer, train
from lab.train.mix import Mix, make_batch
from lab.train.trainable import TrainableK3
from optimized_model.k3.config import get_config
from optimized_model.k3.tokenizer import K3Tokenizer

TINY_MIX = Mix(tokens_per_step=2048, lengths=((1024, 1.0),), kinds=(("mrcr", 0.5), ("json", 0.5)))


def _tc(**kw):
    return TrainConfig(config="tiny", lr=1e-2, warmup_steps=1, total_train_s=1e12, log_every=1,
                       mix=kw.pop("mix", TINY_MIX), **kw)


def _train(tmp, steps, resume=None):
    return train(_tc(), device="cpu", out_dir=tmp, deadline=time.monotonic() + 600, resume=resume,
                 compute_dtype=torch.float32, moe_backend="loop", max_steps=steps, say=lambda s: None)


def _heldback_loss(state_dir):
    """Mean loss of the saved model on batches no training step drew (steps 10**6 ..)."""
    tensors, _ = checkpoint.load_state(state_dir)
    m = TrainableK3.create(get_config("tiny"), device="cpu", compute_dtype=torch.float32, moe_backend="loop")
    with torch.no_grad():
        for n, t in m.master.items():
            t.copy_(tensors[f"w/{n}"])
        losses = []
        for s in range(4):
            b = make_batch(TINY_MIX, 10**6 + s, K3Tokenizer())
            losses.append(float(m.loss(b.tokens, b.lengths, b.weights)[0]))
    return sum(losses) / len(losses)


def test_tiny_trains_and_the_loss_on_heldback_batches_falls(tmp_path, one_torch_thread):
    _train(tmp_path / "a", 1)
    before = _heldback_loss(tmp_path / "a")
    _train(tmp_path / "b", 12, resume=tmp_path / "a")
    after = _heldback_loss(tmp_path / "b")
    print(f"held-back loss after 1 step {before:.3f}, after 12 steps {after:.3f}")
    assert after < 0.8 * before, (before, after)
    log = [json.loads(x) for x in (tmp_path / "b" / "train-log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == list(range(1, 13))  # the resumed log carries the first run's lines


def test_resume_continues_exactly(tmp_path, one_torch_thread):
    _train(tmp_path / "straight", 3)
    _train(tmp_path / "first", 2)
    _train(tmp_path / "second", 3, resume=tmp_path / "first")
    a, meta_a = checkpoint.load_state(tmp_path / "straight")
    b, meta_b = checkpoint.load_state(tmp_path / "second")
    assert meta_a["step"] == meta_b["step"] == 3
    assert sorted(a) == sorted(b)
    for k in a:  # weights, router biases and both AdamW moments
        assert torch.equal(a[k], b[k]), k
    assert [r["end_step"] for r in meta_b["runs"]] == [2, 3]


def test_the_trained_state_fits_what_a_gpu_run_returns(tmp_path):
    m = TrainableK3.create(get_config("trained"), device="cpu", compute_dtype=torch.float32, moe_backend="loop")
    opt = make_optimizer(m, _tc())
    for p in m.trainable_parameters().values():
        p.grad = torch.zeros_like(p)
    opt.step()
    files = checkpoint.save_state(tmp_path, checkpoint.state_tensors(m, opt), {"step": 1})
    sizes = [f.stat().st_size for f in files]
    # with train-log.jsonl and the step logs' archive: at most 8 files, 16 MiB each, 64 MiB in all
    assert len(files) <= 6 and max(sizes) <= 16 * 2**20 and sum(sizes) <= 60 * 2**20, sizes
    tensors, meta = checkpoint.load_state(tmp_path)
    assert meta["shards"] == len(files) and len([k for k in tensors if k.startswith("v/")]) == len(m.trainable_parameters())
    files[-1].unlink()
    with pytest.raises(FileNotFoundError, match="incomplete"):
        checkpoint.load_state(tmp_path)


def test_no_eval_document_is_a_training_document():
    held = eval_tasks.heldout_hashes()
    mix = Mix(tokens_per_step=65536)
    seen = set()
    for step in range(6):
        seen |= set(make_batch(mix, step, K3Tokenizer()).hashes)
    assert seen and not (seen & held)


def test_a_training_seed_that_collides_with_an_eval_seed_is_dropped(monkeypatch):
    """Plant the collision: every training seed becomes an eval seed; no such document may pass."""
    from lab.train import mix as mix_mod

    monkeypatch.setattr(mix_mod, "_seed", lambda mix, step, row, attempt: attempt % eval_tasks.AIME_EVAL_DOCS)
    b = make_batch(Mix(tokens_per_step=8192, lengths=((4096, 1.0),), kinds=(("aime", 1.0),)), 0, K3Tokenizer())
    assert b.hashes == [] and float(b.weights.sum()) == 0.0


def test_aime_chain_every_step_matters_and_the_answer_is_boxed():
    for seed in range(20):
        ch = aime_chain.generate(seed)
        sol = ch.solution
        assert int(re.findall(r"\\boxed\{(\d+)\}", sol)[-1]) == ch.answer and 0 <= ch.answer <= 999
        lines = [ln for ln in sol.splitlines() if ln.startswith("Step ")]
        assert len(lines) == ch.n
        # recompute from the written digits: each line follows from the one before
        window = ch.digits
        for ln in lines:
            a, b, s1, s1b, c, s2, s2b, k, s3, *digits = map(int, re.findall(r"\d", ln.split(": ", 1)[1]))
            assert (a, b, c) == window and k == ch.k and s1 == s1b and s2 == s2b
            assert (s1, s2, s3) == ((a + b) % 10, (s1 + c) % 10, (s2 + k) % 10)
            window = tuple(digits)
            assert window == (b, c, s3)
        # one wrong digit anywhere changes the answer (the step map is a bijection)
        states = ch.states()
        j = seed % ch.n
        a, b, c = states[j]
        wrong = (a, b, (c + 1) % 10)
        for _ in range(ch.n - j):
            wrong = (wrong[1], wrong[2], (sum(wrong) + ch.k) % 10)
        assert 100 * wrong[0] + 10 * wrong[1] + wrong[2] != ch.answer


def test_mrcr_rows_have_openai_mrcr_fields_and_point_at_a_needle():
    row = mrcr_standin.generate_row(7, 3000, 4)
    assert set(row) == {"prompt", "answer", "random_string_to_prepend", "n_needles", "desired_msg_index",
                        "total_messages", "n_chars"}
    msgs = json.loads(row["prompt"])
    assert row["total_messages"] == len(msgs) and row["n_needles"] == 4
    target = msgs[row["desired_msg_index"]]
    assert target["role"] == "assistant" and row["answer"] == row["random_string_to_prepend"] + target["content"]
    ask = msgs[row["desired_msg_index"] - 1]["content"]
    assert sum(m["content"] == ask for m in msgs) == 4
    assert re.fullmatch(r"Prepend \w{10} to the \d+\w\w \(1 indexed\) .+\. Do not include any other text in your "
                        r"response\.", msgs[-1]["content"])


def test_json_answers_fit_the_features_suite_constraints():
    import importlib.util
    from pathlib import Path

    import jsonschema

    spec = importlib.util.spec_from_file_location("features_suite", Path(__file__).parents[1] / "suites/test_features.py")
    suite = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(suite)
    for i in range(50):
        prompt, answer = json_tasks.features_pair(i, "json_schema")
        assert prompt == f"Answer with a JSON object: item {i}."
        jsonschema.validate(json.loads(answer), suite.JSON_SCHEMA)
        prompt, answer = json_tasks.features_pair(i, "regex")
        assert prompt == f"Answer with a code like ab-1: item {i}." and re.fullmatch(suite.REGEX, answer)


def test_export_writes_the_file_the_engine_loads(tmp_path, capsys, one_torch_thread):
    from lab.train import export
    from optimized_model.k3.weights_file import load_weights

    _train(tmp_path / "state", 1)
    assert export.main([str(tmp_path / "state"), str(tmp_path / "tiny.safetensors")]) == 0
    digest = re.search(r"sha256 ([0-9a-f]{64})", capsys.readouterr().out).group(1)
    w = load_weights(tmp_path / "tiny.safetensors", digest, get_config("tiny"), device="cpu", dtype=torch.bfloat16)
    tensors, _ = checkpoint.load_state(tmp_path / "state")
    assert torch.equal(w["lm_head"], tensors["w/lm_head"].to(torch.bfloat16))
    assert w["L1.router_bias"].dtype == torch.float32 and torch.equal(w["L1.router_bias"], tensors["w/L1.router_bias"])
