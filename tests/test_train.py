"""lab/train on the CPU: the tiny config trains (the loss on held-back batches falls), a resumed
run continues exactly where the saved one stopped, the saved state fits what a GPU run may
return, no eval document is ever a training document, and training documents are the evals
suite's, rendered as its adapter sends them."""

import dataclasses
import json
import math
import re
import time

import pytest
import torch

from fastpath.evals import aime, mrcr
from lab.train import checkpoint, copy_tasks, eval_tasks, json_tasks, probe
from lab.train.loop import TrainConfig, _Batches, make_optimizer, train
from lab.train.mix import KINDS, Mix, make_batch, parse_kinds, parse_needles
from lab.train.trainable import TrainableK3
from optimized_model.k3.config import get_config
from optimized_model.k3.tokenizer import K3Tokenizer

TINY_MIX = Mix(tokens_per_step=2048, lengths=((1024, 1.0),), kinds=(("mrcr", 0.5), ("json", 0.5)), short_steps=0,
               copy_steps=0)


def _tc(**kw):
    return TrainConfig(config="tiny", lr=1e-2, warmup_steps=1, total_train_s=1e12, log_every=1,
                       mix=kw.pop("mix", TINY_MIX), **kw)


def _train(tmp, steps, resume=None):
    return train(_tc(), device="cpu", out_dir=tmp, deadline=time.monotonic() + 600, resume=resume,
                 compute_dtype=torch.float32, moe_backend="loop", max_steps=steps, say=lambda s: None)


def _init_from(tc, source, out, said):
    """A fine-tune's start from ``source`` (a state folder or a weights file), no step taken."""
    return train(tc, device="cpu", out_dir=out, deadline=time.monotonic() + 600, compute_dtype=torch.float32,
                 moe_backend="loop", max_steps=0, say=said.append, init_from=source)


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


def test_a_resumed_run_changes_its_aime_style_and_schedule_from_its_step_on_and_keeps_them(tmp_path, one_torch_thread):
    aime_mix = dataclasses.replace(TINY_MIX, lengths=((2048, 1.0),), kinds=(("aime", 1.0),), aime_style="columns")
    said = []

    def run(out, steps, **kw):
        return train(_tc(mix=aime_mix), device="cpu", out_dir=out, deadline=time.monotonic() + 600,
                     compute_dtype=torch.float32, moe_backend="loop", max_steps=steps, say=said.append, **kw)

    run(tmp_path / "first", 1)
    first_total = _tc().total_train_s
    run(tmp_path / "second", 2, resume=tmp_path / "first", mix_changes={"aime_style": "listed"},
        schedule_s=first_total * 2)
    _, meta = checkpoint.load_state(tmp_path / "second")
    resumed = TrainConfig.from_json(meta["train_config"])
    assert resumed.mix.aime_style == "listed" and resumed.total_train_s == first_total * 2
    assert [r.get("mix_changes") for r in meta["runs"]] == [None, {"aime_style": "listed"}]
    assert [r.get("total_train_s") for r in meta["runs"]] == [None, first_total * 2]
    assert any('from step 1 on: {"aime_style": "listed"}' in s for s in said)
    assert any(f"schedule is {first_total * 2:.0f} s of training from step 1 on" in s for s in said)
    later = make_batch(dataclasses.replace(aime_mix, aime_style="listed"), 1, K3Tokenizer())
    assert "The operations:" in K3Tokenizer().decode(later.tokens[0].tolist())


def test_a_trial_starts_from_a_states_weights_with_a_fresh_optimizer(tmp_path, one_torch_thread):
    _train(tmp_path / "trained", 2)
    said = []
    _init_from(_tc(), tmp_path / "trained", tmp_path / "trial", said)
    start, _ = checkpoint.load_state(tmp_path / "trained")
    trial, meta = checkpoint.load_state(tmp_path / "trial")
    assert meta["step"] == 0 and any("a fresh optimizer, step 0" in s for s in said)
    for name in (k for k in start if k.startswith("w/")):
        assert torch.equal(trial[name], start[name]), name
    assert all(float(trial[k].abs().max()) == 0.0 for k in trial if k.startswith(("m/", "v/")))


def test_a_fine_tune_starts_from_the_engines_weights_file_when_the_state_is_gone(tmp_path, capsys, one_torch_thread):
    from lab.train import export

    _train(tmp_path / "state", 1)
    assert export.main([str(tmp_path / "state"), str(tmp_path / "w.safetensors")]) == 0
    said = []
    _init_from(_tc(), tmp_path / "w.safetensors", tmp_path / "ft", said)
    start, _ = checkpoint.load_state(tmp_path / "state")
    ft, meta = checkpoint.load_state(tmp_path / "ft")
    assert any("(step 1); a fresh optimizer, step 0" in s for s in said)
    assert meta["runs"][-1]["init_from"] == {"path": str(tmp_path / "w.safetensors"), "step": 1}
    # the file's bf16 weights upcast; the router and its bias, kept fp32 in the file, exactly
    assert torch.equal(ft["w/lm_head"], start["w/lm_head"].to(torch.bfloat16).float())
    assert not torch.equal(ft["w/lm_head"], start["w/lm_head"])
    assert torch.equal(ft["w/L1.router_bias"], start["w/L1.router_bias"])
    with pytest.raises(SystemExit, match="lacks .* of the trained config's weights"):
        _init_from(dataclasses.replace(_tc(), config="trained"), tmp_path / "w.safetensors", tmp_path / "bad", said)


