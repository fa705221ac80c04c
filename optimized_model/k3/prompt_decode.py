"""Decode on real prompts: the step behind ``Model.prompt_step`` (the perf suite's prompt cases).

The benchmark step ``decode_step`` runs on a random state, where the router sees noise and
spreads its tokens over the experts nearly uniformly. A trained model on its own tasks routes
unevenly; this step measures that: the prompts are prefilled once (standard prefill, on either
path), then every call is one greedy decode step of real generation through the runner's
``decode`` (its CUDA graph, or the fast decoder's), each sequence fed its own last token.

``reset()`` puts the state back where the prefill left it, so every timed segment decodes the
same tokens from the same place; at most ``tokens`` calls may follow one reset (the cache has
room for exactly that many, so no call ever grows it and invalidates a captured graph).
"""

from __future__ import annotations

import torch

from .state import DecodeState


class PromptDecode:
    """One greedy decode step per call after prefilling ``prompts`` on ``runner``."""

    def __init__(self, runner, prompts: list[list[int]], tokens: int):
        if tokens < 1:
            raise ValueError(f"prompt_step: tokens = {tokens}; at least one decode step per reset")
        self.runner, self.tokens = runner, int(tokens)
        reserve, runner.reserve = runner.reserve, self.tokens + 1
        try:
            logits, state = runner.prefill(prompts)
        finally:
            runner.reserve = reserve
        # a state of its own: the runner's pooled one of this shape is shared with generate
        self.state: DecodeState = runner.adopt(state.clone())
        self.prefilled = state.clone()
        self.first = logits.argmax(-1)
        self.next = self.first.clone()
        self.calls = 0
        self.generated: list[torch.Tensor] = []  # the tokens decoded since the last reset

    def reset(self) -> None:
        self.state.copy_(self.prefilled)
        self.next.copy_(self.first)
        self.calls = 0
        self.generated = []

    def __call__(self) -> None:
        if self.calls == self.tokens:
            raise RuntimeError(f"prompt_step: {self.tokens} decode steps since the last reset(), the room its "
                               "cache was built with; call reset() first or build the step with more tokens")
        self.next = self.runner.decode(self.next, self.state).argmax(-1)
        self.calls += 1
        self.generated.append(self.next)

    def generated_ids(self) -> list[list[int]]:
        """The tokens decoded since the last reset, per sequence."""
        if not self.generated:
            return [[] for _ in range(self.state.batch)]
        return torch.stack(self.generated, dim=1).tolist()

    def traffic(self) -> dict:
        """Bytes the first decode step after a reset must move (traffic.py): the real router's experts."""
        from .traffic import decode_traffic

        return decode_traffic(self.runner.model, self.first, self.prefilled)
