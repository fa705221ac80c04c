"""The fast path's fused Triton sampler vs the standard sampler, under Triton's interpreter.

TRITON_INTERPRET=1 is set before the kernel's first launch (its @triton.jit decoration is
deferred to that launch, see the kernel module), fp32 only (bf16 loads are wrong there)."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import re  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from fastpath import trace  # noqa: E402
from fastpath.engine import KernelEntry  # noqa: E402
from optimized_model.k3.sampling import Sampler, SamplingParams, draw_noise, make_generators  # noqa: E402

if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
    pytest.skip("TRITON_INTERPRET was set to something else and there is no GPU", allow_module_level=True)

from optimized_model.k3.fast.kernels import sampler as fs  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
P = SamplingParams


@pytest.fixture(scope="module")
def entry():
    return fs.kernel_entry()


def test_kernel_entry_shape(entry):
    assert isinstance(entry, KernelEntry)
    assert (entry.name, entry.component, entry.dtypes, entry.deterministic) == ("sampler", "sampler", ["float32"], True)
    assert set(entry.value_classes) >= {"normal", "large", "near_zero", "ties", "masked_inf"}
    batches = {s["batch"] for s in entry.shapes}
    assert batches >= {1, 2, 3, 4, 8, 16, 32, 64}
    assert any(s["vocab"] % 1024 and s["vocab"] % 64 for s in entry.shapes)  # non-multiple of the block
    assert any(re.search(p, fs.KERNEL_NAME) for p in entry.kernel_patterns)
    assert not any(re.search(p, "radixSort_kernel") for p in entry.kernel_patterns)


@pytest.mark.parametrize("value_class", ["normal", "large", "near_zero", "ties", "masked_inf"])
@pytest.mark.parametrize("shape", [{"batch": 6, "vocab": 320}, {"batch": 5, "vocab": 1000}])
def test_fast_equals_standard_and_oracle(entry, value_class, shape):
    inp = entry.make_inputs(shape, value_class, "float32", DEV, seed=11)
    tf, lf = entry.fast(**inp)
    ts, ls = entry.standard(**inp)
    to, lo = entry.oracle(**inp)
    assert torch.equal(tf, ts), (tf, ts)
    assert torch.equal(ts, to)
    assert torch.allclose(lf, ls, atol=1e-5, rtol=1e-5)
    assert torch.isfinite(lf).all()
    # rows respect the grammar mask
    if inp["bitmask"] is not None:
        from optimized_model.k3.sampling import bitmask_to_bool

        allowed = bitmask_to_bool(inp["bitmask"].cpu(), shape["vocab"])
        assert allowed[torch.arange(shape["batch"]), tf].all()
    if value_class == "normal":  # deterministic: repeat is bitwise equal
        tf2, lf2 = entry.fast(**inp)
        assert torch.equal(tf, tf2) and torch.equal(lf, lf2)


def test_many_sampled_rows_identical_tokens():
    """60 sampled rows with mixed temperature/top-k/top-p and seeds: same token every row."""
    B, V = 60, 97
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(B, V, generator=g) * 2.5
    params = [P(0.5 + (b % 7) * 0.2, [1.0, 0.95, 0.8, 0.5, 0.2][b % 5], [0, 1, 5, 40, 96, 200][b % 6], b)
              for b in range(B)]
    noise = draw_noise(make_generators(params), V)
    ts, ls = Sampler().sample(logits, params, noise)
    tf, lf = fs.FastSampler().sample(logits.to(DEV), params, noise)
    assert torch.equal(tf.cpu(), ts)
    assert torch.allclose(lf.cpu(), ls, atol=1e-5, rtol=1e-5)


def test_masks_exact_support():
    """Top-k / top-p / bitmask support of the kernel equals the standard one: over 300 seeds per
    row the sampled set is inside the standard support and (given these probabilities: every kept
    id has probability >= 0.17) covers it."""
    V = 40
    base = torch.tensor([3.0, 2.8, 2.8, 2.5, 2.5] + [0.0] * (V - 5))
    rows = [P(1.0, 1.0, 3), P(1.0, 0.45), P(2.0, 0.9, 4), P(1.0, 1.0, 0)]
    bitmask = torch.full((len(rows), 2), -1, dtype=torch.int32)
    bitmask[3, 0] = 0b10110  # only ids 1, 2, 4 of the first word ...
    bitmask[3, 1] = 0  # ... and nothing of the second
    sampler = Sampler()
    support = [set(torch.nonzero(r > 0).flatten().tolist())
               for r in sampler.probs(base.expand(len(rows), V), rows, bitmask)]
    # top-k 3; top-p with tied boundary; top-k 4 whose boundary tie keeps 5 ids; bitmask
    assert support == [{0, 1, 2}, {0, 1, 2}, {0, 1, 2, 3, 4}, {1, 2, 4}]
    seen: list[set] = [set() for _ in rows]
    reps = 40
    params = [P(r.temperature, r.top_p, r.top_k, seed=1000 * i + s) for s in range(reps) for i, r in enumerate(rows)]
    logits = base.expand(len(params), V).contiguous()
    mask = bitmask.repeat(reps, 1)
    tok, _ = fs.FastSampler().sample(logits.to(DEV), params, draw_noise(make_generators(params), V), mask.to(DEV))
    for j, t in enumerate(tok.tolist()):
        seen[j % len(rows)].add(t)
    assert seen == support


def test_padding_limit_and_trace():
    V = 130
    logits = torch.zeros(3, V)
    logits[:, 120:] = 50.0  # padding ids with huge logits must never win
    params = [P(0.0), P(1.0, seed=1), P(1.0, 0.5, 3, seed=2)]
    noise = draw_noise(make_generators(params), V)
    with trace.recording() as rec:
        tf, _ = fs.FastSampler(n_valid=120).sample(logits.to(DEV), params, noise)
    ts, _ = Sampler(n_valid=120).sample(logits, params, noise)
    assert torch.equal(tf.cpu(), ts) and (tf < 120).all()
    ev = rec.engaged("sampler")
    assert len(ev) == 1 and ev[0].shape_dict() == {"batch": 3, "vocab": V}
    assert ev[0].detail.startswith("triton_bisect")


def test_standard_sampler_reports_nothing():
    with trace.recording() as rec:
        Sampler().sample(torch.zeros(2, 8), [P(0.0), P(0.0)])
    assert rec.events == []


def test_cpu_without_interpreter_is_refused_clearly(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        fs.sample_tensors(torch.zeros(1, 8), torch.ones(1), torch.zeros(1, dtype=torch.int32),
                          torch.ones(1), torch.ones(1, 8))


def test_vocab_beyond_one_tile_falls_back_with_a_refusal():
    V = fs.MAX_VOCAB + 5
    logits = torch.randn(2, V, generator=torch.Generator().manual_seed(3))
    params = [P(0.0), P(1.0, 0.9, 50, seed=4)]
    noise = draw_noise(make_generators(params), V)
    with trace.recording() as rec:
        tf, _ = fs.FastSampler().sample(logits, params, noise)
    assert rec.engaged("sampler") == []
    assert [e.detail for e in rec.refused("sampler")] == ["vocab_out_of_scope"]
    assert torch.equal(tf, Sampler().sample(logits, params, noise)[0])