def test_a_run_fine_tunes_the_committed_weights_without_the_curriculum(tmp_path, monkeypatch, one_torch_thread):
    from lab.train import run

    monkeypatch.setenv("TRITON_CACHE_AUTOTUNING", "1")  # run.main sets it for the process; undone after

    with pytest.raises(SystemExit, match="--resume and --init-from exclude each other"):
        run.main(["--resume", str(tmp_path), "--init-from", str(tmp_path / "w.safetensors")])
    weights = "optimized_model/k3/checkpoints/trained.safetensors"
    assert run.main(["--init-from", weights, "--device", "cpu", "--workers", "0", "--budget", "0",
                     "--lr", "2e-4", "--copy-ordinal", "0.5", "--out", str(tmp_path / "ft")]) == 0
    _, meta = checkpoint.load_state(tmp_path / "ft")
    mix = meta["train_config"]["mix"]
    assert (meta["step"], mix["short_steps"], mix["copy_steps"], mix["copy_ordinal"]) == (0, 0, 0, 0.5)
    assert meta["runs"][-1]["init_from"] == {"path": weights, "step": 5261}
    assert meta["train_config"]["lr"] == 2e-4


def test_a_runs_row_lengths_and_curriculum_are_set_fresh_and_changed_on_resume(tmp_path, monkeypatch,
                                                                              one_torch_thread):
    """--lengths and --short-steps set a fresh run's mix; on --resume they change it from the state's step on."""
    from lab.train import run

    monkeypatch.setenv("TRITON_CACHE_AUTOTUNING", "1")
    common = ["--config", "tiny", "--device", "cpu", "--workers", "0", "--budget", "0"]
    assert run.main(common + ["--lengths", "2048=0.5,8192=0.5", "--short-steps", "800",
                              "--out", str(tmp_path / "a")]) == 0
    mix = checkpoint.load_state(tmp_path / "a")[1]["train_config"]["mix"]
    assert (mix["lengths"], mix["short_steps"]) == ([[2048, 0.5], [8192, 0.5]], 800)
    assert run.main(common + ["--resume", str(tmp_path / "a"), "--lengths", "16384=1", "--short-steps", "0",
                              "--out", str(tmp_path / "b")]) == 0
    meta = checkpoint.load_state(tmp_path / "b")[1]
    assert meta["runs"][-1]["mix_changes"] == {"lengths": [[16384, 1.0]], "short_steps": 0}
    assert (meta["train_config"]["mix"]["lengths"], meta["train_config"]["mix"]["short_steps"]) == ([[16384, 1.0]], 0)
    with pytest.raises(SystemExit, match="--lengths"):
        run.main(common + ["--lengths", "32=1", "--out", str(tmp_path / "c")])


def test_the_cpus_mixers_recompute_in_the_backward_to_the_same_gradients(monkeypatch, one_torch_thread):
    from optimized_model.k3.model import K3Model

    def grads():
        m = TrainableK3.create(get_config("tiny"), device="cpu", compute_dtype=torch.float32, moe_backend="loop")
        b = make_batch(TINY_MIX, 3, K3Tokenizer())
        loss, _ = m.loss(b.tokens[:, :256], b.lengths.clamp(max=256), b.weights[:, :256])
        loss.backward()
        return {n: p.grad.clone() for n, p in m.trainable_parameters().items()}

    calls, states = [], []
    real = torch.utils.checkpoint.checkpoint
    monkeypatch.setattr(torch.utils.checkpoint, "checkpoint", lambda *a, **k: calls.append(1) or real(*a, **k))
    new_state = TrainableK3.new_state
    monkeypatch.setattr(TrainableK3, "new_state", lambda self, *a: states.append(new_state(self, *a)) or states[-1])
    recomputed = grads()
    # no graph in the step's state: one there kept each step's activations alive (+4 GB a step)
    assert states and all(t.grad_fn is None for t in states[0].tensors())
    monkeypatch.setattr(TrainableK3, "new_state", new_state)
    cfg = get_config("tiny")
    assert len(calls) == cfg.n_layers, "not every mixer ran under activation checkpointing"
    monkeypatch.setattr(TrainableK3, "kda_prefill", K3Model.kda_prefill)
    monkeypatch.setattr(TrainableK3, "mla_prefill", K3Model.mla_prefill)
    kept = grads()
    for name, g in kept.items():
        torch.testing.assert_close(recomputed[name], g, rtol=1e-5, atol=1e-7, msg=name)


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
    """Every eval document of both tiers (MRCR every bucket, AIME) is held out, and none occurs in
    the training batches of a sample of steps."""
    held = eval_tasks.heldout_hashes()
    spec = eval_tasks._spec().evals
    for tier in eval_tasks.TIERS:
        docs = eval_tasks.eval_documents(tier)
        buckets = {mrcr.bucket_of(eval_tasks.count_tokens(K3Tokenizer())(mrcr.messages(d))) for d in docs["mrcr"]}
        assert buckets == set(spec["mrcr"][tier]["buckets"]) and len(docs["aime25"]) == spec["aime25"][tier]["docs"]
        assert {eval_tasks.document_hash(t, d) for t, ds in docs.items() for d in ds} <= held
    mix = Mix(tokens_per_step=65536)
    seen, kinds = set(), set()
    # the copy-first steps, the curriculum's mix, the long table
    for step in (0, 1, mix.copy_steps, mix.copy_steps + 1, mix.copy_steps + 2, mix.short_steps, mix.short_steps + 1):
        b = make_batch(mix, step, K3Tokenizer())
        seen |= set(b.hashes)
        kinds |= set(b.kinds)
    assert kinds == set(KINDS) and not (seen & held)


