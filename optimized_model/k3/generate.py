"""The K3-mini generation loop: batched prefill, then batched decode until every request ends.

``generate(runner, tokenizer, requests)`` drives any runner with

* ``prefill(prompts: list[list[int]]) -> (logits [B, V] fp32 at each prompt's last position, state)``
* ``decode(tokens: LongTensor[B], state) -> logits [B, V] fp32`` (one token per row, advances state)
* ``vocab_size`` (padded), ``device``, optionally ``sampler`` (the fast path's fused sampler);
  otherwise the standard ``Sampler`` is used.

Per step: padding ids (>= tokenizer.n_real_tokens) are masked; the grammar bitmask of
constrained rows is filled; sampled rows draw their Exp(1) noise from their own seeded CPU
generator (greedy and finished rows draw nothing, so a request's samples do not depend on the
rest of the batch); the sampler picks tokens.

Finishing, checked in this order after each token:
  grammar termination (the grammar accepted the stop token)  -> "grammar"
  eos (unless ``ignore_eos``) or one of ``stop_token_ids``     -> "stop"
  a stop string appears in the decoded text                    -> "stop"
  ``max_tokens`` generated                                     -> "length"
``token_ids`` / ``logprobs`` include every sampled token (the stop token too); ``text`` is the
decoded text without the stop token (specials and padding never decode) and cut before a
matched stop string. Finished rows keep being fed the eos id (a real, pad-free token) until the
whole batch is done; their outputs are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from .sampling import Sampler, SamplingParams, make_generators
from .speculative import SpecConfig, SpecStats, accept

__all__ = ["GenerationResult", "generate"]


@dataclass
class GenerationResult:
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str = "length"  # "stop" | "length" | "grammar"
    logprobs: list[float] | None = None
    speculative: SpecStats | None = None  # acceptance statistics when speculation was on


class _Row:
    def __init__(self, req: Any, tokenizer: Any):
        self.req = req
        # ignore_eos (as vLLM's): eos is generated like any token; explicit stop ids still stop
        eos = set() if getattr(req, "ignore_eos", False) else {int(tokenizer.eos_id)}
        self.stop_ids = {*eos, *(int(t) for t in (req.stop_token_ids or []))}
        self.stop_strings = [s for s in (req.stop_strings or []) if s]
        self.max_stop_bytes = max((len(s.encode("utf-8")) for s in self.stop_strings), default=0)
        self.tokens: list[int] = []
        self.logprobs: list[float] = []
        self.bytes = bytearray()
        self.done = False
        self.reason = "length"
        self.stopped_on_token = False
        self.cut_at: int | None = None  # character index of a matched stop string
        self.spec: SpecStats | None = None

    def push(self, b: int, t: int, lp: float, structured: Any, tokenizer: Any) -> None:
        """Append one sampled token and apply the finishing rules (module doc)."""
        self.tokens.append(t)
        self.logprobs.append(lp)
        if structured is not None and structured.constrained(b):
            if not structured.accept(b, t):
                raise RuntimeError(f"request {b}: sampled token {t} was rejected by its grammar (the "
                                   "bitmask was not applied by the sampler)")
            if structured.terminated(b):
                self.done, self.reason, self.stopped_on_token = True, "grammar", t == int(tokenizer.eos_id)
                return
        if t in self.stop_ids:
            self.done, self.reason, self.stopped_on_token = True, "stop", True
            return
        if 0 <= t < 256:
            self.bytes.append(t)
        if self.check_stop_string(tokenizer):
            self.done, self.reason = True, "stop"
            return
        if len(self.tokens) >= self.req.max_tokens:
            self.done, self.reason = True, "length"

    def check_stop_string(self, tokenizer: Any) -> bool:
        if not self.stop_strings:
            return False
        # A new match must end in the newest bytes (older text was checked before), so decode
        # only a tail window covering the longest stop string; a multibyte char split at the
        # window start decodes to U+FFFD there and cannot create a false match.
        window = bytes(self.bytes[-(self.max_stop_bytes + 8):])
        tail = window.decode("utf-8", errors="replace")
        if not any(s in tail for s in self.stop_strings):
            return False
        text = tokenizer.decode(self.tokens)
        hits = [text.find(s) for s in self.stop_strings]
        hits = [h for h in hits if h >= 0]
        if not hits:
            return False
        self.cut_at = min(hits)
        return True


def _check_requests(requests: Sequence[Any], vocab: int) -> None:
    for i, r in enumerate(requests):
        if not r.prompt_ids:
            raise ValueError(f"request {i}: empty prompt (encode with bos=True)")
        bad = [t for t in r.prompt_ids if not 0 <= int(t) < vocab]
        if bad:
            raise ValueError(f"request {i}: prompt ids out of the vocabulary [0, {vocab}): {bad[:5]}")
        SamplingParams.from_request(r).validate()


@torch.no_grad()
def generate(runner: Any, tokenizer: Any, requests: Sequence[Any], speculative: Any = None) -> list[GenerationResult]:
    """``speculative``: None, or a ``speculative.SpecConfig`` / its table (then the runner
    also needs ``verify`` and ``commit``): the first token comes from the prefill as usual,
    every later step is a verify step (``_speculate``)."""
    spec = SpecConfig.parse(speculative)
    if not requests:
        return []
    vocab = int(getattr(runner, "vocab_size", tokenizer.vocab_size))
    n_valid = int(getattr(tokenizer, "n_real_tokens", vocab))
    _check_requests(requests, vocab)
    sampler = getattr(runner, "sampler", None) or Sampler(n_valid=n_valid)
    params = [SamplingParams.from_request(r) for r in requests]
    gens = make_generators(params)
    rows = [_Row(r, tokenizer) for r in requests]
    for row in rows:
        if row.req.max_tokens <= 0:
            row.done, row.reason = True, "length"

    structured = None
    if any(getattr(r, "structured", None) for r in requests):
        from .structured import StructuredBatch

        structured = StructuredBatch(tokenizer, [getattr(r, "structured", None) or None for r in requests])

    if all(row.done for row in rows):
        return [_result(row, tokenizer) for row in rows]

    logits, state = runner.prefill([list(map(int, r.prompt_ids)) for r in requests])
    eos = int(tokenizer.eos_id)
    any_sampled = any(not p.greedy for p in params)
    while True:
        logits = logits.float()
        if n_valid < logits.shape[-1]:
            logits = logits.clone()
            logits[:, n_valid:] = float("-inf")
        done = [row.done for row in rows]
        bitmask = structured.fill_bitmask(done) if structured is not None else None
        step_gens = [None if done[b] else g for b, g in enumerate(gens)]
        noise = sampler.draw_noise(step_gens, logits.shape[-1]) if any_sampled else None
        tokens, lps = sampler.sample(logits, params, noise, bitmask)
        tokens_l = tokens.tolist()
        lps_l = lps.float().tolist()
        for b, row in enumerate(rows):
            if not row.done:
                row.push(b, int(tokens_l[b]), float(lps_l[b]), structured, tokenizer)
        if all(row.done for row in rows):
            break
        if spec is not None:
            return _speculate(runner, tokenizer, rows, state, spec, params, gens, structured, n_valid)
        feed = torch.tensor(
            [eos if row.done else row.tokens[-1] for row in rows], dtype=torch.long, device=runner.device
        )
        logits = runner.decode(feed, state)
    return [_result(row, tokenizer) for row in rows]


def _speculate(runner: Any, tokenizer: Any, rows: list[_Row], state: Any, spec: SpecConfig,
               params: list[SamplingParams], gens: list, structured: Any, n_valid: int) -> list[GenerationResult]:
    """Speculative steps after the first token: draft, verify, accept, keep the accepted prefix.

    Every unfinished row feeds its last emitted token and its drafts (padded to the batch's
    longest with eos, never accepted: only a row's own drafts are judged); finished rows feed
    eos. ``commit`` keeps 1 + accepted tokens per row; a row that finished inside the window
    keeps 1 (its state no longer matters)."""
    from .drafters import make_drafter

    drafter = make_drafter(spec)
    sampler = getattr(runner, "sampler", None) or Sampler(n_valid=n_valid)
    eos = int(tokenizer.eos_id)
    prompts = [list(map(int, row.req.prompt_ids)) for row in rows]
    for row in rows:
        row.spec = SpecStats(spec.method, spec.synthetic, spec.num_speculative_tokens)
    while not all(row.done for row in rows):
        active = [not row.done for row in rows]
        drafts = drafter.propose([p + row.tokens for p, row in zip(prompts, rows)], active, runner, state)
        T = 1 + max(len(d) for d in drafts)
        feed = [[eos] * T if row.done else [row.tokens[-1], *d, *[eos] * (T - 1 - len(d))]
                for row, d in zip(rows, drafts)]
        logits, trail = runner.verify(torch.tensor(feed, dtype=torch.long), state)
        masks = [None if row.done or structured is None else structured.window_bitmasks(b, d)
                 for b, (row, d) in enumerate(zip(rows, drafts))]
        targets = _greedy_targets(sampler, logits, rows, drafts, params, masks)
        logits = logits.float().cpu()
        keep = [1] * len(rows)
        for b, row in enumerate(rows):
            if row.done:
                continue
            d = drafts[b]
            toks, lps, n_acc = accept(logits[b, : len(d) + 1], d, params[b], gens[b], masks[b], n_valid=n_valid,
                                      targets=targets.get(b))
            row.spec.steps += 1
            row.spec.drafted += len(d)
            row.spec.accepted += n_acc
            for t, lp in zip(toks, lps):
                row.push(b, t, lp, structured, tokenizer)
                if row.done:
                    break
            keep[b] = 1 if row.done else len(toks)
        runner.commit(state, trail, keep)
    return [_result(row, tokenizer) for row in rows]


def _greedy_targets(sampler: Any, logits: torch.Tensor, rows: list[_Row], drafts: list[list[int]],
                    params: list[SamplingParams], masks: list) -> dict[int, tuple[list[int], list[float]]]:
    """Greedy rows' target tokens and logprobs at each position of their verify window, drawn by
    the path's own sampler in one call over every such position (the fast path's fused kernel,
    as in a decode step), with the grammar's window masks; ``accept`` judges drafts by them."""
    spans = [(b, len(drafts[b]) + 1) for b, row in enumerate(rows) if not row.done and params[b].greedy]
    if not spans:
        return {}
    flat = torch.cat([logits[b, :n] for b, n in spans]).float()
    bitmask = None
    if any(masks[b] is not None for b, _ in spans):
        words = next(masks[b].shape[-1] for b, _ in spans if masks[b] is not None)
        bitmask = torch.cat([masks[b] if masks[b] is not None else torch.full((n, words), -1, dtype=torch.int32)
                             for b, n in spans]).to(flat.device)
    toks, lps = sampler.sample(flat, [params[b] for b, n in spans for _ in range(n)], None, bitmask)
    toks_l, lps_l = toks.tolist(), lps.float().tolist()
    out, at = {}, 0
    for b, n in spans:
        out[b] = (toks_l[at: at + n], lps_l[at: at + n])
        at += n
    return out


def _result(row: _Row, tokenizer: Any) -> GenerationResult:
    body = row.tokens[:-1] if row.stopped_on_token else row.tokens
    text = tokenizer.decode(body)
    if row.cut_at is not None:
        text = text[: row.cut_at]
    return GenerationResult(
        token_ids=list(row.tokens),
        text=text,
        finish_reason=row.reason,
        logprobs=list(row.logprobs) if getattr(row.req, "logprobs", False) else None,
        speculative=row.spec,
    )
