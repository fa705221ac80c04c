"""Helpers shared by the suites (fastpath/suites/test_*.py; their fixtures come from fastpath.pytest_plugin).

Kept dependency-light: the suites talk to the subject only through the Engine protocol
(fastpath.engine), the spec (fp_spec / fp_gate) and the kernel registry.
"""

from __future__ import annotations

import importlib

import json
import math
import random
from typing import Any

from fastpath.engine import switch_text

# Refusal reasons that are a property of the machine, not a defect, and on which device kind
# each is acceptable: "no_cuda" (the whole-step CUDA graph cannot exist on CPU).
ENVIRONMENT_REASONS = {"no_cuda": "cpu"}

# Words for deterministic prompts (parity, features): plain ASCII so byte-level tokenizers and
# any other tokenizer see ordinary text.
_WORDS = (
    "the model reads a long document and answers questions about the numbers in it while the "
    "decoder keeps its state across many steps so every token depends on what came before and "
    "a fast path must compute the same thing as the standard one for short and long contexts "
    "alike including json records regex patterns prices dates names and code"
).split()


def case_config(case: Any) -> dict:
    cfg = case.config if hasattr(case, "config") else case["config"]
    return dict(cfg)


def case_id(case: Any) -> str:
    return case.case_id if hasattr(case, "case_id") else case["case_id"]


def tier_name(tier: Any) -> str:
    return tier.name if hasattr(tier, "name") else str(tier["name"])


def device_kind(engine: Any) -> str:
    return "cuda" if str(engine.info().get("device", "cpu")).startswith("cuda") else "cpu"


def no_event_reason(spec: Any, engine: Any) -> str:
    """Why a fast-model step reported nothing at all: the spec's switch (passed to
    ``engine.load("fast", additional_config=...)``) against the one the engine says it expects
    (``info()["switch"]``)."""
    given = switch_text(getattr(spec, "switch", None))
    expected = engine.info().get("switch")
    if expected and switch_text(expected) == given:
        return f"no fast-path event with the switch {given} on: the fast path did not fire"
    wants = switch_text(expected) if expected else "a switch it does not state in info()"
    return f"no fast-path event: the switch {given} did not engage the fast path (engine expects {wants})"


# The facts of engine.info() that say which engine a suite's rows came from.
ENGINE_FACTS = ("device", "arch", "dtype", "vllm_version", "engine_starts")


def engine_summary(engine: Any) -> dict:
    """The engine that served the suite's models (its fastpath.engines name) and its facts."""
    info = engine.info()
    return {"engine": str(getattr(engine, "name", type(engine).__name__)),
            **{k: info[k] for k in ENGINE_FACTS if k in info}}


def environment_refusal(reason: str, engine: Any) -> bool:
    """True if refusing with ``reason`` is expected on this machine (not a defect)."""
    return ENVIRONMENT_REASONS.get(reason) == device_kind(engine)


def unexplained_refusals(rec: Any, engine: Any) -> list[str]:
    """``component:reason`` of every refusal in ``rec`` that is neither the prefill hand-off nor
    one this machine explains (no_cuda on CPU): each means the standard path ran a decode step."""
    return sorted({f"{e.component}:{e.detail}" for e in rec.refused()
                   if e.detail != "prefill" and not environment_refusal(e.detail, engine)})


def prompt_text(seed: int, n_chars: int) -> str:
    rng = random.Random(seed)
    out: list[str] = []
    size = 0
    while size < n_chars:
        w = rng.choice(_WORDS)
        if rng.random() < 0.08:
            w = f"{w} {rng.randint(0, 9999)}"
        out.append(w)
        size += len(w) + 1
    return " ".join(out)[:n_chars]


def prompt_ids(tokenizer: Any, seed: int, n_tokens: int) -> list[int]:
    """A deterministic prompt of exactly ``n_tokens`` ids (BOS first), n_tokens >= 1."""
    ids = tokenizer.encode(prompt_text(seed, 4 * n_tokens + 16), bos=True)
    while len(ids) < n_tokens:  # tokenizers with long tokens: extend
        ids += tokenizer.encode(prompt_text(seed + len(ids), 4 * n_tokens), bos=False)
    return ids[:n_tokens]


