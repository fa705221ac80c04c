"""The step's CUDA streams and the L2 prefetches issued on one of them.

Stream priorities: lower number = higher priority; graph kernel nodes keep the priority of the
stream they were captured from. The step is captured on ``main`` (high) — not on torch's
default capture stream, whose priority is the lowest, the same as the side stream's — so the
critical path's blocks are scheduled before the shared expert's. Off CUDA there are no streams
(every field None) and the step runs sequentially.
"""

from __future__ import annotations

import torch

from fastpath import trace

from .kernels import l2_prefetch as L2
from .step_plan import L2PrefetchPlan


class Streams:
    def __init__(self, device, on_cuda: bool):
        if on_cuda:
            self.main = torch.cuda.Stream(device=device, priority=-1)  # the step is captured here
            self.aux = torch.cuda.Stream(device=device, priority=-1)  # beside the routed chain
            self.side = torch.cuda.Stream(device=device, priority=0)  # the shared expert
            # L2 prefetches (table data "l2_prefetch") get their own stream: one on the side
            # stream would also wait for the shared expert queued there
            self.prefetch = torch.cuda.Stream(device=device, priority=0)
            self.prefetch_fork, self.prefetch_join = torch.cuda.Event(), torch.cuda.Event()
        else:
            self.main = self.aux = self.side = self.prefetch = None


class L2Prefetcher:
    """Asks the L2 for (the plan's fraction of) an upcoming weight on the prefetch stream,
    starting once the main stream's work so far is done — so it runs beside what the main
    stream does next. Nothing waits for it but the step's end (``join``)."""

    def __init__(self, streams: Streams, device, plan: L2PrefetchPlan):
        self.streams, self.device, self.plan = streams, device, plan
        self.pending = False

    def begin(self) -> None:
        self.pending = False

    def prefetch(self, site: str, i: int, B: int, w) -> None:
        frac = self.plan.fraction(site)
        if frac <= 0.0:
            return
        s = self.streams
        main = torch.cuda.current_stream(self.device)
        s.prefetch_fork.record(main)
        with torch.cuda.stream(s.prefetch):
            s.prefetch.wait_event(s.prefetch_fork)
            n = L2.l2_prefetch(w, frac, chunk=self.plan.chunk, per_program=self.plan.per_program)
        self.pending = True
        trace.engaged("dense_gemv", "l2_prefetch", layer=i, site=site, batch=B, bytes=n)

    def join(self) -> None:
        if self.pending:  # a capture must end with every stream joined back
            self.streams.prefetch_join.record(self.streams.prefetch)
            torch.cuda.current_stream(self.device).wait_event(self.streams.prefetch_join)
