"""The K3-mini runner: what ``generate.generate`` drives (prefill / decode), plus the benchmark
step builders behind ``Model.decode_step`` / ``prefill_step`` / ``mixed_step``.

Standard path on GPU = decode captured in one CUDA graph per (batch, capacity), replayed with
static token / logits buffers, as a generic engine does. Graphs bind tensor addresses, so the
runner keeps ONE pooled decode state per (batch, capacity): a prefill of that shape writes into
it and returns it, and the graph of that shape replays on it. Consequence: one live generation
per batch shape at a time (``generate`` is sequential, so that holds).

Fast path (``fast_decoder`` given, i.e. the switch is on): every step first asks the single
dispatch point ``optimized_model.k3.fast.dispatch.select_decode(batch, context, kind, decoder=...)``:
an in-scope decode returns the fast decoder, which runs it (``decoder.decode(tokens, state)``);
a prefill / mixed / out-of-scope step gets None with the refusal already in fastpath.trace and
runs the standard code here. The standard path itself reports nothing.

Compiled standard step (``compile_mode``, the engine's ``standard_compile`` option; perf's
baseline): the benchmark hook ``decode_step`` runs ``K3Model.decode_tensors`` through
``torch.compile`` (Inductor, that mode; batch and cache capacity marked dynamic, so batch 1
and one general compile serve every shape) inside the same CUDA graph, as vLLM does. At a draft
the verify step and its commit are compiled the same way only with ``compile_verify`` (the
engine's ``standard_compile_verify``: a first try failed in Inductor on the H200, perf notes run V);
otherwise they run eager inside the graph. The compile runs in the graph's warm-up,
before any timed replay; ``generate`` / ``score`` keep the eager-in-graph step (the reference
math; the two agree within the bf16 noise floor, tests/test_k3_compiled.py).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from .model import K3Model
from .state import DecodeState


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


class _Graph:
    def __init__(self, graph, tokens, logits):
        self.graph, self.tokens, self.logits = graph, tokens, logits


class K3Runner:
    """prefill(prompts) -> (logits [B, V] fp32, state); decode(tokens [B], state) -> logits."""

    CAP_ALIGN = 256

    def __init__(self, model: K3Model, *, use_graphs: bool | None = None, fast_decoder: Any = None,
                 fast_mode: bool = False, reserve: int = 256, compile_mode: str | None = None,
                 compile_verify: bool = False):
        self.model = model
        self.vocab_size = model.cfg.vocab_size
        self.device = model.device
        self.use_graphs = (model.device.type == "cuda") if use_graphs is None else bool(use_graphs)
        if self.use_graphs and model.device.type != "cuda":
            raise ValueError("CUDA graphs need device='cuda'")
        self.fast = fast_decoder
        self.fast_mode = fast_mode
        if fast_mode and fast_decoder is None:
            raise RuntimeError("fast path requested but no fast decoder was built")
        self.sampler = getattr(fast_decoder, "sampler", None) if fast_mode else None
        self.reserve = reserve  # decode positions reserved after the longest prompt
        self._pool: dict[tuple[int, int], DecodeState] = {}
        self._graphs: dict[tuple[int, int], _Graph] = {}
        self._mempool = None
        self.compile_mode = None if compile_mode in (None, "", "off") else str(compile_mode)
        self._compiled = None
        self.compile_verify = bool(compile_verify)  # the benchmark's verify step compiled too
        self._compiled_verify_fn = None

    def clear_graph_cache(self) -> None:
        """Drop the captured decode graphs (benchmarks free memory between shapes); the pool's
        first graph stays alive, so a later capture into the shared pool is still valid."""
        self._graphs.clear()

    # -- dispatch -----------------------------------------------------------------------------
    def _select(self, batch: int, context: int, kind: str, draft: int = 0):
        if not self.fast_mode:
            return None
        from .fast import dispatch

        return dispatch.select_decode(batch, context, kind, decoder=self.fast, draft=draft)

    # -- state pool -----------------------------------------------------------------------------
    def state(self, batch: int, capacity: int) -> DecodeState:
        """The pooled (graphs) or a fresh (eager) empty state of this shape."""
        if not self.use_graphs:
            return self.model.new_state(batch, capacity)
        key = (batch, capacity)
        st = self._pool.get(key)
        if st is None:
            st = self._pool[key] = self.model.new_state(batch, capacity)
        else:
            for t in st.tensors():
                t.zero_()
            st.max_len = 0
        return st

    def adopt(self, state: DecodeState) -> DecodeState:
        """Make ``state`` the pooled state of its shape (its graph then replays on it)."""
        if self.use_graphs:
            key = (state.batch, state.capacity)
            if self._pool.get(key) is not state:
                self._pool[key] = state
                self._graphs.pop(key, None)
        return state

    def _grow(self, state: DecodeState, need: int) -> None:
        """Give ``state`` (in place: same object) a larger latent cache."""
        old_key = (state.batch, state.capacity)
        cap = _round_up(max(need, 2 * state.capacity), self.CAP_ALIGN)
        latent = state.latent.new_zeros(*state.latent.shape[:2], cap, state.latent.shape[3])
        latent[:, :, : state.capacity].copy_(state.latent)
        state.latent = latent
        if self.use_graphs:
            if self._pool.get(old_key) is state:
                del self._pool[old_key]
                self._graphs.pop(old_key, None)
            self.adopt(state)

    # -- generate interface ------------------------------------------------------------------------
    def prefill(self, prompts: list[list[int]]) -> tuple[torch.Tensor, DecodeState]:
        B = len(prompts)
        lens = [len(p) for p in prompts]
        if min(lens) < 1:
            raise ValueError("empty prompt")
        T = max(lens)
        self._select(B, T, "prefill")  # reports refused("prefill") on the fast path
        tokens = torch.zeros(B, T, dtype=torch.long)
        for b, p in enumerate(prompts):
            tokens[b, : len(p)] = torch.as_tensor(p, dtype=torch.long)
        state = self.state(B, _round_up(T + self.reserve, self.CAP_ALIGN))
        logits = self.model.prefill(tokens.to(self.device), torch.as_tensor(lens).to(self.device), state)
        return logits, state

    def decode(self, tokens: torch.Tensor, state: DecodeState) -> torch.Tensor:
        B = state.batch
        if state.max_len + 1 > state.capacity:
            self._grow(state, state.max_len + 1)
        fast = self._select(B, state.max_len, "decode")
        if fast is not None:
            return fast.decode(tokens, state)
        tokens = tokens.to(self.device)
        if not self.use_graphs:
            return self.model.decode(tokens, state)
        key = (B, state.capacity)
        if self._pool.get(key) is not state:
            self.adopt(state)
        g = self._graphs.get(key)
        if g is None:
            g = self._graphs[key] = self._capture(state)
        g.tokens.copy_(tokens)
        g.graph.replay()
        state.max_len += 1
        return g.logits.clone()

    # -- speculative decoding ----------------------------------------------------------------------
    def verify(self, tokens: torch.Tensor, state: DecodeState):
        """A verify step of ``tokens [B, T]`` (model.verify: eager, no CUDA graph) -> (logits
        [B, T, V] fp32, trail for ``commit``). On the fast path an in-scope step runs on the
        fast decoder (its trail has the same layout, so ``commit`` serves both); an
        out-of-scope one is refused with the declared reason (dispatch) and runs here."""
        B, T = tokens.shape
        if state.max_len + T > state.capacity:
            self._grow(state, state.max_len + T)
        fast = self._select(B, state.max_len, "verify", draft=T - 1)
        if fast is not None:
            return fast.verify(tokens, state)
        return self.model.verify(tokens.to(self.device), state)

    def commit(self, state: DecodeState, trail, keep: list[int]) -> None:
        """Keep the first ``keep[b]`` tokens of the last verify step in sequence b (a fast
        verify step's trail commits on the fast kernels: ``FastTrail.commit``)."""
        kept = torch.tensor(keep, dtype=torch.long, device=self.device)
        if hasattr(trail, "commit"):
            trail.commit(state, kept)
        else:
            self.model.commit(state, trail, kept)
        state.max_len += max(keep)

    # -- teacher-forced scoring ---------------------------------------------------------------
    def score(self, token_ids: list[list[int]], prefill_len: int | None = None) -> list[torch.Tensor]:
        """Teacher-forced fp32 logits [len, vocab] per sequence (row i predicts token i + 1).

        The first ``prefill_len`` positions (default: all) come from one batched ragged
        prefill; every later position from a decode step fed the true token, so on the fast
        path those rows are computed by the fast decoder — the step that parity must test."""
        if not token_ids:
            return []
        lens = [len(t) for t in token_ids]
        if min(lens) < 1:
            raise ValueError("score: empty sequence")
        B, T = len(lens), max(lens)
        p = T if prefill_len is None else max(1, min(int(prefill_len), min(lens)))
        tokens = torch.zeros(B, T, dtype=torch.long)
        for b, t in enumerate(token_ids):
            tokens[b, : lens[b]] = torch.as_tensor(t, dtype=torch.long)
        if p == T:
            self._select(B, T, "prefill")
            state = self.model.new_state(B, T)
            logits = self.model.prefill(tokens.to(self.device), torch.as_tensor(lens).to(self.device), state,
                                        all_logits=True)
            return [logits[b, : lens[b]].float().cpu() for b in range(B)]
        self._select(B, p, "prefill")
        state = self.state(B, _round_up(T + 1, self.CAP_ALIGN))
        prefix = tokens[:, :p].to(self.device)
        rows = [self.model.prefill(prefix, torch.full((B,), p).to(self.device), state,
                                   all_logits=True).float().cpu()]
        for t in range(p, T):
            # finished (shorter) sequences are fed token 0; their rows are cut off below
            rows.append(self.decode(tokens[:, t], state).float().cpu()[:, None])
        logits = torch.cat(rows, dim=1)
        return [logits[b, : lens[b]] for b in range(B)]

    # -- CUDA graphs -------------------------------------------------------------------------------
    def _compile(self, fn: Callable) -> Callable:
        """``fn`` compiled by ``torch.compile(mode=compile_mode)``; call it through ``_dynamic``."""
        import torch._dynamo

        cfg = torch._dynamo.config
        for name in ("recompile_limit", "cache_size_limit"):  # one compile per shape class
            if hasattr(cfg, name):
                setattr(cfg, name, max(64, int(getattr(cfg, name))))
        # only batch, tokens per sequence and cache capacity are symbolic (marked in _dynamic;
        # automatic dynamic shapes for anything else). dynamic=True would make the weights' dims
        # symbolic too, and duck sizing then ties a batch to an equal weight dim: a recompile per shape
        return torch.compile(fn, mode=self.compile_mode)

    @staticmethod
    def _dynamic(tokens: torch.Tensor, state: DecodeState) -> None:
        """Batch (and a verify step's tokens per sequence) and cache capacity symbolic from the
        first compile on (a hint: batch 1 still specialises), so one more compile at most serves
        every other shape."""
        mark = torch._dynamo.maybe_mark_dynamic
        for d in range(tokens.dim()):
            mark(tokens, d)
        mark(state.lengths, 0)
        for t in (state.conv, state.kda, state.latent):
            mark(t, 1)
        mark(state.latent, 2)

    def _compiled_decode(self) -> Callable[[torch.Tensor, DecodeState], torch.Tensor]:
        """``model.decode`` with its tensor part compiled by ``torch.compile(mode=compile_mode)``."""
        if self._compiled is None:
            body = self._compile(self.model.decode_tensors)

            def decode(tokens: torch.Tensor, state: DecodeState) -> torch.Tensor:
                self._dynamic(tokens, state)
                with torch.inference_mode():
                    logits = body(tokens, state)
                state.max_len += 1
                return logits

            self._compiled = decode
        return self._compiled

    def _verify_and_keep(self, tokens: torch.Tensor, state: DecodeState, keep: torch.Tensor) -> torch.Tensor:
        """The benchmark's verify step: the verify step, then ``commit`` of ``keep`` tokens."""
        logits, trail = self.model.verify_tensors(tokens, state)
        self.model.commit_tensors(state, trail, keep)
        return logits

    def _compiled_verify(self) -> Callable[[torch.Tensor, DecodeState, torch.Tensor], torch.Tensor]:
        """``_verify_and_keep`` compiled as ``_compiled_decode`` is (tokens [B, T])."""
        if self._compiled_verify_fn is None:
            body = self._compile(self._verify_and_keep)

            def verify(tokens: torch.Tensor, state: DecodeState, keep: torch.Tensor) -> torch.Tensor:
                self._dynamic(tokens, state)
                torch._dynamo.maybe_mark_dynamic(keep, 0)
                with torch.inference_mode():
                    return body(tokens, state, keep)

            self._compiled_verify_fn = verify
        return self._compiled_verify_fn

    def _capture(self, state: DecodeState, lengths_base: torch.Tensor | None = None,
                 tokens: torch.Tensor | None = None, decode: Callable | None = None) -> _Graph:
        """Capture one decode step on ``state``'s tensors. Warm-up (Triton autotuning, lazy
        init) runs on a scratch copy so the real state is not advanced. With ``lengths_base``
        the graph first resets ``state.lengths`` to it (benchmark steps stay at one context).
        ``decode``: the step to capture (default ``model.decode``)."""
        decode = decode or self.model.decode
        static_tokens = tokens if tokens is not None else torch.zeros(state.batch, dtype=torch.long, device=self.device)
        scratch = state.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                decode(static_tokens, scratch)
        torch.cuda.current_stream().wait_stream(side)
        del scratch
        if self._mempool is None:
            self._mempool = torch.cuda.graph_pool_handle()
            # the first graph of the shared pool is kept alive with the runner: once every graph
            # of a pool is freed, PyTorch frees the pool, and capturing into its handle again
            # trips an allocator assert (seen on the H200 when a benchmark step's graph was dropped)
            self._pool_anchor = None
        graph = torch.cuda.CUDAGraph()
        saved = state.max_len
        with torch.cuda.graph(graph, pool=self._mempool):
            if lengths_base is not None:
                state.lengths.copy_(lengths_base)
            logits = decode(static_tokens, state)
        state.max_len = saved
        if self._pool_anchor is None:
            self._pool_anchor = graph
        return _Graph(graph, static_tokens, logits)

    # -- benchmark steps ---------------------------------------------------------------------------
    def decode_step(self, batch: int, context: int, draft: int = 0, seed: int = 0) -> Callable[[], None]:
        """A callable running one decode step of ``batch`` sequences at ``context`` tokens
        (``draft`` > 0: one verify step of draft + 1 tokens per sequence, all kept).

        The state is random-but-valid (``state.random_state``: no prefill, so 32k contexts are
        cheap), with capacity = context + 1 rounded up to 64 (the attention span). Each call
        first resets the lengths to ``context`` (inside the graph on GPU), so every call does
        the same work. On GPU the step is a CUDA-graph replay."""
        kind = "verify" if draft else "decode"
        if self.fast_mode:
            fast = self._select(batch, context, kind, draft)
            if fast is not None:
                return fast.decode_step(batch, context, draft)
        state, tokens = self._bench_inputs(batch, context, seed, draft)
        base = state.lengths.clone()
        if draft:  # a verify step of draft + 1 tokens that keeps them all (compiled where asked)
            keep = torch.full((batch,), draft + 1, dtype=torch.long, device=self.device)
            verify = (self._compiled_verify() if self.compile_mode and self.compile_verify and not self.fast_mode
                      else self._verify_and_keep)

            def decode(tok: torch.Tensor, st: DecodeState) -> torch.Tensor:
                st.lengths.copy_(base)  # also in the graph's warm-up on a scratch copy
                with torch.inference_mode():
                    return verify(tok, st, keep)
        elif self.compile_mode and not self.fast_mode:
            decode = self._compiled_decode()
        else:
            decode = self.model.decode
        if self.use_graphs:
            g = self._capture(state, lengths_base=base, tokens=tokens, decode=decode)
            # keep the graph's tensors alive as long as the callable: the replay reads ``base``
            # and, in a verify step, the ``keep`` counts ``decode`` closes over (a freed one is
            # reused by the next allocation and the replay reads its bytes: on the H200 a verify
            # step's counts became garbage once a neighbour step was freed, a device-side
            # assert in the commit's gather, perf notes run Y)
            g.state, g.base, g.decode = state, base, decode

            def run() -> None:
                g.graph.replay()
        else:
            def run() -> None:
                state.lengths.copy_(base)
                decode(tokens, state)

        if not self.fast_mode:
            return run

        def fallback() -> None:  # fast path on, step out of its scope: report on every run
            self._select(batch, context, kind, draft)
            run()

        return fallback

    def prompt_step(self, prompts: list[list[int]], tokens: int) -> Callable[[], None]:
        """One greedy decode step of real generation per call after prefilling ``prompts``, with
        ``reset()`` back to the prefill's end (``prompt_decode.PromptDecode``)."""
        from .prompt_decode import PromptDecode

        return PromptDecode(self, prompts, tokens)

    def _bench_inputs(self, batch: int, context: int, seed: int, draft: int = 0) -> tuple[DecodeState, torch.Tensor]:
        """The random-but-valid state and the tokens of a benchmark step (the fast path's
        bench_hook makes the same ones from the same seed): [batch], or [batch, draft + 1] for
        a verify step (random drafts: its cost does not depend on their acceptance)."""
        state = self.model.random_state(batch, context, _round_up(context + draft + 1, 64), seed=seed)
        gen = torch.Generator().manual_seed(seed)
        shape = (batch, draft + 1) if draft else (batch,)
        tokens = torch.randint(0, self.model.cfg.n_real_tokens, shape, generator=gen).to(self.device)
        return state, tokens

    def step_traffic(self, batch: int, context: int, draft: int = 0, seed: int = 0) -> dict:
        """Bytes the step ``decode_step(batch, context, draft, seed)`` must move (traffic.py)."""
        from .traffic import decode_traffic

        state, tokens = self._bench_inputs(batch, context, seed, draft)
        return decode_traffic(self.model, tokens, state)

    def prefill_step(self, batch: int, context: int, seed: int = 0) -> Callable[[], None]:
        """A callable prefilling ``batch`` random prompts of ``context`` tokens (eager)."""
        gen = torch.Generator().manual_seed(seed)
        tokens = torch.randint(0, self.model.cfg.n_real_tokens, (batch, context), generator=gen).to(self.device)
        lengths = torch.full((batch,), context, dtype=torch.long, device=self.device)
        state = self.model.new_state(batch, _round_up(context + 1, 64))

        def step() -> None:
            self._select(batch, context, "prefill")
            self.model.prefill(tokens, lengths, state)

        return step

    def mixed_step(self, batch: int, context: int, seed: int = 0) -> Callable[[], None]:
        """One step mixing a prefill of ``context`` tokens with ``batch - 1`` decodes at
        ``context`` (out of the fast path's scope: it reports ``mixed_batch``). The standard
        path runs the prefill part and the decode part one after the other."""
        gen = torch.Generator().manual_seed(seed)
        prompt = torch.randint(0, self.model.cfg.n_real_tokens, (1, context), generator=gen).to(self.device)
        plen = torch.full((1,), context, dtype=torch.long, device=self.device)
        pstate = self.model.new_state(1, _round_up(context + 1, 64))
        nd = batch - 1
        if nd:
            dstate = self.model.random_state(nd, context, _round_up(context + 1, 64), seed=seed)
            base = dstate.lengths.clone()
            dtok = torch.randint(0, self.model.cfg.n_real_tokens, (nd,), generator=gen).to(self.device)

        def step() -> None:
            self._select(batch, context, "mixed")
            self.model.prefill(prompt, plen, pstate)
            if nd:
                dstate.lengths.copy_(base)
                self.model.decode(dtok, dstate)

        return step
