"""Structured output for K3-mini through xgrammar token bitmasks.

The byte-level vocabulary is handed to xgrammar as a RAW vocabulary: id i < 256 is the one byte
``bytes([i])``; specials and padding are empty strings (xgrammar treats empty tokens as special:
never allowed by a grammar), and the eos id is the stop token, allowed only where the grammar
is complete. Compiled grammars are cached per (kind, text).

Per step the generation loop asks ``StructuredBatch.fill_bitmask()`` for a ``[B, ceil(V/32)]``
int32 mask in xgrammar's layout (bit j of word i = token 32*i + j; 1 = allowed); unconstrained or
finished rows are all ones. The sampler applies it (disallowed → -inf) identically on every path.
"""

from __future__ import annotations

import json
import threading
from typing import Any, Sequence

import torch

__all__ = ["GrammarCompilerCache", "StructuredBatch", "grammar_key"]

_CACHE_LOCK = threading.Lock()
_COMPILERS: dict[tuple, "GrammarCompilerCache"] = {}


def _xgr():
    try:
        import xgrammar
    except Exception as exc:  # pragma: no cover - environment without xgrammar
        raise RuntimeError(
            "structured output needs xgrammar (pip install 'xgrammar==0.2.9'; with pydantic, "
            f"typing-inspection >= 0.4.5): {type(exc).__name__}: {exc}"
        ) from exc
    return xgrammar


def grammar_key(structured: dict[str, Any]) -> tuple[str, str]:
    """{"json_schema": dict|str} or {"regex": str} -> (kind, canonical text)."""
    if not isinstance(structured, dict) or len(structured) != 1:
        raise ValueError(
            f"structured must be {{'json_schema': ...}} or {{'regex': ...}}, got {structured!r}"
        )
    kind, value = next(iter(structured.items()))
    if kind == "json_schema":
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
        return kind, text
    if kind == "regex":
        if not isinstance(value, str):
            raise ValueError(f"regex must be a string, got {type(value).__name__}")
        return kind, value
    raise ValueError(f"unknown structured-output kind {kind!r}; allowed: json_schema, regex")


class GrammarCompilerCache:
    """xgrammar TokenizerInfo + GrammarCompiler for one tokenizer, with a compiled-grammar cache."""

    def __init__(self, tokenizer: Any):
        xgr = _xgr()
        self.xgr = xgr
        self.vocab_size = int(tokenizer.vocab_size)
        n_real = int(getattr(tokenizer, "n_real_tokens", self.vocab_size))
        encoded = [tokenizer.token_bytes(i) for i in range(n_real)]
        self.info = xgr.TokenizerInfo(
            encoded, xgr.VocabType.RAW, vocab_size=self.vocab_size,
            stop_token_ids=[int(tokenizer.eos_id)],
        )
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=1)
        self._compiled: dict[tuple[str, str], Any] = {}

    @classmethod
    def for_tokenizer(cls, tokenizer: Any) -> "GrammarCompilerCache":
        key = (type(tokenizer).__name__, int(tokenizer.vocab_size),
               int(getattr(tokenizer, "n_real_tokens", tokenizer.vocab_size)), int(tokenizer.eos_id))
        with _CACHE_LOCK:
            if key not in _COMPILERS:
                _COMPILERS[key] = cls(tokenizer)
            return _COMPILERS[key]

    def compile(self, structured: dict[str, Any]) -> Any:
        key = grammar_key(structured)
        if key not in self._compiled:
            kind, text = key
            if kind == "json_schema":
                self._compiled[key] = self.compiler.compile_json_schema(text, any_whitespace=False)
            else:
                self._compiled[key] = self.compiler.compile_regex(text)
        return self._compiled[key]

    def matcher(self, structured: dict[str, Any]) -> Any:
        return self.xgr.GrammarMatcher(self.compile(structured))


class StructuredBatch:
    """Per-request grammar matchers for one batch (None for unconstrained requests)."""

    def __init__(self, tokenizer: Any, specs: Sequence[dict[str, Any] | None]):
        self.vocab_size = int(tokenizer.vocab_size)
        self.words = (self.vocab_size + 31) // 32
        self.matchers: list[Any] = [None] * len(specs)
        if any(s is not None for s in specs):
            cache = GrammarCompilerCache.for_tokenizer(tokenizer)
            self.matchers = [None if s is None else cache.matcher(s) for s in specs]
        self._mask = torch.full((len(specs), self.words), -1, dtype=torch.int32)

    @property
    def active(self) -> bool:
        return any(m is not None for m in self.matchers)

    def fill_bitmask(self, done: Sequence[bool] | None = None) -> torch.Tensor | None:
        """The bitmask for the next token, or None when no row is constrained this step."""
        if not self.active:
            return None
        self._mask.fill_(-1)
        any_row = False
        for b, m in enumerate(self.matchers):
            if m is None or (done is not None and done[b]) or m.is_terminated():
                continue
            m.fill_next_token_bitmask(self._mask, b)
            any_row = True
        return self._mask.clone() if any_row else None

    def accept(self, b: int, token_id: int) -> bool:
        """Advance row b's matcher; True if accepted (always True for unconstrained rows)."""
        m = self.matchers[b]
        return True if m is None else bool(m.accept_token(int(token_id)))

    def terminated(self, b: int) -> bool:
        m = self.matchers[b]
        return m is not None and bool(m.is_terminated())

    def constrained(self, b: int) -> bool:
        return self.matchers[b] is not None
