"""Drafters for speculative decoding (speculative.py has the rule that judges their drafts).

``propose(contexts, active, runner, state) -> list[list[int]]``: per sequence at most K draft
tokens to follow ``contexts[b]`` (prompt + emitted tokens; its last token is not in ``state``
yet: the verify step feeds it first); inactive (finished) rows get []. Both drafters here are
deterministic (q is one-hot at each draft).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any, Sequence

import numpy as np
import torch

from .speculative import SpecConfig
from .state import DecodeState


class NgramDrafter:
    """Prompt lookup (vLLM's "ngram" method): find the longest n-gram, n in
    [prompt_lookup_min, prompt_lookup_max], that ends the context and occurs earlier in it;
    propose the (up to) K tokens that followed its earliest occurrence. No match: no draft."""

    method, synthetic = "ngram", False

    def __init__(self, k: int, prompt_lookup_min: int = 2, prompt_lookup_max: int = 5):
        self.k, self.min_n, self.max_n = k, prompt_lookup_min, prompt_lookup_max

    def propose_one(self, context: Sequence[int]) -> list[int]:
        tokens = np.asarray(context, dtype=np.int64)
        L = len(tokens)
        for n in range(min(self.max_n, L - 1), self.min_n - 1, -1):
            # every n-gram of tokens[:-1] (so not the suffix itself) against the suffix
            grams = np.lib.stride_tricks.sliding_window_view(tokens[:-1], n)
            hits = np.flatnonzero((grams == tokens[L - n:]).all(axis=1))
            if hits.size:
                start = int(hits[0]) + n
                return tokens[start:start + self.k].tolist()
        return []

    def propose(self, contexts: Sequence[Sequence[int]], active: Sequence[bool], runner: Any = None,
                state: DecodeState | None = None) -> list[list[int]]:
        return [self.propose_one(c) if a else [] for c, a in zip(contexts, active)]


class SyntheticDrafter:
    """SYNTHETIC, for benchmarking the verify step at a chosen acceptance length (as the K3
    "synthetic AL" benchmark); never a real drafter, labelled ``synthetic`` in every result.

    ``acceptance_length`` A = tokens a greedy verify step emits on average (1 + accepted drafts).
    At its s-th verify step (s = 0, 1, ...) a sequence is given a_s = floor((s+1)(A-1)) -
    floor(s(A-1)) correct drafts (so the mean of a_s over any run of steps is A - 1 to within
    1/steps, exactly A - 1 for an integer A): the target's own greedy continuation for the first
    a_s positions, then tokens the target never picks for the rest of the K positions: a padding
    id (its logit is -inf, so no sampler draws it), or where the vocabulary has no padding the
    greedy token + 1 (wrapping in the real vocabulary). A greedy request then accepts exactly
    a_s drafts per step and its output is plain decoding's.

    The greedy continuation comes from a lookahead: plain decode steps of the target on a copy
    of the state (max a_s of them per verify step, one more without padding; a benchmark times
    the verify step, not this). At A = 1 there is none: the drafter runs no model, so a profile
    of the generation holds the verify steps' kernels only. The lookahead ignores grammar masks,
    stops and temperature: constrained or sampled rows accept fewer drafts than A - 1.
    """

    method, synthetic = "synthetic", True

    def __init__(self, k: int, acceptance_length: float):
        self.k = k
        self.rate = Fraction(str(acceptance_length)) - 1  # correct drafts per step
        self.steps: dict[int, int] = {}  # row -> verify steps proposed for so far

    def correct_drafts(self, b: int) -> int:
        s = self.steps.get(b, 0)
        return min(self.k, int((s + 1) * self.rate) - int(s * self.rate))

    @torch.no_grad()
    def propose(self, contexts: Sequence[Sequence[int]], active: Sequence[bool], runner: Any,
                state: DecodeState) -> list[list[int]]:
        want = [self.correct_drafts(b) if a else -1 for b, a in enumerate(active)]
        cfg = runner.model.cfg
        padding = cfg.n_real_tokens if cfg.vocab_size > cfg.n_real_tokens else None
        extra = 0 if padding is not None else 1  # without padding the wrong token needs the greedy one
        ahead = max((min(self.k, w + extra) for w in want if w >= 0), default=0)
        greedy = self._lookahead(runner.model, [c[-1] for c in contexts], state, ahead)
        out: list[list[int]] = []
        for b, w in enumerate(want):
            if w < 0:
                out.append([])
                continue
            self.steps[b] = self.steps.get(b, 0) + 1
            wrong = padding if padding is not None or w == self.k else (greedy[b][w] + 1) % cfg.n_real_tokens
            out.append(greedy[b][:w] + [wrong] * (self.k - w))
        return out

    @staticmethod
    def _lookahead(model: Any, last: list[int], state: DecodeState, n: int) -> list[list[int]]:
        """The target's next n greedy tokens per row, decoded on a copy of ``state``."""
        if n == 0:
            return [[] for _ in last]
        st = state.clone()
        if st.max_len + n > st.capacity:  # room for the lookahead in the copy only
            pad = st.latent.new_zeros(*st.latent.shape[:2], st.max_len + n - st.capacity, st.latent.shape[3])
            st.latent = torch.cat([st.latent, pad], dim=2)
        tok = torch.tensor(last, dtype=torch.long, device=model.device)
        rows = []
        for _ in range(n):
            tok = torch.argmax(model.decode(tok, st), dim=-1)
            rows.append(tok.tolist())
        return [list(r) for r in zip(*rows)]


def make_drafter(cfg: SpecConfig):
    if cfg.method == "ngram":
        return NgramDrafter(cfg.num_speculative_tokens, cfg.prompt_lookup_min, cfg.prompt_lookup_max)
    if cfg.method == "synthetic":
        return SyntheticDrafter(cfg.num_speculative_tokens, cfg.acceptance_length)
    raise ValueError(f"speculative method {cfg.method!r}")