@pytest.mark.parametrize("kind, task", [("aime", "aime25"), ("mrcr", "mrcr")])
def test_a_training_document_that_is_an_eval_document_is_dropped(monkeypatch, kind, task):
    """Plant the collision: the training generator returns eval documents; none may pass."""
    planted = eval_tasks.eval_documents("smoke")[task]
    monkeypatch.setattr(eval_tasks, "aime_row", lambda seed, steps: planted[seed % len(planted)])
    monkeypatch.setattr(eval_tasks, "mrcr_row", lambda seed, target, tok, needles=None: planted[seed % len(planted)])
    b = make_batch(Mix(tokens_per_step=8192, lengths=((4096, 1.0),), kinds=((kind, 1.0),), short_steps=0, copy_steps=0), 0,
                   K3Tokenizer())
    assert b.hashes == [] and float(b.weights.sum()) == 0.0


def test_training_mrcr_rows_are_the_suites_and_their_lengths_span_1k_to_16k():
    tok = K3Tokenizer()
    lengths = []
    for step in range(40):
        b = make_batch(Mix(tokens_per_step=16384, short_steps=0, copy_steps=0), step, tok)
        rows = b.kind_ids[:, 0] == KINDS.index("mrcr")
        lengths += b.lengths[rows].tolist()
    assert min(lengths) < 1600 and max(lengths) > 14000 and max(lengths) <= 16384, (min(lengths), max(lengths))
    row = eval_tasks.mrcr_row(eval_tasks.TRAIN_SEED_BASE + 7, 3000, tok)
    assert set(row) == set(mrcr.FIELDS) and len(tok.apply_chat_template(mrcr.messages(row))) <= 3000
    msgs = mrcr.messages(row)
    target = msgs[row["desired_msg_index"]]
    assert target["role"] == "assistant" and row["answer"] == row["random_string_to_prepend"] + target["content"]


def test_training_aime_problems_are_the_suites_with_solutions_of_hundreds_to_thousands_of_tokens():
    tok = K3Tokenizer()
    short = eval_tasks.aime_row(eval_tasks.TRAIN_SEED_BASE, eval_tasks.AIME_STEPS[0])
    long = eval_tasks.aime_row(eval_tasks.TRAIN_SEED_BASE, eval_tasks.AIME_STEPS[1])
    for style in eval_tasks.STYLES:
        for row in (short, long) + tuple(eval_tasks.aime_row(eval_tasks.TRAIN_SEED_BASE + i, 24) for i in range(20)):
            prompt, target = eval_tasks.render_aime(tok, row, style)
            assert tok.decode(target).endswith(f"\\boxed{{{row['answer']}}}.")
            steps = row["problem"].count(";") + 1  # the room aime_steps reserves holds the document
            assert len(prompt) + len(target) <= eval_tasks.AIME_BASE_TOKENS + eval_tasks.AIME_STEP_TOKENS[style] * steps
        for room in (300, 2048, 16384):
            steps = eval_tasks.aime_steps(eval_tasks.TRAIN_SEED_BASE + room, room, style)
            assert steps is None if room == 300 else eval_tasks.AIME_STEPS[0] <= steps <= eval_tasks.AIME_STEPS[1]
    assert 100 < len(eval_tasks.render_aime(tok, short)[1]) < 600 < 1800 < len(eval_tasks.render_aime(tok, long)[1])


def test_training_documents_render_as_the_eval_adapter_sends_them(tmp_path):
    """Eval documents of both tiers and training documents go through lm-eval's tasks and the
    suite's adapter; the prompt ids are the training render's, and the training target is what
    the task's grader scores 1."""
    pytest.importorskip("lm_eval")
    from types import SimpleNamespace

    from fastpath.evals import data, taskdir
    from fastpath.evals.adapter import FastpathLM
    from fastpath.evals.prompts import messages_field

    tok = K3Tokenizer()
    base = eval_tasks.TRAIN_SEED_BASE
    docs = {"mrcr": [eval_tasks.mrcr_row(base + i, 1500 * (i + 1), tok) for i in range(2)],
            "aime25": [eval_tasks.aime_row(base + i, 5 + 20 * i) for i in range(2)]}
    for tier in eval_tasks.TIERS:
        for task, ds in eval_tasks.eval_documents(tier).items():
            docs[task] += ds
    files = {t: data.write_jsonl(tmp_path / f"{t}.jsonl", ds) for t, ds in docs.items()}
    tasks = taskdir.task_manager(taskdir.lay_out(tmp_path), files).load(sorted(taskdir.TASK_NAMES.values()))["tasks"]
    lm = FastpathLM(SimpleNamespace(tokenizer=tok), messages_fields={n: f for n, t in tasks.items() if (f := messages_field(t))})
    render = {"fastpath_mrcr": eval_tasks.render_mrcr, "fastpath_aime25": eval_tasks.render_aime}
    metric = {"fastpath_mrcr": "mrcr_score", "fastpath_aime25": "exact_match"}
    for name, task in tasks.items():
        task.build_all_requests(limit=None, rank=0, world_size=1)
        assert len(task.instances) == len(docs[{"fastpath_mrcr": "mrcr", "fastpath_aime25": "aime25"}[name]])
        for inst in task.instances:
            prompt, target = render[name](tok, inst.doc)
            assert prompt == lm._prompt_ids(inst.args[0], inst.doc, name)
            assert task.process_results(inst.doc, [tok.decode(target)])[metric[name]] == 1


