"""Evals through lm-evaluation-harness: MRCR (long context) and AIME25 (long generation), paired
between the fast path and the standard path (fastpath/suites/test_evals.py).

    mrcr.py       MRCR: seeded generator in openai/mrcr's format, the official grader, buckets
    aime.py       AIME-format long-arithmetic problems (answers 0-999) and their step-by-step solutions
    data.py       lm-eval's ``custom_dataset`` loaders: generated docs or the user's local files
    prompts.py    the chat turns a request becomes (MRCR: the document's message list)
    adapter.py    ``FastpathLM``: an lm-eval ``LM`` over any fastpath Engine model (name "fastpath")
    tasks/        the task YAMLs (package data); taskdir.py lays them out for lm-eval's TaskManager
    run.py        one lm-eval evaluation of one path, offline; its per-sample records
    paired.py     non-inferiority bounds of paired scores (exact binomial, bootstrap)
    agreement.py  output agreement between two paths (identical, common prefix, token logprobs)
    rescoring.py  the fp32 oracle teacher-forced on each path's own generation; the deviation rule
    samples.py    lm-eval's sample logs for the bundle: prompts replaced by digests, size-capped

Importing ``fastpath`` or this package never imports lm-eval; ``require_lm_eval()`` says how
to install it when a module that needs it is used.
"""

from __future__ import annotations

import importlib.util

from fastpath.errors import FastpathError

LM_EVAL_PIN = "lm-eval==0.4.13"


class MissingPackage(FastpathError):
    """An optional package the requested feature needs is not installed."""


def require_lm_eval() -> None:
    """Raise a one-line error naming lm-eval and the fix when it is not importable."""
    if importlib.util.find_spec("lm_eval") is None:
        raise MissingPackage("the evals suite needs lm-eval, which is not installed",
                             f"pip install 'fastpath[evals]' (or pip install {LM_EVAL_PIN})")
