"""One lm-eval evaluation of one path, offline, and its per-sample records.

``evaluate_path`` loads the laid-out tasks through lm-eval's TaskManager, applies the spec's
per-task run settings (``repeats``, ``max_gen_toks``: lm-eval's own ``set_config``, as its
``--gen_kwargs`` does), and runs ``lm_eval.evaluator.evaluate`` with ``log_samples`` over a
``FastpathLM`` wrapping the path's model. ``simple_evaluate`` is not used: besides that loop it
only builds the model from a name and records the environment with torch's collect_env (seconds
of subprocesses); fastpath's environment.json records the environment.

Each sample is scored per repeat with the task's own ``process_results`` (lm-eval's scorer:
its default filter keeps the first repeat only), keyed (task, doc_id, repeat) like the
adapter's records, so two paths pair sample by sample.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastpath.evals import require_lm_eval, taskdir
from fastpath.evals.prompts import messages_field

# lm-eval task -> (its per-sample metric, how two paths' values pair: "exact" 0/1 or "graded")
METRICS = {"fastpath_mrcr": ("mrcr_score", "graded"), "fastpath_aime25": ("exact_match", "exact")}


@dataclass
class TaskRun:
    name: str
    metric: str
    kind: str
    samples: list[dict]  # lm-eval's logged samples
    scores: dict[tuple[int, int], float] = field(default_factory=dict)  # (doc_id, repeat) -> score


@dataclass
class PathRun:
    label: str
    tasks: dict[str, TaskRun]
    records: dict[tuple, dict]  # the adapter's (task, doc_id, repeat) -> generation record
    seconds: float


def evaluate_path(label: str, model: Any, tasks_dir: Path, data_files: dict[str, Path],
                  run_settings: dict[str, dict], *, max_batch: int, max_prefill_tokens: int | None,
                  seed: int, reverse: bool = False) -> PathRun:
    """``run_settings``: {spec task: {"repeats", "max_gen_toks"}}; ``data_files``: {spec task: JSONL}."""
    require_lm_eval()
    import numpy as np
    from lm_eval.evaluator import evaluate

    from fastpath.evals.adapter import FastpathLM

    t0 = time.monotonic()
    tm = taskdir.task_manager(tasks_dir, data_files)
    names = {taskdir.TASK_NAMES[k]: k for k in run_settings}
    loaded = tm.load(sorted(names))
    for name, task in loaded["tasks"].items():
        s = run_settings[names[name]]
        task.set_config("repeats", int(s["repeats"]))
        task.set_config("generation_kwargs", {"max_gen_toks": int(s["max_gen_toks"])}, update=True)
    lm = FastpathLM(model, max_batch=max_batch, max_prefill_tokens=max_prefill_tokens, seed=seed, reverse=reverse,
                    messages_fields={n: f for n, t in loaded["tasks"].items() if (f := messages_field(t))})
    random.seed(seed)  # what simple_evaluate seeds (no task here samples; set for equal footing)
    np.random.seed(seed)
    result = evaluate(lm, loaded, log_samples=True, bootstrap_iters=0, apply_chat_template=False)
    tasks = {}
    for name, task in loaded["tasks"].items():
        metric, kind = METRICS[name]
        run = TaskRun(name, metric, kind, list(result["samples"][name]))
        for sample in run.samples:
            responses = sample["resps"][0]  # one request per document; its repeats
            for r, text in enumerate(responses):
                run.scores[(int(sample["doc_id"]), r)] = float(task.process_results(sample["doc"], [text])[metric])
        tasks[name] = run
    return PathRun(label, tasks, dict(lm.records), time.monotonic() - t0)