def test_json_answers_fit_the_features_suite_constraints():
    import importlib.util
    from pathlib import Path

    import jsonschema

    spec = importlib.util.spec_from_file_location("features_suite", Path(__file__).parents[1] / "fastpath/suites/test_features.py")
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
    for again in range(3):  # the same state exports to the same bytes, the digest the spec pins
        # (into a folder not there yet: the export makes it, as widen's --out once did not)
        assert export.main([str(tmp_path / "state"), str(tmp_path / f"again-{again}" / "w.safetensors")]) == 0
        assert digest in capsys.readouterr().out
    meta = checkpoint.export_meta(tmp_path / "tiny.safetensors")
    assert (meta["config"], meta["step"], meta["aime_style"]) == ("tiny", 1, Mix().aime_style)


def test_export_as_another_config_checks_its_shapes(tmp_path, monkeypatch, one_torch_thread):
    """Adopting a lab config's weights as the product config of the same shapes records that
    config in the file; a config of other shapes is refused, naming both."""
    from lab.train import export
    from optimized_model.k3 import config as k3_config

    monkeypatch.setitem(k3_config.CONFIGS, "tiny_alias", dataclasses.replace(get_config("tiny"), name="tiny_alias"))
    _train(tmp_path / "state", 1)
    assert export.main([str(tmp_path / "state"), str(tmp_path / "w.safetensors"), "--as-config", "tiny_alias"]) == 0
    assert checkpoint.export_meta(tmp_path / "w.safetensors")["config"] == "tiny_alias"
    with pytest.raises(SystemExit, match="config tiny.* do not have config trained's names and shapes"):
        export.main([str(tmp_path / "state"), str(tmp_path / "x.safetensors"), "--as-config", "trained"])
    assert not (tmp_path / "x.safetensors").exists()


def test_the_curriculum_starts_mrcr_on_short_rows_then_moves_to_the_long_table():
    """The first short_steps steps have rows of short_lengths, MRCR conversations of a few
    hundred tokens among them; later steps draw from lengths."""
    tok = K3Tokenizer()
    mix = Mix(tokens_per_step=4096, short_steps=20, copy_steps=0, kinds=(("mrcr", 1.0),))
    early = [make_batch(mix, step, tok) for step in range(12)]
    assert {b.tokens.shape[1] for b in early} <= {T for T, _ in mix.short_lengths}
    mrcr_rows = [int(n) for b in early for n in b.lengths[b.weights.sum(1) > 0]]
    assert mrcr_rows and min(mrcr_rows) < 512, sorted(mrcr_rows)[:5]
    assert all(b.kinds.get("mrcr") for b in early)
    late = make_batch(dataclasses.replace(mix, tokens_per_step=65536), 20, tok)
    assert late.tokens.shape[1] in {T for T, _ in mix.lengths}



def test_a_fresh_run_starts_with_copy_tasks_alone_then_the_mix():
    tok = K3Tokenizer()
    mix = Mix(tokens_per_step=8192, copy_steps=3)
    for step in range(3):
        b = make_batch(mix, step, tok)
        assert set(b.kinds) == {"copy"} and b.tokens.shape[1] in {T for T, _ in mix.short_lengths}
    later = [make_batch(mix, step, tok) for step in range(3, 6)]
    assert {"mrcr", "aime"} <= set().union(*(b.kinds for b in later))
    saved = TrainConfig().to_json()
    del saved["mix"]["copy_steps"]
    assert TrainConfig.from_json(saved).mix.copy_steps == 0 and Mix().copy_steps > 0


class _StuckPool:
    """A worker pool whose results never come and which cannot terminate (run 3's, at its end)."""

    class _Pending:
        def get(self, timeout=None):
            import multiprocessing

            raise multiprocessing.TimeoutError()

    def apply_async(self, fn, args):
        return self._Pending()

    def terminate(self):
        raise AssertionError("Cannot have cache with result_handler not alive")


def test_batches_go_on_inline_and_the_same_when_the_worker_pool_stops_answering():
    said = []
    batches = _Batches(TINY_MIX, 5, workers=0, wait_s=0.01, say=said.append)
    batches.pool = _StuckPool()
    batches._submit()
    got = [batches.next() for _ in range(2)]
    want = [make_batch(TINY_MIX, step, K3Tokenizer()) for step in (5, 6)]
    assert all(torch.equal(g.tokens, w.tokens) and torch.equal(g.weights, w.weights) for g, w in zip(got, want))
    assert batches.pool is None and any("failed at step 5" in s for s in said)
    assert any("did not stop cleanly" in s for s in said)
    batches.close()  # a second close is a no-op


def test_a_copy_task_asks_for_one_listed_text_by_its_heading():
    for seed in range(50):
        prompt, answer = copy_tasks.copy_pair(seed)
        assert copy_tasks.copy_pair(seed) == (prompt, answer)
        heading = answer.split("\n", 1)[0]  # "Poem about owls:"
        assert prompt.count("\n\n" + answer + "\n\n") == 1 and prompt.count(heading) == 1
        assert prompt.endswith(f"Repeat the {heading[0].lower()}{heading[1:-1]} exactly.")


