"""The fast path's speculative verify step on the tiny K3-mini under Triton's interpreter: the
verify kernels against their references, the step's logits and (after commit) states against
the standard path's, greedy generation with speculation equal to without, the trace, and the
refusals of out-of-scope verify steps."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any fast kernel module is imported

import pytest
import torch

from fastpath import trace
from fastpath.engine import GenerationRequest
from optimized_model.k3.engine import EmbeddedEngine
from optimized_model.k3.fast import dispatch
from optimized_model.k3.fast.kernels import kda_verify as KV
from optimized_model.k3.fast.kernels import mla_verify as MV
from optimized_model.k3.fast.kernels import verify_commit as VC
from optimized_model.k3.model import K3Model
from optimized_model.k3.tokenizer import K3Tokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TOK = K3Tokenizer()


def _noise_floor_ok(entry, fast, std, orc, dtype):
    """The kernels suite's rule: err(fast) <= max(atol floor, k * err(standard)) per output."""
    floor = entry.atol_floor[str(dtype).replace("torch.", "")]
    for f, s, o in zip(fast, std, orc):
        err = (f.float() - o.float()).abs().max().item()
        tol = max(floor, entry.k * (s.float() - o.float()).abs().max().item())
        assert err <= tol, (err, tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_kernel_entries_within_the_noise_floor(dtype):
    for mod in (KV, MV):
        entry = mod.kernel_entry("cpu")
        split = [sh for sh in entry.shapes if sh.get("block_v")]  # kda_verify's V split, every one
        for shape in entry.shapes[::2] + [sh for sh in split if sh not in entry.shapes[::2]]:
            for vc in entry.value_classes:
                inp = mod.make_inputs(shape, vc, dtype, "cpu", 0)
                out = lambda r: r if isinstance(r, tuple) else (r,)  # noqa: E731
                _noise_floor_ok(entry, out(mod.fast(**inp)), out(mod.standard(**inp)), out(mod.oracle(**inp)), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, "float16"])  # the suite passes names
def test_the_fast_commit_is_the_standard_commit_bit_for_bit(dtype):
    """Every shape (block tails, keep 1 and T) and value class: a commit only copies and clears."""
    entry = VC.kernel_entry("cpu")
    for i, shape in enumerate(entry.shapes):
        for vc in entry.value_classes:
            inp = VC.make_inputs(shape, vc, dtype, "cpu", i)
            got, want = VC.fast(**inp), VC.standard(**inp)
            for name, a, b in zip(("kda", "conv", "latent", "lengths"), got, want):
                assert torch.equal(a, b), (shape, vc, name)
            assert not torch.equal(want[2], inp["latent"]) or bool((inp["keep"] == shape["tokens"]).all())


def test_registry_lists_the_verify_kernels():
    from optimized_model.k3.fast import registry

    names = {e.name: e for e in registry.kernels()}
    assert names["kda_verify"].component == "kda_decode" and names["mla_verify"].component == "mla_decode"
    assert names["verify_commit"].verify_variants == ["triton_commit"]
    comps = {c.name: c for c in registry.components()}
    assert r"kda_verify_kernel" in comps["kda_decode"].fast_kernel_patterns
    assert r"fp_keep_state_kernel" in comps["kda_decode"].fast_kernel_patterns
    assert r"mla_verify_split_kernel" in comps["mla_decode"].fast_kernel_patterns


def _decoder(m):
    fd = dispatch.build_fast_decoder(m, lambda b, cap: m.new_state(b, cap))
    assert fd is not None
    return fd


@pytest.mark.parametrize("dtype,T", [(torch.float32, 4), (torch.float32, 8), (torch.float16, 4)])
def test_fast_verify_and_commit_match_the_standard_path(dtype, T):
    """Logits of one verify step (fp32: 1e-4; fp16: within 2x the standard path's distance to
    the fp32 oracle) and, after a commit keeping a different prefix per row, every state."""
    m = K3Model.build("tiny", device="cpu", dtype=dtype, seed=0)
    fd = _decoder(m)
    B = 3
    st = m.random_state(B, 9, 64, seed=3)
    st_fast, st_0 = st.clone(), st.clone()
    toks = torch.randint(0, m.cfg.n_real_tokens, (B, T), generator=torch.Generator().manual_seed(1))
    n = m.cfg.n_real_tokens
    with trace.recording() as rec:
        out, trail_f = fd.verify(toks, st_fast)
    ref, trail_s = m.verify(toks, st)
    assert out.shape == ref.shape == (B, T, m.cfg.vocab_size) and torch.isinf(out[..., n:]).all()
    err = (out[..., :n] - ref[..., :n]).abs().max().item()
    if dtype == torch.float32:
        assert err < 1e-4, err
    else:
        orc = K3Model.build("tiny", device="cpu", dtype=torch.float32, seed=0, oracle=True, round_dtype=dtype)
        ref_o, _ = orc.verify(toks, st_0.to_dtype(torch.float32))
        noise = (ref[..., :n] - ref_o[..., :n]).abs().max().item()
        assert (out[..., :n] - ref_o[..., :n]).abs().max().item() <= max(2 * noise, 1e-2)
    comps = rec.components()
    assert all(v.startswith("triton_verify") for v in comps["kda_decode"]), comps["kda_decode"]
    assert comps["mla_decode"] == {"triton_splitkv_verify"}
    assert not any(v.startswith("refused") for c, vs in comps.items() if c != "decode_graph" for v in vs)
    keep = torch.tensor([1, T, 2])
    m.commit(st, trail_s, keep)
    st_torch = st_fast.clone()
    m.commit(st_torch, trail_f, keep)  # the fast trail is a VerifyTrail too
    with trace.recording() as rec:
        trail_f.commit(st_fast, keep)  # the fast kernels' commit: bit for bit the same
    assert rec.components()["kda_decode"] == {"triton_commit"}
    for name, a, b in zip(("conv", "kda", "latent", "lengths"), st_torch.tensors(), st_fast.tensors()):
        assert torch.equal(a, b), name
    atol = 1e-4 if dtype == torch.float32 else 2e-2
    for name, a, b in zip(("conv", "kda", "latent", "lengths"), st.tensors(), st_fast.tensors()):
        assert (a.float() - b.float()).abs().max().item() <= atol, name
    assert st_fast.lengths.tolist() == [10, 9 + T, 11]


