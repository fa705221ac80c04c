"""Speculative decoding on K3-mini's standard path: the settings, the acceptance rule, the
statistics. The loop is in generate.py, the drafters in drafters.py, the verify step in
model.py (``K3Model.verify`` / ``commit``).

A step, per sequence: the drafter proposes up to K tokens d_1..d_n; one verify step runs the
last emitted token and the drafts (T = 1 + the batch's longest draft) and gives the target's
logits at every position; p_j is position j's final distribution, made exactly as the
non-speculative sampler makes it (sampling.py: vocabulary padding and the grammar's bitmask at
that position masked, then temperature, top-k, top-p). Draft j+1 is judged by p_j:

* greedy (temperature 0): accepted while it equals argmax p_j; the first mismatch position a
  emits argmax p_a instead (so does position n when every draft is accepted: the bonus token).
* sampled: the standard speculative-sampling rule. Draft d is accepted with probability
  min(1, p_j(d) / q_j(d)); on rejection a token is drawn from norm(max(0, p_j - q_j)) and the
  step ends; with every draft accepted a bonus token is drawn from p_n. q_j is the drafter's
  distribution: one-hot at d for the deterministic drafters here, so d is accepted with
  probability p_j(d) and the residual is p_j with d removed. Each emitted token is then
  distributed exactly as normal decoding's (the G-test in tests/test_k3_speculative.py).

Every step emits accepted + 1 tokens. The randomness (uniforms for the accept test, Exp(1) noise
for the draws, the same race as sampling.py) comes from the request's own seeded CPU generator,
so a seeded request is reproducible; it consumes the generator differently from normal
decoding, so the same seed gives the same distribution, not the same tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch

from .sampling import SamplingParams, apply_bitmask, final_probs

METHODS = ("ngram", "synthetic")
MAX_DRAFT = 16


@dataclass(frozen=True)
class SpecConfig:
    """The engine option ``speculative`` (vLLM's speculative_config names):
    ``{method = "ngram" | "synthetic", num_speculative_tokens = K, ...}``.

    ngram: ``prompt_lookup_min`` / ``prompt_lookup_max``, the n-gram lengths tried.
    synthetic (benchmarking only): ``acceptance_length``, the mean number of tokens a greedy
    verify step emits (1 + accepted drafts, vLLM's "mean acceptance length"), 1 ..= K + 1."""

    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 5
    acceptance_length: float | None = None

    @property
    def synthetic(self) -> bool:
        return self.method == "synthetic"

    @classmethod
    def parse(cls, option: Any) -> "SpecConfig | None":
        """None / {} -> None (no speculation); a SpecConfig as it is; a mapping -> checked."""
        if option is None or isinstance(option, SpecConfig):
            return option
        if not isinstance(option, Mapping):
            raise ValueError(f"speculative must be a table such as {{method = \"ngram\", "
                             f"num_speculative_tokens = 3}}, got {option!r}")
        if not option:
            return None
        known = {"method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "acceptance_length"}
        unknown = sorted(set(option) - known)
        if unknown:
            raise ValueError(f"speculative: unknown key(s) {unknown}; known: {sorted(known)}")
        method = option.get("method")
        if method not in METHODS:
            raise ValueError(f"speculative.method {method!r}: use one of {', '.join(METHODS)}")
        k = option.get("num_speculative_tokens")
        if not isinstance(k, int) or not 1 <= k <= MAX_DRAFT:
            raise ValueError(f"speculative.num_speculative_tokens {k!r}: an integer in 1 ..= {MAX_DRAFT}")
        cfg = cls(method, k, int(option.get("prompt_lookup_min", 2)), int(option.get("prompt_lookup_max", 5)),
                  option.get("acceptance_length"))
        if not 1 <= cfg.prompt_lookup_min <= cfg.prompt_lookup_max:
            raise ValueError("speculative: need 1 <= prompt_lookup_min <= prompt_lookup_max, got "
                             f"{cfg.prompt_lookup_min}, {cfg.prompt_lookup_max}")
        if cfg.synthetic:
            al = cfg.acceptance_length
            if not isinstance(al, (int, float)) or not 1 <= al <= k + 1:
                raise ValueError(f"speculative.acceptance_length {al!r}: the synthetic drafter needs a "
                                 f"number in 1 ..= num_speculative_tokens + 1 = {k + 1}")
        elif cfg.acceptance_length is not None:
            raise ValueError("speculative.acceptance_length is the synthetic drafter's setting only")
        return cfg


@dataclass
class SpecStats:
    """Acceptance statistics of one request. ``accepted`` counts drafts the verifier accepted
    (also those past a stop or max_tokens inside the window, which are then not emitted)."""

    method: str
    synthetic: bool
    num_speculative_tokens: int
    steps: int = 0  # verify steps this request took part in (while unfinished)
    drafted: int = 0
    accepted: int = 0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens per verify step: 1 + accepted drafts per step (vLLM's definition)."""
        return 1.0 + self.accepted / self.steps if self.steps else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    def as_dict(self) -> dict:
        return {"method": self.method, "synthetic": self.synthetic,
                "num_speculative_tokens": self.num_speculative_tokens, "steps": self.steps,
                "drafted": self.drafted, "accepted": self.accepted,
                "mean_acceptance_length": self.mean_acceptance_length, "acceptance_rate": self.acceptance_rate}


def _draw(r: torch.Tensor, gen: torch.Generator) -> int:
    """A token from the distribution r [V] by sampling.py's race: argmax r / E, E ~ Exp(1)."""
    e = torch.empty(r.shape[-1], dtype=torch.float32).exponential_(1.0, generator=gen).to(r.device)
    return int(torch.argmax(torch.where(r > 0, r / e, torch.full_like(r, -1.0))))


def accept(logits: torch.Tensor, drafts: list[int], params: SamplingParams, gen: torch.Generator | None,
           bitmask: torch.Tensor | None = None, *, n_valid: int | None = None,
           draft_probs: torch.Tensor | None = None,
           targets: tuple[list[int], list[float]] | None = None) -> tuple[list[int], list[float], int]:
    """One sequence's verdict on its drafts. ``logits [T, V]`` fp32 from the verify step
    (T > len(drafts)); ``bitmask [T, words]`` the grammar mask at each position (or None);
    ``draft_probs [len(drafts), V]`` the drafter's q (None: one-hot, a deterministic drafter);
    ``targets``: a greedy row's argmax tokens and their logprobs at positions 0..len(drafts), as
    the path's sampler drew them (None: computed here from ``logits``).
    Returns (emitted tokens = accepted drafts + one more, their logprobs, accepted count)."""
    n = len(drafts)
    if params.greedy:
        if targets is None:
            x = apply_bitmask(logits.float(), bitmask, n_valid)
            best = torch.argmax(x, dim=-1).tolist()
            lps = torch.log_softmax(x, dim=-1).gather(1, torch.tensor(best)[:, None])[:, 0].tolist()
        else:
            best, lps = list(targets[0]), list(targets[1])
        a = 0
        while a < n and drafts[a] == best[a]:
            a += 1
        return best[: a + 1], lps[: a + 1], a
    if gen is None:
        raise ValueError("sampled rows (temperature > 0) need their generator")
    p = final_probs(logits.float(), [params] * logits.shape[0], bitmask, n_valid=n_valid)
    out: list[int] = []
    for j, d in enumerate(drafts):
        q = draft_probs[j].to(p) if draft_probs is not None else torch.nn.functional.one_hot(
            torch.tensor(d), p.shape[-1]).to(p)
        u = float(torch.rand((), generator=gen))
        if q[d] > 0 and u < float(p[j, d] / q[d]):
            out.append(d)
            continue
        residual = (p[j] - q).clamp_min(0)
        if float(residual.sum()) <= 0:  # only if p_j == q_j, where rejection has probability 0
            residual = p[j]
        t = _draw(residual / residual.sum(), gen)
        out.append(t)
        return out, [float(torch.log(p[i, tok])) for i, tok in enumerate(out)], j
    out.append(_draw(p[n], gen))  # every draft accepted: the bonus token
    return out, [float(torch.log(p[i, tok])) for i, tok in enumerate(out)], n
