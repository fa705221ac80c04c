"""Dispatch decisions of the K3-mini fast path: the switch, the one decision point
(dispatch.select_decode), refusal reasons, tuning-table variants per batch, the registry."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any fast kernel module is imported

import json

import pytest
import torch

from fastpath import trace
from fastpath.engine import Component, KernelEntry
from optimized_model.k3.fast import dispatch, registry, tuning
from optimized_model.k3.fast.kernels import gemv as G
from optimized_model.k3.fast.kernels import moe as MOE


def test_switch():
    assert dispatch.switch_on({"decode_backend": "latency_specialized"})
    assert not dispatch.switch_on({"decode_backend": "default"})
    assert not dispatch.switch_on({})
    assert not dispatch.switch_on(None)
    assert dispatch.switch_on("latency_specialized")

    class Cfg:
        decode_backend = "latency_specialized"

    assert dispatch.switch_on(Cfg())


def test_scope_comes_from_the_spec():
    sc = dispatch.scope()
    assert sc["batch_sizes"] == [1, 2, 4, 8, 16, 32, 64]
    assert sc["max_context"] == 32768
    assert sc["draft_lengths"] == [0, 3, 7] and sc["max_verify_rows"] == 64  # the spec's
    assert dispatch.graph_batch(3) == 4 and dispatch.graph_batch(64) == 64 and dispatch.graph_batch(1) == 1
    with pytest.raises(ValueError):
        dispatch.graph_batch(65)


@pytest.mark.parametrize(
    "batch,context,kind,reason",
    [
        (1, 16, "decode", None),
        (3, 100, "decode", None),
        (64, 32768, "decode", None),
        (4, 16, "prefill", "prefill"),
        (4, 16, "mixed", "mixed_batch"),
        (65, 16, "decode", "batch_out_of_scope"),
        (0, 16, "decode", "batch_out_of_scope"),
        (2, 32769, "decode", "context_out_of_scope"),
    ],
)
def test_decide(batch, context, kind, reason):
    assert dispatch.decide(batch, context, kind) == reason


def test_select_decode_in_scope_returns_the_decoder_and_reports_no_refusal():
    decoder = object()
    with trace.recording() as rec:
        assert dispatch.select_decode(2, 64, "decode", decoder=decoder) is decoder
    assert rec.refused() == []


@pytest.mark.parametrize("kind,batch,reason", [("prefill", 2, "prefill"), ("mixed", 3, "mixed_batch"),
                                               ("decode", 128, "batch_out_of_scope")])
def test_select_decode_refuses_every_component(kind, batch, reason):
    with trace.recording() as rec:
        assert dispatch.select_decode(batch, 64, kind, decoder=object()) is None
    refused = rec.refused()
    assert {e.component for e in refused} == set(registry.COMPONENT_NAMES)
    assert {e.detail for e in refused} == {reason}
    assert rec.engaged() == []


def test_select_decode_without_decoder_is_unavailable():
    with trace.recording() as rec:
        assert dispatch.select_decode(1, 16, "decode", decoder=None) is None
    assert {e.detail for e in rec.refused()} == {"fast_path_unavailable"}


def test_unavailable_without_cuda_and_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    ok, why = dispatch.fast_path_available()
    assert not ok and "interpreter" in why
    assert dispatch.decide(1, 16) == "fast_path_unavailable"
    with trace.recording() as rec:
        assert dispatch.build_fast_decoder(object(), None) is None
    assert {e.component for e in rec.refused()} == set(registry.COMPONENT_NAMES)
    assert {e.detail for e in rec.refused()} == {"fast_path_unavailable"}
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert dispatch.fast_path_available() == (True, "")


# -- tuning tables --------------------------------------------------------------------------------
def test_tuning_tables_are_well_formed():
    tabs = tuning.tables()
    assert {"NVIDIA H200", "cpu-interpreter", "default"} <= set(tabs)
    for name, tab in tabs.items():
        for kernel, spec in tab["kernels"].items():
            mb = [b["max_batch"] for b in spec["buckets"]]
            assert mb == sorted(mb) and len(set(mb)) == len(mb), (name, kernel)
            assert mb[-1] >= 64, (name, kernel)
            for b in spec["buckets"]:
                for e in [b, *b.get("overrides", [])]:
                    assert e.get("variant", "triton") in ("triton", "cute"), (name, kernel)
                    assert e.get("variant", "triton") == "triton" or kernel == "gemv", (name, kernel)
    # data files round-trip as JSON (no code in them)
    for p in tuning.TABLE_DIR.glob("*.json"):
        json.loads(p.read_text())


def test_cpu_uses_the_interpreter_table():
    assert tuning.device_name("cpu") == "cpu-interpreter"
    assert tuning.table_for("cpu")["device"] == "cpu-interpreter"


# batch 2: the CuTe GEMV (perf notes, run O); 4-64 on the tiled variant, measured faster than small-M
# on the H200 (run B)
@pytest.mark.parametrize("batch,variant", [(1, "triton_small_m"), (2, "cute"), (4, "triton_tiled"),
                                           (8, "triton_tiled"), (16, "triton_tiled"), (64, "triton_tiled")])
def test_h200_gemv_variant_by_batch(monkeypatch, batch, variant):
    monkeypatch.setattr(tuning, "device_name", lambda device=None: "NVIDIA H200")
    cfg = tuning.lookup("gemv", batch, device="cuda", N=4096, K=4096)
    assert isinstance(cfg["SPLIT_K"], int) and cfg["SPLIT_K"] >= 1
    assert G.variant_name(batch, cfg).startswith(variant)


def test_h200_split_k_when_n_is_small(monkeypatch):
    monkeypatch.setattr(tuning, "device_name", lambda device=None: "NVIDIA H200")
    narrow = tuning.lookup("gemv", 1, device="cuda", N=512, K=4096)
    wide = tuning.lookup("gemv", 1, device="cuda", N=32768, K=4096)
    assert narrow["SPLIT_K"] > 1 and "splitk" in G.variant_name(1, narrow)
    assert wide["SPLIT_K"] == 1
    # split-K is bounded by the K steps available
    short = tuning.lookup("gemv", 1, device="cuda", N=64, K=512)
    assert short["SPLIT_K"] * short["BLOCK_K"] <= 512 or short["SPLIT_K"] == 1


def test_h200_per_call_site_overrides(monkeypatch):
    """A table override applies to the call sites whose N, K and epilogue all match, only there."""
    monkeypatch.setattr(tuning, "device_name", lambda device=None: "NVIDIA H200")
    swiglu = tuning.lookup("gemv", 1, device="cuda", N=4096, K=4096, epilogue="swiglu")
    plain = tuning.lookup("gemv", 1, device="cuda", N=4096, K=4096, epilogue="none")
    kda_in = tuning.lookup("gemv", 1, device="cuda", N=12576, K=4096, epilogue="none")
    dense_down = tuning.lookup("gemv", 1, device="cuda", N=4096, K=11008, epilogue="residual")
    assert (swiglu["target_programs"], swiglu["prefetch"]) == (264, 1)
    assert (plain["target_programs"], plain["prefetch"], plain.get("acc2d", 0)) == (1056, 0, 0)
    assert kda_in["prefetch"] == 0 and kda_in["SPLIT_K"] == 1  # batch 1's base: no register prefetch
    assert (dense_down["acc2d"], dense_down["BLOCK_N"], dense_down["prefetch"]) == (1, 4, 1)
    assert "overrides" not in swiglu and "note" not in swiglu
    fg = tuning.lookup("gemv", 8, device="cuda", N=8192, K=256)
    assert (fg["BLOCK_N"], fg["BLOCK_K"]) == (32, 256)
    assert tuning.lookup("gemv", 8, device="cuda", N=8192, K=4096)["BLOCK_N"] == 128


def test_unknown_gpu_uses_default_table(monkeypatch):
    monkeypatch.setattr(tuning, "device_name", lambda device=None: "Some Future GPU")
    assert tuning.table_for("cuda")["device"] == "default"


def test_moe_variant_by_batch(monkeypatch):
    monkeypatch.setattr(tuning, "device_name", lambda device=None: "NVIDIA H200")
    assert MOE.variant_name(1, tuning.lookup("moe_experts", 1, device="cuda")).endswith("small_m")
    assert MOE.variant_name(32, tuning.lookup("moe_experts", 32, device="cuda")).endswith("dot")


# -- registry --------------------------------------------------------------------------------------
def test_components_table():
    comps = registry.components()
    assert [c.name for c in comps] == list(registry.COMPONENT_NAMES)
    for c in comps:
        assert isinstance(c, Component)
    by = {c.name: c for c in comps}
    for name in ("dense_gemv", "moe_router", "moe_experts", "norm_residual", "lm_head", "kda_decode", "mla_decode"):
        assert by[name].fast_kernel_patterns, name
        assert by[name].fallback_kernel_patterns, name
    import re

    assert any(re.search(p, "fp_gemv_kernel") for p in by["dense_gemv"].fast_kernel_patterns)
    assert not any(re.search(p, "fp_gemv_kernel") for p in by["dense_gemv"].fallback_kernel_patterns)
    assert any(re.search(p, "nvjet_tst_64x8_64x16_4x1_v_bz_TNT") for p in by["dense_gemv"].fallback_kernel_patterns)


def test_kernel_registry_entries():
    entries = registry.kernels()
    names = [e.name for e in entries]
    assert len(names) == len(set(names))
    for must in ("gemv", "gemv_residual", "gemv_norm_swiglu", "moe_router", "moe_experts", "add_rmsnorm"):
        assert must in names
    for e in entries:
        assert isinstance(e, KernelEntry), e.name
        assert e.component in registry.COMPONENT_NAMES, (e.name, e.component)
        assert e.shapes and e.kernel_patterns, e.name  # dtypes may be empty: CUDA-only kernel on CPU
        assert "bfloat16" not in e.dtypes, "bf16 must not run in the CPU interpreter"


@pytest.mark.parametrize("batch,mode", [(1, "outside_moe"), (2, "off"), (8, "off"), (64, "off")])
def test_h200_dependent_launch_by_batch(monkeypatch, batch, mode):
    """Programmatic dependent launch is table data per batch bucket (measured: batch 1 only)."""
    monkeypatch.setattr(tuning, "device_name", lambda device=None: "NVIDIA H200")
    assert tuning.entry("launch", batch, device="cuda")["pdl"] == mode


def test_default_and_cpu_tables_never_ask_for_dependent_launch():
    for table in tuning.tables().values():
        if "launch" in table["kernels"]:
            for bucket in table["kernels"]["launch"]["buckets"]:
                assert bucket["pdl"] in ("all", "outside_moe", "off"), (table["device"], bucket)
    assert tuning.tables()["default"]["kernels"]["launch"]["buckets"][0]["pdl"] == "off"
    assert "launch" not in tuning.tables()[tuning.CPU_DEVICE]["kernels"]


def test_pdl_scope_sets_the_constexpr_and_the_launch_option_and_restores_them():
    from optimized_model.k3.fast.kernels import pdl

    assert not pdl.enabled() and pdl.launch_kwargs() == {} and pdl.launch_args() == {"PDL": False}
    with pdl.scope(True):
        assert pdl.enabled() and pdl.launch_kwargs() == {"launch_pdl": True}
        assert pdl.launch_args() == {"PDL": True, "launch_pdl": True}  # constexpr and option together
        with pdl.scope(False):  # the MoE layers inside an "outside_moe" step
            assert not pdl.enabled() and pdl.launch_kwargs() == {}
        assert pdl.enabled()
    assert not pdl.enabled()
    with pytest.raises(RuntimeError):
        with pdl.scope(True):
            raise RuntimeError("a failing launch")
    assert not pdl.enabled()  # restored after an error too


@pytest.fixture(scope="module")
def tiny_decoder():
    from optimized_model.k3.model import K3Model

    m = K3Model.build("tiny", device="cpu", dtype=torch.float32, seed=0)
    return dispatch.build_fast_decoder(m, lambda b, cap: m.new_state(b, cap))


def _h200_plan(monkeypatch, fd, batch, device="meta"):
    """The step plan the H200 table gives ``batch`` (a meta device: no GPU needed)."""
    from optimized_model.k3.fast.step_plan import build_plan

    monkeypatch.setattr(tuning, "device_name", lambda device=None: "NVIDIA H200")
    return build_plan(fd.cfg, fd.layers, fd.head.lm_head, batch, torch.device(device), on_cuda=False)


def test_moe_schedule_per_batch(monkeypatch, tiny_decoder):
    """Batch 1 takes the fused MoE input schedule on the H200, larger batches the separate one;
    a table without the entry means separate, the latent down on the main stream (a bad value
    fails when the table is loaded: test_fast_tuning.py)."""
    assert _h200_plan(monkeypatch, tiny_decoder, 1).moe.shared_in_fused
    assert not _h200_plan(monkeypatch, tiny_decoder, 2).moe.shared_in_fused
    monkeypatch.delitem(tuning.tables()["NVIDIA H200"]["kernels"], "moe_schedule")
    moe = _h200_plan(monkeypatch, tiny_decoder, 1).moe
    assert not moe.shared_in_fused and not moe.latent_down_beside_router


def test_step_dependent_launch_mode_comes_from_the_table(monkeypatch, tiny_decoder):
    assert _h200_plan(monkeypatch, tiny_decoder, 1).pdl == "outside_moe"
    assert _h200_plan(monkeypatch, tiny_decoder, 64).pdl == "off"
    assert not _h200_plan(monkeypatch, tiny_decoder, 1).pdl_in_moe
    # never on the CPU, whatever the table says
    assert _h200_plan(monkeypatch, tiny_decoder, 1, device="cpu").pdl == "off"


def test_every_gemv_call_site_gets_its_config_in_the_plan(monkeypatch, tiny_decoder):
    """The plan holds the table's config per call site, looked up for that site's shape."""
    plan = _h200_plan(monkeypatch, tiny_decoder, 1)
    cfg = tiny_decoder.cfg
    head = tiny_decoder.head.lm_head
    assert dict(plan.gemv["lm_head"]) == tuning.lookup("gemv", 1, device="cuda", N=head.shape[0], K=cfg.hidden)
    for i, p in enumerate(tiny_decoder.layers):
        assert f"L{i}.in" in plan.gemv and f"L{i}.o" in plan.gemv
        ffn = ("L{}.moe_in", "L{}.up") if p.ffn_kind == "moe" else ("L{}.w13", "L{}.w2")
        assert all(site.format(i) in plan.gemv for site in ffn), (i, sorted(plan.gemv))
