"""The CUDA-graph cache of the fast decoder: the whole step captured once per (batch, state
tensors) under ``fastpath.trace.capturing(key)``; every replay reports
``fastpath.trace.replayed(key)``. At most ``max_graphs`` graphs are kept (the oldest is
forgotten first); all share one memory pool."""

from __future__ import annotations

import itertools
from typing import Any, Callable

import torch

from fastpath import trace

_graph_ids = itertools.count()


def state_key(state: Any) -> tuple:
    return tuple((t.data_ptr(), tuple(t.shape)) for t in state.tensors())


class GraphCache:
    def __init__(self, device, main_stream, max_graphs: int):
        self.device, self.main, self.max_graphs = device, main_stream, max_graphs
        self._graphs: dict[Any, tuple] = {}
        self._mempool = None

    def capture(self, step: Any, state: Any, lengths_base: torch.Tensor | None,
                extra: Callable[[], None] | None = None) -> tuple:
        """Warm up (compile) on a clone of the state, then capture the whole step (a
        ``step.DecodeStep``; and ``extra`` after it) on the main stream; (trace key, graph)."""
        B = step.plan.batch
        scratch = state.clone()
        main = self.main
        main.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(main):
            step(scratch)
            if extra is not None:
                extra()
        torch.cuda.current_stream(self.device).wait_stream(main)
        torch.cuda.synchronize(self.device)
        del scratch
        if self._mempool is None:
            self._mempool = torch.cuda.graph_pool_handle()
        key = ("k3_fast_decode", B, next(_graph_ids))
        graph = torch.cuda.CUDAGraph()
        with trace.capturing(key):
            with torch.cuda.graph(graph, pool=self._mempool, stream=main):
                if lengths_base is not None:
                    state.lengths.copy_(lengths_base)
                step(state)
                if extra is not None:
                    extra()
            trace.engaged("decode_graph", "cuda_graph_whole_step", batch=B,
                          dependent_launch=step.plan.pdl)
        return key, graph

    def replay(self, step: Any, state: Any) -> None:
        """Replay the graph of (this batch, these state tensors), capturing it first if new."""
        skey = (step.plan.batch, getattr(step, "T", 0), state_key(state))  # T: a verify step
        entry = self._graphs.get(skey)
        if entry is None:
            if len(self._graphs) >= self.max_graphs:
                old_key, (gk, _) = next(iter(self._graphs.items()))
                trace.forget(gk)
                del self._graphs[old_key]
            saved = getattr(state, "max_len", None)
            entry = self._graphs[skey] = self.capture(step, state, None)
            if saved is not None:
                state.max_len = saved
        gk, graph = entry
        graph.replay()
        trace.replayed(gk)