@pytest.fixture(scope="module")
def fast():
    return EmbeddedEngine(config="tiny", device="cpu", dtype="float32").load(
        "fast", additional_config=dispatch.switch_config())


PROMPTS = ["the cat sat on the mat. the cat sat on", "abcabcabcabc"]


def _requests(n=(14, 11)):
    return [GenerationRequest(prompt_ids=TOK.encode(p), max_tokens=k, ignore_eos=True) for p, k in zip(PROMPTS, n)]


@pytest.mark.parametrize("spec", [
    {"method": "ngram", "num_speculative_tokens": 3},
    {"method": "ngram", "num_speculative_tokens": 7, "prompt_lookup_min": 1},
    {"method": "synthetic", "num_speculative_tokens": 3, "acceptance_length": 2.5},
    {"method": "synthetic", "num_speculative_tokens": 7, "acceptance_length": 6},
], ids=["ngram-k3", "ngram-k7", "synthetic-k3", "synthetic-k7"])
def test_fast_greedy_with_speculation_equals_without(fast, spec):
    base = fast.generate(_requests())
    with trace.recording() as rec:
        out = fast.generate(_requests(), speculative=spec)
    for o, b in zip(out, base):
        assert o.token_ids == b.token_ids, (o.token_ids, b.token_ids)
    verify = [e for e in rec.events if e.kind == "engaged" and e.component == "kda_decode"
              and e.detail.startswith("triton_verify")]
    assert verify, "the fast verify kernels never fired"
    assert "draft_out_of_scope" not in {e.detail for e in rec.events if e.kind == "refused"}


def test_decode_step_with_a_draft_runs_the_fast_verify_step(fast):
    with trace.recording() as rec:
        step = fast.decode_step(2, 20, draft=3)
        step()
        step()
    comps = rec.components()
    assert any(v.startswith("triton_verify") for v in comps["kda_decode"])
    assert comps["mla_decode"] == {"triton_splitkv_verify"}
    assert comps["decode_graph"] == {"refused:no_cuda"}


@pytest.mark.parametrize("batch,draft,reason", [(16, 7, "verify_rows_out_of_scope"), (1, 8, "draft_out_of_scope"),
                                                (2, -1, "draft_out_of_scope"), (65, 1, "verify_rows_out_of_scope")])
def test_out_of_scope_verify_steps_refuse_with_their_reason(batch, draft, reason):
    assert dispatch.decide(batch, 100, "verify", draft) == reason
    with trace.recording() as rec:
        assert dispatch.select_decode(batch, 100, "verify", decoder=object(), draft=draft) is None
    assert {e.detail for e in rec.events if e.kind == "refused"} == {reason}


def test_in_scope_verify_rows():
    assert dispatch.decide(16, 100, "verify", 3) is None  # 64 rows, the spec's max_verify_rows
    assert dispatch.decide(8, 100, "verify", 7) is None  # 64 rows
    assert dispatch.decide(9, 100, "verify", 7) == "verify_rows_out_of_scope"  # 72 rows
    assert dispatch.decide(1, dispatch.scope()["max_context"], "verify", 3) == "context_out_of_scope"


def test_an_out_of_scope_verify_step_falls_back_to_the_standard_path(fast):
    with trace.recording() as rec:
        out = fast.generate(_requests((6, 6)), speculative={"method": "synthetic", "num_speculative_tokens": 8,
                                                             "acceptance_length": 3})
    assert "draft_out_of_scope" in {e.detail for e in rec.events if e.kind == "refused"}
    assert [len(o.token_ids) for o in out] == [6, 6]
