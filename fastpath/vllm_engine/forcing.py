"""Teacher forcing through real decode steps: a vLLM logits processor that forces each
request's next token to the one given in ``SamplingParams.extra_args["fastpath_forced"]``.

Why this mechanism: prompt logprobs come from the prefill and never run a decode step. A
request whose prompt is the first ``prefill_len`` tokens and whose *generated* tokens are
forced to the rest of the sequence runs one real decode step per remaining position. vLLM's
sampler computes the returned logprobs BEFORE logits processors run when
``logprobs_mode="raw_logprobs"`` (vllm/v1/sample/sampler.py, ``Sampler.forward``), so each
position's logprobs are the model's own, unaffected by the forcing mask.

Loaded by vLLM in its engine-core process by name (``FQCN``); importing this module without
vLLM installed still works (the class is then unusable), so fastpath never needs vLLM to import.
"""

from __future__ import annotations

try:
    import torch
    from vllm.v1.sample.logits_processor import LogitsProcessor as _Base
except ImportError:  # fastpath without vLLM: nothing here is used
    _Base = object

FQCN = "fastpath.vllm_engine.forcing:ForcedTokens"
KEY = "fastpath_forced"


class ForcedTokens(_Base):
    def __init__(self, vllm_config, device, is_pin_memory: bool):
        # batch row -> (forced token ids, the request's live output-token list)
        self.rows: dict[int, tuple[list[int], list[int]]] = {}

    def is_argmax_invariant(self) -> bool:
        return False  # it changes the greedy choice: vLLM must apply it under temperature 0 too

    def update_state(self, batch_update) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.rows.pop(index, None)
        for index, params, _prompt, output_ids in batch_update.added:
            forced = (getattr(params, "extra_args", None) or {}).get(KEY)
            if forced:
                self.rows[index] = (list(forced), output_ids)
            else:
                self.rows.pop(index, None)
        for a, b, direction in batch_update.moved:
            ra, rb = self.rows.pop(a, None), self.rows.pop(b, None)
            if ra is not None:
                self.rows[b] = ra
            if rb is not None and str(direction).endswith("SWAP"):
                self.rows[a] = rb

    def apply(self, logits: "torch.Tensor") -> "torch.Tensor":
        for index, (forced, output_ids) in self.rows.items():
            n = len(output_ids)
            if n < len(forced) and index < logits.shape[0]:
                token = forced[n]
                logits[index].fill_(float("-inf"))
                logits[index, token] = 0.0
        return logits
