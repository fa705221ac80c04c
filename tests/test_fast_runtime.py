"""The fast decoder on the tiny K3-mini model under Triton's interpreter: logits and state
updates match the standard path, and the trace shows every component engaged (decode_graph
refused with "no_cuda" on CPU)."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any fast kernel module is imported

import pytest
import torch

from fastpath import trace
from optimized_model.k3.fast import dispatch, registry
from optimized_model.k3.model import K3Model
from sm90_compile import run_without_interpreter


@pytest.fixture(scope="module")
def fp32_model():
    return K3Model.build("tiny", device="cpu", dtype=torch.float32, seed=0)


def _decoder(m):
    fd = dispatch.build_fast_decoder(m, lambda b, cap: m.new_state(b, cap))
    assert fd is not None
    return fd


def _two_steps_vs_standard(m, steps, seed):
    """Decode ``steps`` (token tensors) on the standard path and on the fast decoder from the
    same random state; logits and states must agree (fp32: 1e-4). Returns (fast state, trace)."""
    fd = _decoder(m)
    st_std = m.random_state(len(steps[0]), 9, 64, seed=seed)
    st_fast = st_std.clone()
    st_fast.max_len = 9
    n = m.cfg.n_real_tokens
    with trace.recording() as rec:
        for tok in steps:
            ref = m.decode(tok, st_std)
            out = fd.decode(tok, st_fast)
            assert out.shape == ref.shape and out.dtype == torch.float32
            assert torch.isinf(out[:, n:]).all()  # padding ids stay masked
            assert (out[:, :n] - ref[:, :n]).abs().max().item() < 1e-4
    for a, b in zip(st_std.tensors(), st_fast.tensors()):
        assert (a.float() - b.float()).abs().max().item() < 1e-4
    return st_fast, rec


def test_fast_decode_matches_standard_fp32_over_two_steps(fp32_model):
    m = fp32_model
    st_fast, rec = _two_steps_vs_standard(m, (torch.tensor([5, 200]), torch.tensor([17, 3])), seed=1)
    assert st_fast.lengths.tolist() == [11, 11] and st_fast.max_len == 11
    comps = rec.components()
    for name in registry.COMPONENT_NAMES:
        if name in ("sampler", "decode_graph"):
            continue
        assert name in comps and not any(v.startswith("refused") for v in comps[name]), (name, comps)
    assert comps["decode_graph"] == {"refused:no_cuda"}
    assert "sequential" in next(iter(comps["shared_expert"]))  # no second stream on CPU
    # per step: each KDA layer fires kda_decode, each MLA layer mla_decode
    kinds = m.cfg.layer_kinds
    assert len(rec.engaged("kda_decode")) == 2 * kinds.count("kda")
    assert len(rec.engaged("mla_decode")) == 2 * kinds.count("mla")
    assert len(rec.engaged("moe_experts")) == 2 * sum(m.cfg.ffn_kind(i) == "moe" for i in range(m.cfg.n_layers))
    # batch 2 in the interpreter's table: KDA decode forms its low-rank gates, the experts' down
    # kernel sums the slots (the comparison above covers both)
    assert comps["kda_decode"] == {"triton_fused_low_rank"}, comps["kda_decode"]
    assert all(v.endswith("_slot_sum") for v in comps["moe_experts"]), comps["moe_experts"]


def test_fused_moe_input_schedule_matches_standard_fp32(fp32_model):
    """Batch 1 takes the "shared_in: fused" MoE schedule of the interpreter's table (one gemv
    over [latent down; shared gate|up], the shared down with the SwiGLU prologue): logits and
    state match the standard path, and the trace names the schedule."""
    from optimized_model.k3.fast import tuning

    assert tuning.entry("moe_schedule", 1, device="cpu")["shared_in"] == "fused"
    assert tuning.entry("moe_schedule", 2, device="cpu")["shared_in"] == "separate"
    _, rec = _two_steps_vs_standard(fp32_model, (torch.tensor([9]), torch.tensor([130])), seed=4)
    shared = rec.components()["shared_expert"]
    assert shared and all(v.startswith("fused_in_") and v.endswith("_sequential") for v in shared), shared


def test_fast_decode_fp16_within_noise_floor():
    m16 = K3Model.build("tiny", device="cpu", dtype=torch.float16, seed=0)
    orc = K3Model.build("tiny", device="cpu", dtype=torch.float32, seed=0, oracle=True, round_dtype=torch.float16)
    fd = _decoder(m16)
    st = m16.random_state(3, 12, 64, seed=2)
    st_o = st.to_dtype(torch.float32)
    tok = torch.tensor([1, 77, 250])
    n = m16.cfg.n_real_tokens
    ref_o = orc.decode(tok, st_o)[:, :n]
    ref_s = m16.decode(tok, st.clone())[:, :n]
    with trace.recording() as rec:
        out = fd.decode(tok, st)[:, :n]
    # batch 3: the gates by their own gemv, the slots summed by the latent up (the other table rows)
    assert rec.components()["kda_decode"] == {"triton_fused"}
    assert not any(v.endswith("_slot_sum") for v in rec.components()["moe_experts"])
    noise = (ref_s - ref_o).abs().max().item()
    err = (out - ref_o).abs().max().item()
    assert err <= max(2 * noise, 1e-2), (err, noise)
    assert (out.argmax(-1) == ref_s.argmax(-1)).all()


def test_a_cute_table_entry_off_its_scope_runs_triton_and_says_why(fp32_model, monkeypatch):
    """A gemv entry with "variant": "cute" where the CuTe DSL kernel cannot run (CPU, fp32):
    every gemv call site still computes the standard path's logits with the Triton twin, and
    the trace says so per site with the reason."""
    from optimized_model.k3.fast import tuning

    bucket = tuning.tables()[tuning.CPU_DEVICE]["kernels"]["gemv"]["buckets"][0]
    monkeypatch.setitem(bucket, "variant", "cute")
    _, rec = _two_steps_vs_standard(fp32_model, (torch.tensor([9]), torch.tensor([130])), seed=3)
    fallbacks = [e for e in rec.events if e.detail == "triton_for_cute"]
    assert fallbacks and not [e for e in rec.events if e.detail == "cute"]
    reasons = {dict(e.shape)["reason"] for e in fallbacks}
    assert any("CUDA" in r or "cutlass" in r for r in reasons), reasons  # no device / no DSL here
    assert any("swiglu" in r for r in reasons), reasons  # a fusion the CuTe kernel lacks


def _h200_plan(monkeypatch, fd, batch, on_cuda=False):
    """The step plan the H200 table gives ``batch`` (meta device: no GPU needed)."""
    from optimized_model.k3.fast import tuning
    from optimized_model.k3.fast.step_plan import build_plan

    monkeypatch.setattr(tuning, "device_name", lambda device=None: "NVIDIA H200")
    return build_plan(fd.cfg, fd.layers, fd.head.lm_head, batch, torch.device("meta"), on_cuda)


def test_slot_sum_in_the_down_kernel_by_batch_in_the_h200_plan(fp32_model, monkeypatch):
    """Batches 2-4 sum the routed slots in the experts' down kernel (its limit: 4 tokens; a
    table asking beyond fails at load, test_fast_tuning.py), batch 1 and 8 in the latent up."""
    fd = _decoder(fp32_model)
    assert [_h200_plan(monkeypatch, fd, b).moe.slot_sum_in_down for b in (1, 2, 4, 8)] == [False, True, True, False]


def test_the_plan_follows_a_swapped_table_and_only_then(fp32_model, monkeypatch):
    """A decoder resolves a batch's plan once; a sweep that swaps the table's kernels for a
    patched copy (sweep_util.apply_patch) gets a new plan at the next step, on the same buffers."""
    import copy

    from optimized_model.k3.fast import tuning

    fd = _decoder(fp32_model)
    first = fd.step_for(1)
    assert fd.step_for(1) is first and first.plan.moe.shared_in_fused
    table = tuning.table_for("cpu")
    patched = copy.deepcopy(table["kernels"])
    patched["moe_schedule"]["buckets"][0]["shared_in"] = "separate"
    monkeypatch.setitem(table, "kernels", patched)
    again = fd.step_for(1)
    assert again is not first and not again.plan.moe.shared_in_fused
    assert again.bufs is first.bufs


def test_l2_prefetch_plan_comes_from_the_table_and_never_runs_on_cpu(fp32_model, monkeypatch):
    """The H200 table adopts no prefetch site; the CPU build plans none and the kernel refuses
    a CPU tensor."""
    from optimized_model.k3.fast.kernels import l2_prefetch as L2
    from optimized_model.k3.fast.runtime import L2_SITES

    fd = _decoder(fp32_model)
    for b in (1, 8, 64):
        plan = _h200_plan(monkeypatch, fd, b, on_cuda=True).l2
        assert (plan.chunk, plan.per_program) == (16384, 32)
        assert not any(plan.fraction(site) > 0 for site in L2_SITES), plan
    monkeypatch.undo()
    assert dict(fd.step_for(1).plan.l2.fractions) == {}
    w = torch.zeros(10, 8)
    assert L2.prefetch_bytes(w, 0.5) == 160 and L2.prefetch_bytes(w, 1.0) == 320
    with pytest.raises(ValueError, match="fraction"):
        L2.prefetch_bytes(w, 1.5)
    with pytest.raises(RuntimeError, match="CUDA only"):
        L2.l2_prefetch(w)


def test_l2_prefetch_kernel_compiles_for_sm90_to_a_bulk_prefetch():
    """CPU pre-flight of the inline PTX (the interpreter cannot run it): Triton + ptxas build
    it for sm_90, one ``cp.async.bulk.prefetch.L2`` per lane."""
    code = (
        "from lab.aot import compile_launch\n"
        "from optimized_model.k3.fast.kernels.l2_prefetch import fp_l2_prefetch_kernel as k\n"
        "sig = {'BASE': '*u8', 'n_bytes': 'i32', 'CHUNK': 'constexpr', 'PER_PROGRAM': 'constexpr'}\n"
        "c = compile_launch(k, sig, {'CHUNK': 16384, 'PER_PROGRAM': 32}, {'num_warps': 1}, [0])\n"
        "print(c.asm['ptx'].count('cp.async.bulk.prefetch.L2.global'), len(c.asm['cubin']) > 0)\n"
    )
    assert run_without_interpreter("-c", code).split()[-2:] == ["1", "True"]


def test_decode_step_covers_the_sampler_and_refuses_graphs_on_cpu(fp32_model):
    fd = _decoder(fp32_model)
    step = fd.decode_step(2, 8)
    with trace.recording() as rec:
        step()
    comps = rec.components()
    assert set(comps) == set(registry.COMPONENT_NAMES)
    assert comps["decode_graph"] == {"refused:no_cuda"}
    assert comps["sampler"] and not any(v.startswith("refused") for v in comps["sampler"])


def test_every_launch_of_the_tiny_step_compiles_for_sm90():
    """CPU pre-flight: each Triton launch of a fast step (decode, verify and the verify step's
    commit) compiles for sm_90 (Triton + ptxas) and fits the H200's shared memory — errors the
    interpreter cannot see."""
    out = run_without_interpreter("-m", "lab.aot", "--config", "tiny", "--batches", "1,16", "--verify", "1x3,2x7")
    assert "0 problems" in out
    for verify_kernel in ("kda_verify_kernel", "mla_verify_split_kernel", "fp_keep_state_kernel",
                          "fp_drop_rejected_kernel"):  # the verify steps and their commit
        assert verify_kernel in out


def test_pdl_builds_compute_what_the_plain_builds_compute():
    """CPU pre-flight: every kernel the batch-1 step launches with programmatic dependent launch
    compiles (sm_90) to the same instructions, opcode by opcode, as its non-PDL build — PDL may
    move a load, never change the arithmetic (KDA decode's early state load did: perf notes,
    run L)."""
    out = run_without_interpreter("-m", "lab.ptx_diff", "--pdl", "--config", "tiny", "--batches", "1")
    assert "0 compute differently" in out and " 0 PDL launches" not in out