def test_the_probe_names_the_first_wrong_line_of_a_worked_solution_and_its_cause():
    want = "Step 1: 727 * 74 = 53798, mod 1000 = 798.\nStep 2: 798 + 5 = 803, mod 1000 = 803."
    assert probe.first_wrong_line(want, want) is None
    cases = {"Step 1: 727 * 74 = 54058, mod 1000 = 58.": "arithmetic *",
             "Step 1: 72 * 74 = 5328, mod 1000 = 328.": "carried value",
             "Step 1: 727 + 74 = 801, mod 1000 = 801.": "operation",
             "Step 1: 727 * 74 = 53798, mod 1000 = 799.": "mod",
             "The final value": "format"}
    for line, cause in cases.items():
        assert probe.first_wrong_line(line, want) == (0, cause)
    assert probe.first_wrong_line(want.splitlines()[0], want) == (1, "format")  # stopped early
    row = {"problem": "Let x = 727. Apply the following 2 operations to x in order, replacing x after each one by "
                      "its remainder when divided by 1000: multiply by 74; subtract 560. What is the final value of x?",
           "answer": "238"}
    want = aime.solution(row, "columns").splitlines()
    assert want[:5] == ["Step 1: x = 727, multiply by 74.", "727 * 4: 7*4=28, 2*4+2=10, 7*4+1=29, so 2908.",
                        "727 * 7: 7*7=49, 2*7+4=18, 7*7+1=50, so 5089.",
                        "908 + 890: 8+0=8, 0+9=9, 9+8=17, so 1798, mod 1000 = 798.",
                        "Step 2: x = 798, subtract 560."]
    assert want[5] == "1000 - 560: 0, 10-6=4, 9-5=4, so 440."
    for i, wrong, cause in [(0, "Step 1: x = 72, multiply by 74.", "carried value"),
                            (0, "Step 1: x = 727, add 74.", "operation"),
                            (1, "727 * 4: 7*4=28, 2*4+2=10, 7*4+1=29, so 2918.", "arithmetic *"),
                            (3, "908 + 890: 8+0=8, 0+9=9, 9+8=17, so 1898, mod 1000 = 898.", "arithmetic +"),
                            (5, "1000 - 560: 0, 10-6=4, 9-5=4, so 450.", "arithmetic complement")]:
        got = want[:i] + [wrong] + want[i + 1:]
        assert probe.first_wrong_line("\n".join(got), "\n".join(want)) == (i, cause)


def test_the_probe_tells_copying_from_one_repeated_word():
    want = "Song about salt:\nquiet river morning\nnorth"
    assert probe.copied_words(want, want) == (1.0, 0.25)
    same, top = probe.copied_words("Song about salt:\nstone stone stone stone", want)
    assert same == 0.0 and top == 1.0


def test_the_probe_names_the_same_heading_message_an_mrcr_answer_copied():
    tok = K3Tokenizer()
    row = next(r for seed in range(eval_tasks.TRAIN_SEED_BASE, eval_tasks.TRAIN_SEED_BASE + 50)
               if (r := eval_tasks.mrcr_row(seed, 2000, tok))["n_needles"] >= 4)
    secret = row["random_string_to_prepend"]
    right = probe.mrcr_choice(row["answer"], row)
    assert right["needles"] == row["n_needles"] and right["chose"] == right["asked"]
    msgs = mrcr.messages(row)
    ask = msgs[row["desired_msg_index"] - 1]["content"]
    same_heading = [msgs[i + 1]["content"] for i, m in enumerate(msgs[:-1]) if m["content"] == ask]
    other = next(k for k in range(1, len(same_heading) + 1) if k != right["asked"])
    assert probe.mrcr_choice(secret + same_heading[other - 1], row) == dict(right, chose=other)
    assert probe.mrcr_choice(same_heading[other - 1], row)["chose"] is None  # no random string: no choice


def test_a_state_saved_before_the_solution_styles_resumes_on_the_style_it_learnt():
    saved = TrainConfig().to_json()
    del saved["mix"]["aime_style"]
    assert TrainConfig.from_json(saved).mix.aime_style == "lines"
    assert TrainConfig.from_json(TrainConfig().to_json()).mix.aime_style == Mix().aime_style == aime.SOLUTION_STYLE == "numbered"


def test_each_kind_carries_its_share_of_the_graded_loss():
    """Weighed 1 a token, AIME's long solutions outweigh MRCR's answers many times over; with the
    shares each kind present gets its part of the graded weight, whose total and the prompts'
    weights stay as they were."""
    tok = K3Tokenizer()
    mix = Mix(tokens_per_step=65536, lengths=((4096, 1.0),), short_steps=0, copy_steps=0)
    shared, plain = make_batch(mix, 3, tok), make_batch(dataclasses.replace(mix, loss_shares=None), 3, tok)
    assert torch.equal(shared.tokens, plain.tokens) and torch.equal(shared.graded, plain.graded)
    assert torch.equal(shared.weights[~shared.graded], plain.weights[~plain.graded])
    graded_total = float(plain.weights[plain.graded].sum())
    assert float(shared.weights[shared.graded].sum()) == pytest.approx(graded_total, rel=1e-5)
    of_kind = {k: shared.graded & (shared.kind_ids == i) for i, k in enumerate(KINDS)}
    present = {k for k, m in of_kind.items() if m.any()}
    assert present == set(KINDS)
    assert float(plain.weights[of_kind["aime"]].sum()) > 4 * float(plain.weights[of_kind["mrcr"]].sum())
    for k, share in mix.loss_shares:
        assert float(shared.weights[of_kind[k]].sum()) / graded_total == pytest.approx(share, rel=1e-4)
    only_two = dataclasses.replace(mix, kinds=(("mrcr", 0.5), ("json", 0.5)))
    b = make_batch(only_two, 0, tok)
    mrcr_w = float(b.weights[b.graded & (b.kind_ids == KINDS.index("mrcr"))].sum())
    assert mrcr_w / float(b.weights[b.graded].sum()) == pytest.approx(0.3 / 0.4, rel=1e-4)  # renormalised


def test_mrcr_rows_draw_their_needle_counts_by_the_mixs_weights():
    tok = K3Tokenizer()
    seeds = range(eval_tasks.TRAIN_SEED_BASE, eval_tasks.TRAIN_SEED_BASE + 12)
    alike = [eval_tasks.mrcr_row(s, 6000, tok)["n_needles"] for s in seeds]
    assert len(set(alike)) > 1  # the spec's counts alike, as before
    assert all(eval_tasks.mrcr_row(s, 6000, tok, ((8, 1.0),))["n_needles"] == 8 for s in seeds)
    assert parse_needles("8=0.5,4=0.3,2=0.2") == ((8, 0.5), (4, 0.3), (2, 0.2))
    for bad in ("3=1", "8=0", "8=-1,2=1", "eight=1"):
        with pytest.raises(SystemExit, match="--mrcr-needles"):
            parse_needles(bad)


