"""Structured output for K3-mini through xgrammar token bitmasks.

The byte-level vocabulary is handed to xgrammar as a RAW vocabulary: id i < 256 is the one byte
``bytes([i])``; specials and padding are empty strings (xgrammar treats empty tokens as special:
never allowed by a grammar), and the eos id is the stop token, allowed only where the grammar
is complete. Compiled grammars are cached per (kind, text).

Per step the generation loop asks ``StructuredBatch.fill_bitmask()`` for a ``[B, ceil(V/32)]``
int32 mask in xgrammar's layout (bit j of word i = token 32*i + j; 1 = allowed); unconstrained or
finished rows are all ones. The sampler applies it (disallowed → -inf) identically on every path.

Byte-level guard (xgrammar 0.2.9 works on UTF-8 *bytes* and is loose in two places, seen with a
random-logits model): (1) its character classes accept byte sequences that are not valid UTF-8
(overlong forms, surrogates, code points above U+10FFFF), which decode to U+FFFD; (2) the
length-bounded JSON string rule (``maxLength``) is ``[^"\\\r\n]``, which admits raw control
characters that JSON forbids. So each constrained row's grammar mask is ANDed with a small UTF-8
automaton (only bytes that can continue valid UTF-8, and no special token in the middle of a
character) and, for JSON-schema rows, with "no bytes 0x00-0x1F" (compact JSON never needs them;
escapes such as \\n stay allowed). If that ever empties a row, the grammar's mask alone is used.
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
        # key order is kept: it is the property order the grammar generates
        text = value if isinstance(value, str) else json.dumps(value)
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


def _pack(allowed: torch.Tensor) -> torch.Tensor:
    """bool [32*W] -> xgrammar int32 words [W] (bit j of word i = id 32*i + j)."""
    bits = allowed.view(-1, 32).to(torch.int64) << torch.arange(32, dtype=torch.int64)
    words = bits.sum(-1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def _byte_guard_words(lo: int, hi: int, no_control: bool) -> torch.Tensor:
    """The 8 words covering byte ids 0..255: allow [lo, hi] for a continuation byte, or (lo < 0)
    every byte that may start a valid UTF-8 character."""
    allowed = torch.zeros(256, dtype=torch.bool)
    if lo < 0:
        allowed[0x00:0x80] = True
        allowed[0xC2:0xF5] = True
        if no_control:
            allowed[0x00:0x20] = False
    else:
        allowed[lo : hi + 1] = True
    return _pack(allowed)


# lead byte -> (continuation bytes still needed, allowed range of the next one)
_UTF8_LEAD: dict[int, tuple[int, int, int]] = {}
for _b in range(0xC2, 0xE0):
    _UTF8_LEAD[_b] = (1, 0x80, 0xBF)
for _b in range(0xE0, 0xF0):
    _UTF8_LEAD[_b] = (2, 0xA0 if _b == 0xE0 else 0x80, 0x9F if _b == 0xED else 0xBF)
for _b in range(0xF0, 0xF5):
    _UTF8_LEAD[_b] = (3, 0x90 if _b == 0xF0 else 0x80, 0x8F if _b == 0xF4 else 0xBF)


class _Utf8State:
    __slots__ = ("need", "lo", "hi")

    def __init__(self) -> None:
        self.need, self.lo, self.hi = 0, -1, -1

    def advance(self, token_id: int) -> None:
        if not 0 <= token_id < 256:
            return
        if self.need > 0:
            self.need -= 1
            self.lo, self.hi = (0x80, 0xBF) if self.need else (-1, -1)
        elif token_id in _UTF8_LEAD:
            self.need, self.lo, self.hi = _UTF8_LEAD[token_id]


class StructuredBatch:
    """Per-request grammar matchers for one batch (None for unconstrained requests)."""

    def __init__(self, tokenizer: Any, specs: Sequence[dict[str, Any] | None]):
        self.vocab_size = int(tokenizer.vocab_size)
        self.words = (self.vocab_size + 31) // 32
        self.matchers: list[Any] = [None] * len(specs)
        if any(s is not None for s in specs):
            cache = GrammarCompilerCache.for_tokenizer(tokenizer)
            self.matchers = [None if s is None else cache.matcher(s) for s in specs]
        self.json_rows = [s is not None and grammar_key(s)[0] == "json_schema" for s in specs]
        self.utf8 = [_Utf8State() for _ in specs]
        self._mask = torch.full((len(specs), self.words), -1, dtype=torch.int32)
        self._guards: dict[tuple[int, int, bool], torch.Tensor] = {}

    def _guard(self, b: int) -> torch.Tensor:
        st = self.utf8[b]
        key = (st.lo, st.hi, self.json_rows[b])
        if key not in self._guards:
            self._guards[key] = _byte_guard_words(*key)
        return self._guards[key]

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
            self._fill_row(b, self._mask, b)
            any_row = True
        return self._mask.clone() if any_row else None

    def _fill_row(self, b: int, out: torch.Tensor, i: int) -> None:
        """Row b's next-token mask (grammar AND byte guard) into ``out[i]``."""
        self.matchers[b].fill_next_token_bitmask(out, i)
        grammar_row = out[i].clone()
        out[i, :8] &= self._guard(b)
        if self.utf8[b].need > 0:
            out[i, 8:] = 0  # no special token inside a UTF-8 character
        if not bool((out[i] != 0).any()):
            out[i] = grammar_row

    def window_bitmasks(self, b: int, drafts: Sequence[int]) -> torch.Tensor | None:
        """Speculative decoding: row b's mask at each of the len(drafts) + 1 positions of a
        verify window, position j's as if drafts[:j] had been accepted. The matcher takes the
        drafts tentatively and is rolled back (xgrammar's ``rollback``), so row b is left as it
        was; positions after a draft the grammar rejects are all ones (never reached: that
        draft is masked at its own position, so it is rejected there). None if unconstrained."""
        m = self.matchers[b]
        if m is None:
            return None
        out = torch.full((len(drafts) + 1, self.words), -1, dtype=torch.int32)
        utf8 = self.utf8[b]
        saved = (utf8.need, utf8.lo, utf8.hi)
        taken = 0
        for j in range(len(drafts) + 1):
            if m.is_terminated():
                break
            self._fill_row(b, out, j)
            if j == len(drafts) or not m.accept_token(int(drafts[j])):
                break
            utf8.advance(int(drafts[j]))
            taken += 1
        if taken:
            m.rollback(taken)
        utf8.need, utf8.lo, utf8.hi = saved
        return out

    def accept(self, b: int, token_id: int) -> bool:
        """Advance row b's matcher; True if accepted (always True for unconstrained rows)."""
        m = self.matchers[b]
        if m is None:
            return True
        ok = bool(m.accept_token(int(token_id)))
        if ok:
            self.utf8[b].advance(int(token_id))
        return ok

    def terminated(self, b: int) -> bool:
        m = self.matchers[b]
        return m is not None and bool(m.is_terminated())

    def constrained(self, b: int) -> bool:
        return self.matchers[b] is not None
