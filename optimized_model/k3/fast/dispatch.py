"""The fast path's switch and its one dispatch point.

How the model code (optimized_model/k3) uses this module::

    from optimized_model.k3.fast import dispatch

    if dispatch.switch_on(additional_config):           # {"decode_backend": "latency_specialized"}
        self.fast = dispatch.build_fast_decoder(model, state_factory)   # None -> unavailable
    ...
    # every step, before running it:
    fast = dispatch.select_decode(batch, context, kind, decoder=self.fast)
    if fast is None:
        ... standard path (every component was reported as refused with the reason) ...
    else:
        logits = fast.decode(tokens, state)            # or fast.decode_step(batch, context)

``select_decode`` is the single traceable decision point: it either returns the fast decoder
(in-scope decode step; the decoder then reports ``engaged`` per component as it runs) or
reports ``refused(component, reason)`` for every fast component and returns None.

Reasons (docs/architecture.md): ``prefill``, ``mixed_batch``, ``batch_out_of_scope``,
``context_out_of_scope``, ``fast_path_unavailable``, and for speculative verify steps
(``kind="verify"``, ``draft`` = T - 1 tokens after the last emitted one) ``draft_out_of_scope``
(draft not in 0 ..= MAX_DRAFT) and ``verify_rows_out_of_scope`` (B*T rows beyond the spec's
``[scope] max_verify_rows``: the rows its tuning tables and buffers cover, 64 on K3-mini).
The switch being off reports nothing.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from fastpath import trace

from .registry import COMPONENT_NAMES

SWITCH_KEY = "decode_backend"
SWITCH_VALUE = "latency_specialized"
SPEC_PATH = Path(__file__).resolve().parent.parent / "fastpath.toml"

# Step kinds the caller may pass, and the refusal reason each maps to.
KIND_REASONS = {"prefill": "prefill", "mixed": "mixed_batch", "mixed_batch": "mixed_batch"}
# The longest draft a verify step may carry: the verify kernels are specialised (T = draft + 1
# as a constexpr) and tested up to it. Shorter drafts run too (an n-gram drafter often proposes
# fewer than K); the spec's [scope] draft_lengths says which ones the suites measure.
MAX_DRAFT = 7


def own_switch() -> dict[str, str]:
    """The switch this fast path answers to, shaped like the spec's ``[switch]`` table."""
    return {"key": SWITCH_KEY, "value": SWITCH_VALUE}


def switch_config() -> dict[str, str]:
    """The ``additional_config`` that turns this fast path on (``engine.load("fast", ...)``)."""
    return {SWITCH_KEY: SWITCH_VALUE}


def switch_on(config: Any) -> bool:
    """True iff the opt-in switch is set: ``config`` is a mapping (vLLM's additional_config)
    or an object with a ``decode_backend`` attribute, or the switch value itself."""
    if config is None:
        return False
    if isinstance(config, str):
        return config == SWITCH_VALUE
    if isinstance(config, Mapping):
        return config.get(SWITCH_KEY) == SWITCH_VALUE
    return getattr(config, SWITCH_KEY, None) == SWITCH_VALUE


@lru_cache(maxsize=1)
def scope() -> dict:
    """The fast path's declared scope, read from the spec beside the model (one source of truth).
    Returns {"batch_sizes": [...], "context_lengths": [...], "max_context": int,
    "draft_lengths": [...], "max_verify_rows": int}."""
    try:
        with open(SPEC_PATH, "rb") as fh:
            spec = tomllib.load(fh)
        sc = spec.get("scope", {})
        batch = sorted(int(b) for b in sc.get("batch_sizes", [1, 2, 4, 8, 16, 32, 64]))
        ctx = sorted(int(c) for c in sc.get("context_lengths", [32768]))
        max_ctx = int(spec.get("features", {}).get("max_context", max(ctx)))
        drafts = sorted(int(d) for d in sc.get("draft_lengths", [0]))
        rows = int(sc.get("max_verify_rows", batch[-1]))
    except (OSError, tomllib.TOMLDecodeError):  # pragma: no cover - spec always shipped
        batch, ctx, max_ctx, drafts, rows = [1, 2, 4, 8, 16, 32, 64], [32768], 32768, [0], 64
    return {"batch_sizes": batch, "context_lengths": ctx, "max_context": max_ctx, "draft_lengths": drafts,
            "max_verify_rows": rows}