def test_an_mrcr_answers_choice_tokens_weigh_more_inside_mrcrs_share():
    """mrcr_choice_weight moves weight inside MRCR's answers to the tokens after the random string
    (which message is copied); the tokens, MRCR's share and the other kinds' weights stay."""
    from lab.train.mix import MRCR_CHOICE_TOKENS

    tok = K3Tokenizer()
    mix = Mix(tokens_per_step=16384, lengths=((2048, 1.0),), short_steps=0, copy_steps=0,
              kinds=(("mrcr", 0.5), ("json", 0.5)))
    plain, chosen = make_batch(mix, 1, tok), make_batch(dataclasses.replace(mix, mrcr_choice_weight=4.0), 1, tok)
    assert torch.equal(plain.tokens, chosen.tokens) and torch.equal(plain.graded, chosen.graded)
    mrcr = plain.graded & (plain.kind_ids == KINDS.index("mrcr"))
    assert torch.equal(plain.weights[~mrcr], chosen.weights[~mrcr])
    assert float(chosen.weights[mrcr].sum()) == pytest.approx(float(plain.weights[mrcr].sum()), rel=1e-5)
    row = int(mrcr.any(dim=1).nonzero()[0])
    w = chosen.weights[row][mrcr[row]]
    secret = 10  # the random string's tokens (10 letters and digits, a byte each)
    assert torch.allclose(w[secret:secret + MRCR_CHOICE_TOKENS], 4 * w[0].expand(MRCR_CHOICE_TOKENS))
    assert torch.allclose(w[:secret], w[0].expand(secret))
    assert torch.allclose(w[secret + MRCR_CHOICE_TOKENS:], w[0].expand(len(w) - secret - MRCR_CHOICE_TOKENS))


def test_a_state_saved_before_the_shares_resumes_weighing_each_graded_token_one():
    saved = TrainConfig().to_json()
    del saved["mix"]["loss_shares"]
    assert TrainConfig.from_json(saved).mix.loss_shares is None
    assert TrainConfig.from_json(TrainConfig().to_json()).mix.loss_shares == Mix().loss_shares


def test_the_probes_aime_size_per_style_matches_the_eval_tasks_length():
    # the full tier's aime25 asks for ~1,050-token worked solutions (24 steps of "lines"); the
    # probe judges a checkpoint of any style at about that length ("listed" adds its listing to
    # the operations "columns" fetches)
    tok = K3Tokenizer()
    assert set(probe.AIME_PROBE_STEPS) == set(eval_tasks.STYLES)
    for style, steps in probe.AIME_PROBE_STEPS.items():
        lengths = [len(tok.encode(eval_tasks.solution(aime.generate(s, 1, steps)[0], style))) for s in range(10)]
        assert 900 <= sum(lengths) / len(lengths) <= 1250, (style, lengths)
    assert probe.AIME_PROBE_STEPS["listed"] == probe.AIME_PROBE_STEPS["columns"]


def test_the_listed_style_numbers_the_operations_then_works_them_in_columns():
    tok = K3Tokenizer()
    row = aime.generate(7, 1, 12)[0]
    ops = [" ".join(op) for op in aime.operations(row["problem"])]
    lines = eval_tasks.solution(row, "listed").splitlines()
    assert lines[0] == "The operations:" and lines[1:13] == [f"{i}. {op}" for i, op in enumerate(ops, 1)]
    assert "\n".join(lines[13:]) == aime.solution(row, "columns")
    prompt, target = eval_tasks.render_aime(tok, row, "listed")
    assert prompt == eval_tasks.render_aime(tok, row, "columns")[0]
    assert target[:-2] == tok.encode(eval_tasks.solution(row, "listed"), bos=False)
    assert target[-2:] == [tok.end_turn_id, tok.eos_id]
    want = eval_tasks.solution(row, "listed")
    skipped = want.replace(f"\n3. {ops[2]}\n", "\n")  # a listing that lost its place
    assert probe.first_wrong_line(skipped, want) == (3, "listing")


def test_the_probe_counts_the_operations_each_step_names_in_its_place():
    row = aime.generate(3, 1, 4)[0]
    right = aime.solution(row, "columns")
    assert probe.operations_in_place(right, row["problem"]) == 1.0
    ops = aime.operations(row["problem"])
    assert ops[1] != ops[2]  # the seed's steps 2 and 3 differ, so repeating step 2's is a slip
    heads = [l for l in right.splitlines() if l.startswith("Step ")]
    repeated = "\n".join(heads[:2] + [heads[1].replace("Step 2", "Step 3")] + heads[3:])  # step 3 repeats step 2's
    assert probe.operations_in_place(repeated, row["problem"]) == 0.75


