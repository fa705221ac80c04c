"""The fixture's model: vLLM's own Llama, plus a "fast path" for the LM head behind
``additional_config={"decode_backend": "latency_specialized"}``, dispatching like K3-mini's.

Fast path (switch on): a decode step (every request in the step has one new token and some
context) of at most MAX_BATCH requests computes the logits with ``fast_head.fast_lm_head``
(fp32, chunked over the hidden size: the same math, written differently) and reports
``engaged("lm_head", "chunked_fp32", batch=...)``; any other step runs vLLM's LM head and reports
``refused("lm_head", reason)`` with reason ``prefill``, ``mixed_batch`` or
``batch_out_of_scope``. Switch off (or another value): vLLM's path, no event, as vLLM would.

The step kind comes from vLLM's attention metadata of the step (``query_start_loc``,
``seq_lens``), read through ``vllm.forward_context``. Events go to ``fastpath.trace``; this
runs in vLLM's engine-core / worker process, so the model opens the harness's worker sink.

Planted defect (the coverage gate must catch it): ``FASTPATH_VLLM_FIXTURE_FAULT=silent_fallback``
in the environment makes the switched-on model run vLLM's LM head everywhere and report nothing.
"""

from __future__ import annotations

import os

import torch
from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size
from vllm.forward_context import get_forward_context, is_forward_context_available
from vllm.model_executor.models.llama import LlamaForCausalLM

from fastpath import trace

from .fast_head import CHUNK, fast_lm_head  # noqa: F401  (CHUNK: the kernel's one knob)

SWITCH = {"decode_backend": "latency_specialized"}
COMPONENT = "lm_head"
VARIANT = "chunked_fp32"
MAX_BATCH = 4  # the fixture's fast-path scope: decode batches 1..4
FAULT_ENV = "FASTPATH_VLLM_FIXTURE_FAULT"


def switch_on(additional_config) -> bool:
    cfg = additional_config or {}
    return all(str(cfg.get(k)) == v for k, v in SWITCH.items())


def step_kind() -> tuple[str, int]:
    """("decode" | "prefill" | "mixed_batch" | "none", number of requests) of the running step."""
    if not is_forward_context_available():
        return "none", 0
    meta = get_forward_context().attn_metadata
    if isinstance(meta, list):
        meta = meta[0] if meta else None
    if not meta:
        return "none", 0  # vLLM's memory-profiling / dummy runs: not a step of any request
    m = next(iter(meta.values()))
    q = m.query_start_loc.tolist()
    qlens = [b - a for a, b in zip(q, q[1:])]
    seqs = m.seq_lens.tolist()[:len(qlens)]
    decode = [ql == 1 and s > 1 for ql, s in zip(qlens, seqs)]
    if all(decode):
        return "decode", len(qlens)
    return ("mixed_batch" if any(decode) else "prefill"), len(qlens)


class FastpathTinyLlamaForCausalLM(LlamaForCausalLM):
    def __init__(self, *, vllm_config, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        self.fast = switch_on(vllm_config.additional_config)
        self.silent_fallback = os.environ.get(FAULT_ENV) == "silent_fallback"
        self.tp = get_tensor_model_parallel_world_size()
        self._step = ("none", 0)
        trace.open_sink_from_env(rank=get_tensor_model_parallel_rank())

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
        if self.fast:
            self._step = step_kind()
        return super().forward(input_ids, positions, intermediate_tensors, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        kind, batch = self._step
        if not self.fast or self.silent_fallback or kind == "none":
            return super().compute_logits(hidden_states)
        reason = None
        if kind != "decode":
            reason = kind
        elif batch > MAX_BATCH:
            reason = "batch_out_of_scope"
        elif self.tp != 1:
            reason = "tp_out_of_scope"
        if reason is not None:
            trace.refused(COMPONENT, reason, batch=batch)
            return super().compute_logits(hidden_states)
        trace.engaged(COMPONENT, VARIANT, batch=batch)
        return fast_lm_head(hidden_states, self.lm_head.weight, self.logits_processor.org_vocab_size)
