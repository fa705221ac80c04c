"""``decode_step``: the benchmark hook — one fast decode step as a callable to time (a CUDA-graph
replay on CUDA), greedy-sampled by the fused sampler so the step covers every component; with a
draft, a verify step of draft + 1 tokens per sequence that commits them all."""

from __future__ import annotations

from typing import Any, Callable

import torch

from fastpath import trace


def make_decode_step(dec: Any, batch: int, context: int, draft: int = 0, seed: int = 0) -> Callable[[], None]:
    """A callable running one step of ``batch`` sequences at ``context`` tokens (lengths reset
    to ``context`` inside the step) on the FastDecoder ``dec``."""
    T = draft + 1  # a verify step of T tokens per sequence (all kept) when draft > 0
    cap = -(-(context + T) // 64) * 64
    if hasattr(dec.model, "random_state"):
        state = dec.model.random_state(batch, context, cap, seed=seed)
    else:
        state = dec.state_factory(batch, cap)
        state.lengths.fill_(context)
    base = state.lengths.clone()
    gen = torch.Generator().manual_seed(seed)
    step = dec.step_for(batch, T, verify=bool(draft))
    bufs = step.bufs
    # the same tokens as the standard path's benchmark step (runner._bench_inputs)
    shape = (batch, T) if draft else (batch,)
    tokens = torch.randint(0, dec.cfg.n_real_tokens, shape, generator=gen).to(dec.device).reshape(-1)
    from .kernels.sampler import sample_tensors

    V, M = dec.cfg.vocab_size, batch * T
    s_temp = torch.zeros(M, dtype=torch.float32, device=dec.device)
    s_topk = torch.zeros(M, dtype=torch.int32, device=dec.device)
    s_topp = torch.ones(M, dtype=torch.float32, device=dec.device)
    s_noise = torch.ones(M, V, dtype=torch.float32, device=dec.device)
    s_tok = torch.empty(M, dtype=torch.int64, device=dec.device)
    s_lp = torch.empty(M, dtype=torch.float32, device=dec.device)
    keep = torch.full((batch,), T, dtype=torch.long, device=dec.device)

    def sample():
        if draft:  # keep every token (the standard path's benchmark verify step does the same)
            step.trail.commit(state, keep)
        sample_tensors(bufs.logits, s_temp, s_topk, s_topp, s_noise, None,
                       n_valid=dec.cfg.n_real_tokens, out_tokens=s_tok, out_logprobs=s_lp)
        trace.engaged("sampler", dec.sampler.variant + ("" if dec.on_cuda else "_interp"),
                      batch=M, vocab=V)

    if dec.use_graphs:
        with torch.inference_mode():
            bufs.tokens.copy_(tokens)
            key, graph = dec.graphs.capture(step, state, base, extra=sample)

        def run() -> None:
            graph.replay()
            trace.replayed(key)

        # the graph reads and writes these tensors at every replay: they must live as long as
        # it does (a freed ``base`` or sampler buffer is reused by the next allocation, and
        # the replay then reads its lengths from someone else's memory)
        run._keep = (state, graph, bufs, base, s_temp, s_topk, s_topp, s_noise, s_tok, s_lp, keep)  # type: ignore[attr-defined]
        return run

    def run_eager() -> None:
        with torch.inference_mode():
            state.lengths.copy_(base)
            bufs.tokens.copy_(tokens)
            trace.refused("decode_graph", "no_cuda" if dec.device.type != "cuda" else "graphs_off",
                          batch=batch)
            dec.step_for(batch, T, verify=bool(draft))(state)  # (the plan of the table in use now, as every step)
            sample()

    return run_eager