def test_a_cpu_trial_trains_the_named_kinds_on_one_row_length(tmp_path, capsys, one_torch_thread):
    from lab.train import cpu_trial

    assert parse_kinds("mrcr=0.4,copy=0.6") == (("mrcr", 0.4), ("copy", 0.6))
    with pytest.raises(SystemExit, match="KIND=WEIGHT"):
        parse_kinds("poems=1")
    with pytest.raises(SystemExit, match="KIND=WEIGHT"):
        parse_kinds("copy=lots")
    with pytest.raises(SystemExit, match="--shares 'copy=-1'"):
        parse_kinds("copy=-1", "--shares")
    assert cpu_trial.main(["--kinds", "copy=1", "--shares", "copy=1,mrcr=0.5", "--row", "512",
                           "--tokens-per-step", "1024", "--steps", "3", "--copy-steps", "2", "--threads", "1",
                           "--out", str(tmp_path)]) == 0
    records = [json.loads(line) for line in (tmp_path / "train-log.jsonl").read_text().splitlines()]
    assert records[0]["T"] == 512 and set(k for k in records[0] if k.startswith("loss_")) == {"loss_copy"}
    _, meta = checkpoint.load_state(tmp_path)
    assert meta["step"] == 3 and meta["config"] == "tiny"
    assert meta["train_config"]["mix"]["loss_shares"] == [["copy", 1.0], ["mrcr", 0.5]]
    assert meta["train_config"]["mix"]["copy_steps"] == 2
    assert "3 steps" in capsys.readouterr().out


def test_a_cpu_trial_draws_its_row_lengths_from_a_table(tmp_path, one_torch_thread):
    from lab.train import cpu_trial
    from lab.train.mix import parse_lengths

    assert parse_lengths("512=0.5,1024=0.5") == ((512, 0.5), (1024, 0.5))
    for bad in ("512", "512=x", "32=1", "512=-1"):
        with pytest.raises(SystemExit, match="TOKENS=SHARE"):
            parse_lengths(bad)
    assert cpu_trial.main(["--kinds", "copy=1", "--lengths", "256=1,512=1", "--tokens-per-step", "256",
                           "--steps", "6", "--threads", "1", "--out", str(tmp_path)]) == 0
    _, meta = checkpoint.load_state(tmp_path)
    assert meta["train_config"]["mix"]["lengths"] == [[256, 1.0], [512, 1.0]]
    mix = TrainConfig.from_json(meta["train_config"]).mix
    assert {make_batch(mix, step).tokens.shape for step in range(12)} == {(1, 256), (1, 512)}  # a long row alone


def test_the_numbered_style_names_each_steps_operation_as_the_problem_labels_it():
    """The style run 3 learnt from its second segment on: what the lab trained as "numbered" (the
    problem's operations relabelled, the columns heads reordered) is what the harness generates."""
    tok = K3Tokenizer()
    row = aime.generate(7, 1, 12)[0]
    ops = aime.operations(row["problem"])
    assert len(ops) == 12 and row["problem"].endswith(f"; Step 12: {' '.join(ops[11])}. What is the final value of x?")
    assert ", replacing x after each one by its remainder when divided by 1000: Step 1: " in row["problem"]
    want = aime.solution(row, "numbered")
    columns = aime.solution(row, "columns").splitlines()
    column_heads = [probe.HEAD.fullmatch(l) for l in columns if l.startswith("Step ")]
    assert [l for l in want.splitlines() if l.startswith("Step ")] == [
        f"Step {m[1]}: {m[3]} {m[4]}, x = {m[2]}." for m in column_heads]
    assert [l for l in want.splitlines() if not l.startswith("Step ")] == [
        l for l in columns if not l.startswith("Step ")]
    prompt, target = eval_tasks.render_aime(tok, row, "numbered")
    assert target[:-2] == tok.encode(want, bos=False) and target[-2:] == [tok.end_turn_id, tok.eos_id]
    assert probe.operations_in_place(want, row["problem"]) == 1.0
    heads = [l for l in want.splitlines() if l.startswith("Step ")]
    i = want.splitlines().index(heads[2])
    slipped = want.replace(heads[2], heads[2].replace(" ".join(ops[2]), " ".join(ops[3]), 1))
    assert ops[2] != ops[3] and probe.first_wrong_line(slipped, want) == (i, "operation")
    assert probe.operations_in_place(slipped, row["problem"]) == 11 / 12

def test_the_probe_scores_a_tiers_eval_documents_per_bucket():
    """--eval-documents: a model that answers every held-out document as its worked answer scores
    1 in each MRCR bucket and solves every AIME problem; one that answers nothing scores 0."""
    from types import SimpleNamespace

    tok = K3Tokenizer()
    docs = eval_tasks.eval_documents("smoke")
    answers = {}
    for row in docs["mrcr"]:
        prompt, _ = eval_tasks.render_mrcr(tok, row)
        answers[tuple(prompt)] = row["answer"]
    for row in docs["aime25"]:
        prompt, _ = eval_tasks.render_aime(tok, row)
        answers[tuple(prompt)] = aime.solution(row)

    class Answering:
        def __init__(self, right):
            self.right = right

        def generate(self, requests):
            return [SimpleNamespace(text=answers[tuple(r.prompt_ids)] if self.right else "") for r in requests]

    right = probe.probe_eval_documents(Answering(True), tok, "smoke", aime.SOLUTION_STYLE, 32768, say=lambda s: None)
    buckets = {mrcr.bucket_of(len(eval_tasks.render_mrcr(tok, row)[0])) for row in docs["mrcr"]}
    assert {k for k in right if k.startswith("mrcr_")} == {f"mrcr_{b}" for b in buckets} and len(buckets) == 2
    assert all(v["score"] == 1.0 for k, v in right.items() if k.startswith("mrcr_"))
    assert right["aime25"]["exact"] == len(docs["aime25"]) and right["aime25"]["operations_in_place"] == 1.0
    wrong = probe.probe_eval_documents(Answering(False), tok, "smoke", aime.SOLUTION_STYLE, 1024, say=lambda s: None)
    assert [k for k in wrong if k.startswith("mrcr_")] == ["mrcr_512"] and wrong["mrcr_512"]["score"] == 0.0
    assert wrong["aime25"]["exact"] == 0


