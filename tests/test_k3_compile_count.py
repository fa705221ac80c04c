"""How many compiles the compiled standard step (runner.py) pays over the perf sweep's shapes:
dynamo only, through a counting backend instead of Inductor, so it runs on the CPU in seconds.
Batch and cache capacity are marked dynamic: batch 1 compiles once for every context, and one
more compile serves every larger batch at every context."""

from __future__ import annotations

from contextlib import contextmanager

import torch

from optimized_model.k3.model import K3Model
from optimized_model.k3.runner import K3Runner


@contextmanager
def tiny_runner_counting_compiles(monkeypatch, counter, **runner_options):
    """A tiny bf16 runner whose ``torch.compile`` goes to ``counter`` (a dynamo test backend),
    dynamo reset before and after."""
    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, mode=None, **kw: real(fn, backend=counter))
    torch._dynamo.reset()
    try:
        model = K3Model.build("tiny", device="cpu", dtype=torch.bfloat16, seed=0)
        yield K3Runner(model, use_graphs=False, compile_mode="default", **runner_options)
    finally:
        torch._dynamo.reset()


def compiles_after_each(monkeypatch, shapes):
    from torch._dynamo.testing import CompileCounter

    counter = CompileCounter()
    with tiny_runner_counting_compiles(monkeypatch, counter) as runner:
        seen = []
        for batch, context in shapes:
            state, tokens = runner._bench_inputs(batch, context, seed=0)
            runner._compiled_decode()(tokens, state)
            seen.append(counter.frame_count)
        return seen


def test_one_compile_for_batch_one_and_one_for_every_larger_batch(monkeypatch):
    seen = compiles_after_each(monkeypatch, [(1, 16), (1, 100), (1, 300), (2, 16), (4, 100), (8, 300), (2, 300)])
    first, b1, general = seen[0], seen[2], seen[-1]
    assert first > 0
    assert b1 == first, seen  # contexts of batch 1: no recompile
    assert seen[3] == seen[-1], seen  # after the first batch > 1: no recompile
    assert general <= 2 * first, seen


def test_compiled_verify_step_traces_and_computes_the_eager_verify(monkeypatch):
    """The perf baseline at a draft with ``compile_verify``: verify + commit through dynamo and
    AOTAutograd (``aot_eager``, fast on the CPU; on the H200 Inductor once failed on the
    inference-mode decorators inside the traced region, which the traced functions now lack)
    equals the eager verify step, logits and state; batch and tokens per sequence are
    symbolic, so draft lengths and batches do not recompile without bound."""
    from torch._dynamo.testing import CompileCounterWithBackend

    counter = CompileCounterWithBackend("aot_eager")
    with tiny_runner_counting_compiles(monkeypatch, counter, compile_verify=True) as runner:
        seen = []
        for batch, draft in ((1, 3), (2, 3), (4, 7), (2, 7), (8, 3)):
            state, tokens = runner._bench_inputs(batch, 40, seed=1, draft=draft)
            keep = torch.full((batch,), draft + 1, dtype=torch.long)
            eager_state = state.clone()
            got = runner._compiled_verify()(tokens, state, keep)
            with torch.inference_mode():
                want = runner._verify_and_keep(tokens, eager_state, keep)
            finite = torch.isfinite(want)
            assert torch.equal(torch.isfinite(got), finite) and torch.equal(got[finite], want[finite])
            for a, b in zip(state.tensors(), eager_state.tensors()):
                assert torch.equal(a, b)
            seen.append(counter.frame_count)
        assert seen[0] > 0 and seen[-1] == seen[2], seen  # after the first general shape: no recompile