def graph_batch(batch: int) -> int:
    """The captured batch size a step of ``batch`` sequences runs in (next scope size up)."""
    for b in scope()["batch_sizes"]:
        if b >= batch:
            return b
    raise ValueError(f"batch {batch} is out of the fast path's scope")


def interpreter_on() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def fast_path_available() -> tuple[bool, str]:
    """(True, "") when the fast kernels can run here: a CUDA device with Triton, or Triton's
    interpreter (TRITON_INTERPRET=1, CPU tests). Otherwise (False, reason)."""
    try:
        import triton  # noqa: F401
    except Exception as exc:  # pragma: no cover - triton is a model dependency
        return False, f"triton is not importable ({exc})"
    try:
        import torch
    except Exception as exc:  # pragma: no cover
        return False, f"torch is not importable ({exc})"
    if torch.cuda.is_available() and not interpreter_on():
        return True, ""
    if interpreter_on():
        return True, ""
    return False, "no CUDA device and no Triton interpreter (set TRITON_INTERPRET=1 for CPU runs)"


def refuse_all(reason: str, **shape: Any) -> None:
    """Report ``refused(component, reason)`` for every fast component."""
    for name in COMPONENT_NAMES:
        trace.refused(name, reason, **shape)


def decide(batch: int, context: int, kind: str = "decode", draft: int = 0) -> str | None:
    """Pure decision (no trace): None if the step is in scope, else the refusal reason.

    In scope: a decode step of 1 ..= max(scope.batch_sizes) sequences (a batch between two
    listed sizes, e.g. 3, runs too: graphs are captured per actual batch) at a context within
    ``features.max_context``, where the fast kernels can run. A verify step (``kind="verify"``)
    of ``draft`` + 1 tokens per sequence: also 0 <= draft <= MAX_DRAFT (0: no row proposed a
    draft this step) and batch * (draft + 1) rows <= max(scope.batch_sizes) (the
    GEMV / MoE kernels run the step as that many rows; the tables' buckets end there)."""
    sc = scope()
    if kind == "verify":
        if draft < 0 or draft > MAX_DRAFT:
            return "draft_out_of_scope"
        if batch >= 1 and batch * (draft + 1) > sc["max_verify_rows"]:
            return "verify_rows_out_of_scope"
        context += draft  # the window's last token sits at context + draft
    elif kind != "decode":
        return KIND_REASONS.get(kind, kind)
    if batch < 1 or batch > sc["batch_sizes"][-1]:
        return "batch_out_of_scope"
    if context < 0 or context > sc["max_context"]:
        return "context_out_of_scope"
    ok, _ = fast_path_available()
    if not ok:
        return "fast_path_unavailable"
    return None


def select_decode(batch: int, context: int, kind: str = "decode", *, decoder: Any = None,
                  draft: int = 0) -> Any:
    """THE dispatch point. In-scope decode step with a fast decoder → returns the decoder
    (a ``runtime.FastDecoder``). Otherwise reports ``refused`` for every component with the
    reason (``prefill`` | ``mixed_batch`` | ``batch_out_of_scope`` | ``context_out_of_scope``
    | ``fast_path_unavailable``) and returns None; the caller then runs the standard path.

    ``kind``: "decode" | "verify" (``draft`` tokens after the last emitted one; the decoder's
    ``verify`` then runs it) | "prefill" | "mixed". ``decoder``: what ``build_fast_decoder``
    returned (None means the fast path could not be built → ``fast_path_unavailable``).
    """
    reason = decide(batch, context, kind, draft)
    if reason is None and decoder is None:
        reason = "fast_path_unavailable"
    if reason is not None:
        shape = {"draft": draft} if kind == "verify" else {}
        refuse_all(reason, batch=batch, context=context, **shape)
        return None
    return decoder


def build_fast_decoder(model: Any, state_factory: Callable[..., Any] | None = None, **options: Any) -> Any:
    """Build the fast decoder for ``model`` (prepacks weights once, allocates static buffers
    lazily per captured batch size). Returns a ``runtime.FastDecoder``, or None when the fast
    path cannot run here (then ``fastpath.trace.refused(c, "fast_path_unavailable")`` is
    reported for every component).

    ``state_factory(batch, max_context)`` → a fresh decode state of the model for a batch
    (used for the static buffers of CUDA-graph capture and by ``decode_step``). Options:
    ``max_context`` (default: the spec's), ``use_graphs`` (default: True on CUDA).
    """
    ok, why = fast_path_available()
    if not ok:
        refuse_all("fast_path_unavailable")
        return None
    from .runtime import FastDecoder

    return FastDecoder(model, state_factory, **options)