def test_the_probe_adds_a_tiers_eval_documents_to_its_summary(tmp_path, monkeypatch):
    """--with-eval-documents: the probe's figures and the tier's in one JSON file (h200.sh's
    probe.json, where a command returns at most 8 files); with --eval-documents it is refused."""
    from types import SimpleNamespace

    import optimized_model.k3.engine as k3_engine

    weights = tmp_path / "w.safetensors"
    weights.write_bytes(b"weights")
    calls = []

    class Engine:
        def __init__(self, **kw):
            calls.append(kw)

        def load(self, path):
            return SimpleNamespace(tokenizer=K3Tokenizer())

    monkeypatch.setattr(k3_engine, "EmbeddedEngine", Engine)
    monkeypatch.setattr(checkpoint, "export_meta", lambda path: {"config": "trained"})
    monkeypatch.setattr(probe, "probe", lambda *a, **kw: {"mrcr_400": {"score": 0.5}})
    monkeypatch.setattr(probe, "probe_eval_documents", lambda model, tok, tier, *a, **kw: {"tier": tier})
    out = tmp_path / "probe.json"
    assert probe.main([str(weights), "--with-eval-documents", "full", "--out", str(out)]) == 0
    summary = json.loads(out.read_text())
    assert summary["mrcr_400"] == {"score": 0.5} and summary["eval_documents"] == {"tier": "full"}
    assert len(calls) == 1
    with pytest.raises(SystemExit) as exc:
        probe.main([str(weights), "--eval-documents", "full", "--with-eval-documents", "full"])
    assert exc.value.code == 2 and len(calls) == 1

def test_an_ordinal_copy_task_asks_for_one_of_several_texts_of_a_heading_by_its_place():
    for seed in range(50):
        prompt, answer = copy_tasks.ordinal_pair(seed)
        assert copy_tasks.ordinal_pair(seed) == (prompt, answer)
        heading = answer.split("\n", 1)[0]  # "Poem about owls:"
        m = re.search(r"Repeat the (\d+)(st|nd|rd|th) \(1 indexed\) (.+) exactly\.$", prompt)
        assert m and f"{m[3][0].upper()}{m[3][1:]}:" == heading
        texts = prompt.split("\n\n")[1:-1]
        same = [t for t in texts if t.split("\n", 1)[0] == heading]
        assert 2 <= len(same) <= copy_tasks.MAX_SAME and same[int(m[1]) - 1] == answer
        assert prompt.startswith(f"Here are {len(texts)} texts.")


def test_a_mix_asks_that_share_of_its_copy_tasks_by_place():
    tok = K3Tokenizer()
    mix = dataclasses.replace(TINY_MIX, kinds=(("copy", 1.0),), copy_ordinal=0.5)
    text = "".join(tok.decode(make_batch(mix, step, tok).tokens[0].tolist()) for step in range(6))
    plain = "".join(tok.decode(make_batch(dataclasses.replace(mix, copy_ordinal=0.0), step, tok).tokens[0].tolist())
                    for step in range(6))
    assert "(1 indexed)" in text and "(1 indexed)" not in plain
    saved = TrainConfig().to_json()
    del saved["mix"]["copy_ordinal"]
    assert TrainConfig.from_json(saved).mix.copy_ordinal == 0.0 == Mix().copy_ordinal


def test_mrcr_inspect_half_lives_needles_and_a_missing_document():
    """lab.train.mrcr_inspect: ln 2 / -mean g per channel; the needles of a document and the place
    of the asked one; a --doc the bucket lacks is one line naming both."""
    from lab.train import mrcr_inspect

    g = torch.tensor([[-math.log(2) / 100, -math.log(2) / 4], [-math.log(2) / 100, -math.log(2) / 4]])
    assert torch.allclose(mrcr_inspect.half_lives(g), torch.tensor([100.0, 4.0]))
    for row in eval_tasks.eval_documents("full")["mrcr"]:
        texts, asked = eval_tasks.mrcr_needles(row)
        assert len(texts) == row["n_needles"] and row["answer"] == row["random_string_to_prepend"] + texts[asked - 1]
        assert texts.count(texts[asked - 1]) == 1
    with pytest.raises(SystemExit, match=r"has 4 MRCR documents in bucket 1024; --doc 9 is not one of them"):
        mrcr_inspect.main(["optimized_model/k3/checkpoints/trained.safetensors", "--bucket", "1024", "--doc", "9"])


def test_mrcr_inspect_silences_each_mla_head_at_the_choice(capsys, one_torch_thread):
    """``--what heads``: a row per MLA head beside the unsilenced one; silencing a head whose output
    gate is shut moves nothing, silencing the committed weights' open heads moves the choice's
    log-probabilities (a smoke document, ~4 s)."""
    from lab.train import mrcr_inspect

    assert mrcr_inspect.main(["optimized_model/k3/checkpoints/trained.safetensors", "--tier", "smoke",
                              "--bucket", "512", "--doc", "0", "--what", "heads"]) == 0
    rows = [line.split("|") for line in capsys.readouterr().out.splitlines() if line.startswith(("| none", "| layer"))]
    cfg = get_config("trained")
    assert len(rows) == 1 + cfg.n_mla * cfg.mla_heads
    base = [float(v) for v in rows[0][2].split()]
    moved = []
    for row in rows[1:]:
        gate = float(re.search(r"gate ([0-9.]+)", row[1]).group(1))
        shift = max(abs(float(v) - b) for v, b in zip(row[2].split(), base))
        if gate <= 0.01:
            assert shift <= 0.1, row
        moved.append(shift)
    assert max(moved) > 1.0
