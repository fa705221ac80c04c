"""The K3-mini fast decoder: one decode step of the whole model with the fast kernels, static
buffers and (on CUDA) one CUDA graph per (batch, state).

  packed.py      the weights, packed once per layer kind
  step_plan.py   every tuning-table choice for a batch, resolved once (StepPlan)
  buffers.py     the static buffers of a batch
  step.py        the step itself: the layer loop (attention.py, moe_block.py per layer)
  schedule.py    the CUDA streams and the L2 prefetches
  gemv_call.py   one GEMV launch at a call site (Triton or the CuTe twin, split-K scratch)
  graphs.py      the CUDA-graph cache and capture
  verify_step.py a speculative verify step (B sequences x T tokens as B*T rows)
  bench_hook.py  ``decode_step``, the benchmark hook

On CPU (Triton interpreter) the step runs eagerly, sequentially, and ``decode_graph`` is
refused with reason ``no_cuda``.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from fastpath import trace

from . import tuning
from .bench_hook import make_decode_step
from .buffers import StepBuffers, allocate
from .gemv_call import GemvLauncher
from .graphs import GraphCache
from .packed import pack_head, pack_layer
from .schedule import Streams
from .step import DecodeStep
from .step_plan import build_plan, is_current
from .verify_step import VerifyStep, new_trail
from .tuning import L2_SITES  # noqa: F401  (where the step can prefetch; tests read it here)


class FastDecoder:
    """Built by ``dispatch.build_fast_decoder``. ``decode(tokens, state)`` → fp32 logits [B, V]
    (state updated in place, like ``K3Model.decode``); ``decode_step(batch, context)`` → a
    callable running one step (a graph replay on CUDA); ``sampler``: the fused FastSampler."""

    def __init__(self, model: Any, state_factory: Callable[..., Any] | None = None, *,
                 max_context: int | None = None, use_graphs: bool | None = None,
                 max_graphs: int = 16):
        self.model = model
        self.cfg = cfg = model.cfg
        self.device = torch.device(model.device)
        self.dtype = model.dtype
        self.state_factory = state_factory
        self.on_cuda = self.device.type == "cuda" and not tuning.device_name(self.device) == tuning.CPU_DEVICE
        self.use_graphs = self.on_cuda if use_graphs is None else (bool(use_graphs) and self.on_cuda)
        self.max_graphs = max_graphs
        self.streams = Streams(self.device, self.on_cuda)
        self.graphs = GraphCache(self.device, self.streams.main, max_graphs)
        self.layers = [pack_layer(model, i) for i in range(cfg.n_layers)]
        self.head = pack_head(model)
        self._launcher = GemvLauncher(self.device, cfg.norm_eps)
        self._buffers: dict[int, StepBuffers] = {}
        self._steps: dict[int, DecodeStep] = {}
        from .kernels.sampler import FastSampler

        self.sampler = FastSampler(n_valid=cfg.n_real_tokens)

    def step_for(self, B: int, T: int = 1, verify: bool = False) -> DecodeStep:
        """The step of batch ``B``: its plan resolved from the tuning table the first time (and
        again only if the table in use was swapped since), its buffers allocated once.
        ``verify``: the verify step of B sequences x T tokens (verify_step.py), planned as B*T
        rows (T = 1 too: a verify step whose rows proposed no draft)."""
        key = (B, T, verify)
        step = self._steps.get(key)
        if step is None or not is_current(step.plan, self.device):
            M = B * T
            plan = build_plan(self.cfg, self.layers, self.head.lm_head, M, self.device, self.on_cuda)
            bufs = self._buffers.get(M)  # a decode step of M rows and a verify step share them
            if bufs is None:
                block_m = plan.moe.experts_block_m if plan.moe else 1
                bufs = self._buffers[M] = allocate(self.cfg, [p.attn.w_in.shape[0] for p in self.layers], M,
                                                   block_m, self.device, self.dtype, self.on_cuda)
            args = (self.cfg, self.layers, self.head, plan, bufs, self.streams, self._launcher, self.device,
                    self.on_cuda)
            if not verify:
                step = DecodeStep(*args)
            else:
                old = self._steps.get(key)
                trail = old.trail if old is not None else new_trail(self.cfg, B, T, self.device, self.dtype)
                step = VerifyStep(*args, tokens=T, trail=trail)
            self._steps[key] = step
        return step

    def buffers(self, B: int) -> StepBuffers:
        """The static buffers of batch ``B`` (``.logits``: the last step's logits)."""
        return self.step_for(B).bufs

    @torch.inference_mode()
    def decode(self, tokens: torch.Tensor, state: Any) -> torch.Tensor:
        """One decode step; returns fp32 logits [B, V] (a fresh tensor)."""
        out = self._run(self.step_for(state.batch), tokens, state)
        if hasattr(state, "max_len"):
            state.max_len += 1
        return out

    @torch.inference_mode()
    def verify(self, tokens: torch.Tensor, state: Any) -> tuple[torch.Tensor, Any]:
        """A verify step of ``tokens [B, T]`` (``K3Model.verify``'s contract): fp32 logits
        [B, T, V] (a fresh tensor) and the trail to commit (``FastTrail.commit``; the step's static
        buffers: commit before the next verify step of this shape)."""
        B, T = tokens.shape
        step = self.step_for(B, T, verify=True)
        return self._run(step, tokens.reshape(-1), state).view(B, T, -1), step.trail

    def _run(self, step: DecodeStep, tokens: torch.Tensor, state: Any) -> torch.Tensor:
        """``step`` on ``tokens`` (one per row): a graph replay on CUDA, else eager (the whole-step
        graph refused with the reason); returns a copy of the logits."""
        step.bufs.tokens.copy_(tokens.to(self.device))
        if self.use_graphs:
            self.graphs.replay(step, state)
            return step.bufs.logits.clone()
        trace.refused("decode_graph", "no_cuda" if self.device.type != "cuda" else "graphs_off",
                      batch=state.batch)
        return step(state).clone()

    def decode_step(self, batch: int, context: int, draft: int = 0, seed: int = 0) -> Callable[[], None]:
        """A callable running one fast decode step of ``batch`` sequences at ``context`` tokens
        (lengths reset to ``context`` inside the step), greedy-sampled by the fused sampler
        (so the step covers every component). A CUDA-graph replay on CUDA. ``draft`` > 0: a
        verify step of draft + 1 tokens per sequence that keeps them all."""
        return make_decode_step(self, batch, context, draft, seed)