def sequence_prompt_ids(tokenizer: Any, seed: int, n_tokens: int, source: str | None = None) -> list[int]:
    """``prompt_ids``, or, with ``source = "module:function"`` (a gate's ``sequences`` setting),
    that function's ``(tokenizer, seed, n_tokens) -> ids`` (e.g. held-out eval documents, on
    which a trained model is confident); it must return exactly ``n_tokens`` ids."""
    if not source:
        return prompt_ids(tokenizer, seed, n_tokens)
    module, _, name = source.partition(":")
    if not module or not name:
        raise ValueError(f"sequences {source!r}: expected 'module:function'")
    ids = list(getattr(importlib.import_module(module), name)(tokenizer, seed, n_tokens))
    if len(ids) != n_tokens:
        raise ValueError(f"sequences {source!r} returned {len(ids)} ids for {n_tokens}; it must return exactly n_tokens")
    return ids


def as_list(x: Any) -> list:
    if isinstance(x, (list, tuple)):
        return list(x)
    return [x]


def jsonable(x: Any) -> Any:
    """Floats that JSON can carry (inf/nan as strings)."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    return x


def record_waived(record: Any, gate: str, metric: str, reason: str, **cfg: Any) -> None:
    """A waiver row that does not end the test (e.g. one component of a case)."""
    record(gate, metric, None, status="waived", passed=False, message=reason, **cfg)


def dumps(x: Any) -> str:
    return json.dumps(jsonable(x), sort_keys=True, default=str)


def score_teacher_forced(model: Any, seqs: list[list[int]], prefill_len: int | None,
                         max_batch: int | None = None, *, groups: list[int] | None = None) -> list[Any]:
    """``model.score(seqs, prefill_len=...)`` (docs/architecture.md): rows from ``prefill_len``
    on come from teacher-forced decode steps, i.e. from the fast decoder on the fast model.
    Scored ``max_batch`` sequences at a time: a larger batch is outside the fast path's scope
    (it would fall back, and parity would compare the standard path with itself); or, with
    ``groups``, in calls of those batch sizes in turn (they must add up to ``len(seqs)``).
    ``prefill_len`` None: each chunk is prefilled up to its shortest sequence minus one, so
    every sequence's last row comes from a decode step."""
    if groups is None:
        step = max(1, int(max_batch or len(seqs)))
        groups = [step] * -(-len(seqs) // step)
    elif sum(groups) != len(seqs) or min(groups, default=1) < 1:
        raise ValueError(f"batch groups {groups} do not split {len(seqs)} sequences")
    out: list[Any] = []
    i = 0
    for size in groups:
        chunk = seqs[i:i + size]
        i += size
        p = min(len(s) for s in chunk) - 1 if prefill_len is None else int(prefill_len)
        out.extend(model.score(chunk, prefill_len=p))
    return out


def scope_batch_sizes(spec: Any, tier: Any) -> list[int]:
    """The fast path's declared batch sizes, ascending (spec scope; else the tier's)."""
    for obj in (spec, tier):
        sc = getattr(obj, "scope", None)
        if sc and sc.get("batch_sizes"):
            return sorted(int(b) for b in sc["batch_sizes"])
    return [1, 2, 4]


def scope_max_batch(spec: Any, tier: Any) -> int:
    """The fast path's largest declared batch (spec scope; the tier only slices what it tests)."""
    return scope_batch_sizes(spec, tier)[-1]


def verify_batch(spec: Any, tier: Any, draft: int, want: int) -> int:
    """The largest batch up to ``want`` whose verify step at ``draft`` (batch x (draft + 1) rows)
    the fast path serves: within scope.max_verify_rows (none declared: the largest batch's rows)."""
    sc = getattr(spec, "scope", None) or {}
    limit = sc.get("max_verify_rows") or scope_max_batch(spec, tier)
    return max(1, min(int(want), int(limit) // (int(draft) + 1)))
