"""Interpreter runs (TRITON_INTERPRET=1) of the fast path's dense, MoE and norm kernels on small
shapes vs their fp32 oracles, with the noise-floor rule: err(fast) <= max(atol_floor, k * err(standard))."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # read when @triton.jit decorates: set before imports

import pytest
import torch

from optimized_model.k3.fast.kernels import gemv as G
from optimized_model.k3.fast.kernels import moe as MOE
from optimized_model.k3.fast.kernels import norm as NORM

DTYPES = [torch.float32, torch.float16]


def _err(a, b):
    if isinstance(a, tuple):
        return max(_err(x, y) for x, y in zip(a, b))
    return (a.float() - b.float()).abs().max().item()


def _check(entry, shape, dtype, value_class="normal", seed=0, **fast_kw):
    inp = entry.make_inputs(shape, value_class, dtype, "cpu", seed)
    fast = entry.fast(**inp, **fast_kw) if fast_kw else entry.fast(**inp)
    oracle = entry.oracle(**inp)
    std = entry.standard(**inp)
    floor = entry.atol_floor[str(dtype).replace("torch.", "")]
    tol = max(floor, entry.k * _err(std, oracle))
    err = _err(fast, oracle)
    assert torch.isfinite(torch.as_tensor(err)), (entry.name, shape)
    assert err <= tol, f"{entry.name} {shape} {dtype} {value_class}: err {err:.3g} > tol {tol:.3g}"
    return inp, fast


ENTRIES = {e.name: e for e in G.kernel_entry("cpu")}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_gemv_variants_default_tuning(name, dtype):
    e = ENTRIES[name]
    for shape in e.shapes[:2]:
        _check(e, shape, dtype)


# explicit configurations: small-M broadcast (BLOCK_M < 16), tiled tl.dot, split-K (deterministic)
CONFIGS = {
    "small_m": {"BLOCK_M": 2, "BLOCK_N": 16, "BLOCK_K": 32, "SPLIT_K": 1},
    "small_m_splitk3": {"BLOCK_M": 2, "BLOCK_N": 16, "BLOCK_K": 16, "SPLIT_K": 3},
    "tiled_splitk2": {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "SPLIT_K": 2},
}


@pytest.mark.parametrize("cfg", sorted(CONFIGS))
@pytest.mark.parametrize("name", ["gemv_residual", "gemv_norm_swiglu", "gemv_slots_residual", "gemv_glu_residual"])
def test_gemv_configs_and_epilogues(name, cfg):
    e = ENTRIES[name]
    shape = {"M": 3, "N": 21, "K": 40}  # odd M, N not a multiple of the tile, K with a tail
    for dtype in DTYPES:
        _check(e, shape, dtype, config=CONFIGS[cfg])


def test_split_k_is_deterministic_and_rearms_its_tickets():
    e = ENTRIES["gemv_norm_swiglu"]
    inp = e.make_inputs({"M": 2, "N": 24, "K": 96}, "normal", torch.float32, "cpu", 3)
    cfg = CONFIGS["small_m_splitk3"]
    scratch = G.GemvScratch(2, 24, 3, True, "cpu")
    a = G.gemv(epilogue="swiglu", config=cfg, scratch=scratch, **inp)
    assert int(scratch.cnt.abs().sum()) == 0  # the last program of each tile re-armed its ticket
    b = G.gemv(epilogue="swiglu", config=cfg, scratch=scratch, **inp)
    assert torch.equal(a, b)
    c = G.gemv(epilogue="swiglu", config=CONFIGS["small_m"], **inp)
    assert (a - c).abs().max().item() < 1e-5  # same math without split


def test_gemv_large_values_fp16():
    _check(ENTRIES["gemv"], {"M": 2, "N": 40, "K": 96}, torch.float16, "large")
    _check(ENTRIES["gemv_residual"], {"M": 2, "N": 40, "K": 96}, torch.float16, "near_zero")


@pytest.mark.parametrize("dtype", DTYPES)
def test_grouped_gemv_per_head_weights(dtype):
    """MLA absorbed projections: group h uses its own weight slab (W_uv rows inside kv_b)."""
    g = torch.Generator().manual_seed(0)
    B, H, C, nope, v = 3, 2, 24, 8, 8
    kv_b = (torch.randn(H * (nope + v), C, generator=g) / C ** 0.5).to(dtype)
    o_lat = torch.randn(B, H, C, generator=g).to(dtype)
    gate = torch.randn(B, H * v + 5, generator=g).to(dtype)  # wider row: the gate is a column slice
    out = torch.empty(B, H * v, dtype=dtype)
    G.gemv(o_lat[:, 0], kv_b[nope: nope + v], out=out[:, :v], epilogue="sigmoid_gate", gate=gate[:, :v],
           config={"BLOCK_M": 4, "BLOCK_N": 16, "BLOCK_K": 16, "SPLIT_K": 1}, groups=(H, C, (nope + v) * C, v, v))
    w_uv = kv_b.float().view(H, nope + v, C)[:, nope:]
    ref = torch.einsum("bhc,hvc->bhv", o_lat.float(), w_uv).flatten(1) * torch.sigmoid(gate[:, : H * v].float())
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert (out.float() - ref).abs().max().item() < tol


@pytest.mark.parametrize("dtype", DTYPES)
def test_router(dtype):
    e = MOE.kernel_entry("cpu")[0]
    for shape in e.shapes:
        for vc in e.value_classes:
            _check(e, shape, dtype, vc)


def test_router_selects_the_same_experts_as_torch_topk():
    e = MOE.kernel_entry("cpu")[0]
    inp = e.make_inputs({"M": 6, "D": 64, "E": 16, "k": 4}, "normal", torch.float32, "cpu", 7)
    ids, w = MOE.moe_router(**inp)
    rid, rw = MOE.router_reference(**inp)
    assert torch.equal(ids.sort(-1).values, rid.sort(-1).values)
    assert torch.allclose(w.sum(-1), torch.full((6,), 2.5), atol=1e-5)


def test_router_slots_in_score_order_ties_by_lowest_id():
    """Slot j holds the j-th best expert (the order of repeated argmax): weights never rise
    along the slots (bias 0 here, so the selection order is the score order) and equal
    weights (duplicated router rows) list the lower expert id first."""
    e = MOE.kernel_entry("cpu")[0]
    inp = e.make_inputs({"M": 5, "D": 64, "E": 16, "k": 8}, "ties", torch.float32, "cpu", 3)
    ids, w = MOE.moe_router(**inp)
    rid, _ = MOE.router_reference(**inp)
    assert torch.equal(ids.sort(-1).values, rid.sort(-1).values)
    assert bool((w[:, 1:] <= w[:, :-1]).all())
    tied = w[:, 1:] == w[:, :-1]
    assert bool(tied.any()), "the ties inputs should produce equal routing weights"
    assert bool((ids[:, 1:] > ids[:, :-1])[tied].all())


@pytest.mark.parametrize("dtype", DTYPES)
def test_grouped_experts(dtype):
    e = MOE.kernel_entry("cpu")[1]
    _check(e, e.shapes[0], dtype, "normal")
    _check(e, e.shapes[1], dtype, "near_zero" if dtype == torch.float16 else "normal")


def test_grouped_experts_tiled_path_and_skewed_routing():
    """Many tokens on one expert (more than one BLOCK_T tile) and tl.dot tiles."""
    e = MOE.kernel_entry("cpu")[1]
    inp = e.make_inputs({"M": 20, "L": 32, "I": 16, "E": 4, "k": 2}, "normal", torch.float32, "cpu", 1)
    inp["ids"][:, 0] = 2  # every token picks expert 2 first (20 tokens > one 16-row tile)
    inp["ids"][:, 1] = torch.where(inp["ids"][:, 1] == 2, torch.tensor(3, dtype=torch.int32), inp["ids"][:, 1])
    out = MOE.moe_experts(**inp, config={"BLOCK_T": 16, "BLOCK_N": 16, "BLOCK_K": 16})
    ref = MOE.experts_reference(**inp)
    assert (out - ref).abs().max().item() < 1e-4
    out2 = MOE.moe_experts(**inp, config={"BLOCK_T": 4, "BLOCK_N": 16, "BLOCK_K": 32})
    assert (out2 - ref).abs().max().item() < 1e-4


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rmsnorm(dtype):
    e = NORM.kernel_entry("cpu")
    for shape in e.shapes:
        for vc in e.value_classes:
            _check(e, shape, dtype, vc)


def test_rmsnorm_writes_into_cache_positions():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 16, generator=g)
    w = torch.rand(16, generator=g) + 0.5
    cache = torch.zeros(3, 8, 16)
    pos = torch.tensor([0, 5, 7])
    NORM.add_rmsnorm(x, w, out=cache, positions=pos)
    ref = NORM.add_rmsnorm_reference(x, w)
    for b in range(3):
        assert torch.allclose(cache[b, pos[b]], ref[b], atol=1e-6)
    mask = torch.ones(3, 8, dtype=torch.bool)
    mask[torch.arange(3), pos] = False
    assert cache[mask].abs().max() == 0  # nothing else written


@pytest.mark.parametrize("bm", [1, 2, 4, 16])
def test_moe_align_groups_pairs_by_expert(bm):
    g = torch.Generator().manual_seed(bm)
    M, k, E = 9, 4, 6
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(M)]).to(torch.int32)
    ids[:, 0] = 3  # a crowded expert (more than one block at small bm)
    ids[:, 1] = torch.where(ids[:, 1] == 3, torch.tensor(5, dtype=torch.int32), ids[:, 1])
    ids[:, 2:] = torch.where(ids[:, 2:] == 3, torch.tensor(0, dtype=torch.int32), ids[:, 2:])
    al = MOE.moe_align(ids, E, bm)
    assert MOE.align_blocks(al) == MOE.align_reference(ids, E, bm)
    assert all(r == 0 for b, r in zip(al.bexp.tolist(), al.brows.tolist()) if b < 0)


def test_moe_align_idle_experts_and_reused_buffers():
    """Experts without pairs (the last expert among them) and buffers holding a previous
    grouping (a graph replay reuses them): every block is rewritten."""
    g = torch.Generator().manual_seed(5)
    M, k, E, bm = 7, 2, 16, 4
    al = MOE.MoeAlign(M, k, E, bm, "cpu")
    al.bexp.fill_(7)
    al.brows.fill_(9)
    for lo, hi in ((0, 6), (10, 16)):  # then the last expert has pairs
        ids = torch.randint(lo, hi, (M, k), generator=g, dtype=torch.int32)
        MOE.moe_align(ids, E, bm, align=al)
        want = MOE.align_reference(ids, E, bm)
        assert MOE.align_blocks(al) == want
        bexp, brows = al.bexp.tolist(), al.brows.tolist()
        assert all(bexp[b] == -1 and brows[b] == 0 for b in range(len(want), al.max_blocks))


def test_router_fused_align_matches_standalone_align():
    e = MOE.kernel_entry("cpu")[0]
    inp = e.make_inputs({"M": 5, "D": 96, "E": 12, "k": 4}, "normal", torch.float32, "cpu", 3)
    al = MOE.MoeAlign(5, 4, 12, 2, "cpu")
    ids, w = MOE.moe_router(**inp, align=al)
    rid, _ = MOE.router_reference(**inp)
    assert torch.equal(ids.sort(-1).values, rid.sort(-1).values)
    ref = MOE.moe_align(ids, 12, 2)
    assert torch.equal(al.bexp, ref.bexp) and torch.equal(al.brows, ref.brows)
    valid = torch.repeat_interleave(ref.brows > 0, 2)
    rows = (torch.arange(al.sorted.numel()) % 2) < torch.repeat_interleave(ref.brows, 2)
    assert torch.equal(al.sorted[valid & rows], ref.sorted[valid & rows])
    # and a second call re-uses the re-armed ticket
    ids2, w2 = MOE.moe_router(**inp, align=al)
    assert torch.equal(ids2, ids) and torch.equal(w2, w)


def test_grouped_experts_small_m_crowded_expert():
    """Small-M blocks (BLOCK_M 2) with one expert holding several blocks."""
    e = MOE.kernel_entry("cpu")[1]
    inp = e.make_inputs({"M": 7, "L": 48, "I": 24, "E": 5, "k": 2}, "normal", torch.float32, "cpu", 2)
    inp["ids"][:, 0] = 1
    inp["ids"][:, 1] = torch.where(inp["ids"][:, 1] == 1, torch.tensor(4, dtype=torch.int32), inp["ids"][:, 1])
    ref = MOE.experts_reference(**inp)
    for cfg in ({"BLOCK_M": 2, "BLOCK_N": 16, "BLOCK_K": 32}, {"BLOCK_M": 1, "BLOCK_N": 8, "BLOCK_K": 64,
                                                                "BLOCK_N_DOWN": 16, "BLOCK_K_DOWN": 16}):
        out = MOE.moe_experts(**inp, config=cfg)
        assert (out - ref).abs().max().item() < 1e-4


@pytest.mark.parametrize("dtype", DTYPES)
def test_grouped_experts_slot_sum_in_the_down_kernel(dtype):
    """``slot_sum``: the down kernel's last program per N tile writes Σ over the k slots (slot
    order, rounded to the working dtype) — exactly what the latent up's prologue formed from the
    per-slot outputs; unused blocks and several N tiles included; tickets re-armed."""
    e = MOE.kernel_entry("cpu")[1]
    for shape in (s for s in e.shapes if s.get("slot_sum")):
        inp = e.make_inputs(shape, "normal", dtype, "cpu", 3)
        del inp["slot_sum"]
        for cfg in ({"BLOCK_M": 1, "BLOCK_N": 8, "BLOCK_K": 16, "BLOCK_N_DOWN": 8, "BLOCK_K_DOWN": 16},
                    {"BLOCK_M": 2, "BLOCK_N": 16, "BLOCK_K": 32}):
            ls = torch.full_like(inp["lat"], float("nan"))
            per_slot = MOE.moe_experts(**inp, config=cfg, slot_sum=ls)
            want = per_slot[:, 0].clone()
            for j in range(1, per_slot.shape[1]):
                want += per_slot[:, j]
            assert torch.equal(ls, want.to(dtype)), (shape, cfg)
            assert int(MOE._tickets(ls.device, 1).abs().sum()) == 0
        _check(e, shape, dtype, "normal")
    with pytest.raises(ValueError, match="at most"):
        inp = e.make_inputs({"M": 5, "L": 48, "I": 40, "E": 6, "k": 2}, "normal", dtype, "cpu", 0)
        MOE.moe_experts(**inp, slot_sum=torch.empty(5, 48, dtype=dtype))


@pytest.mark.parametrize("epilogue,norm", [("none", True), ("swiglu", True), ("residual", False)])
def test_gemv_small_m_prefetch_is_bitwise_the_same(epilogue, norm):
    """The register double buffer of W (``prefetch``) changes when tiles load, not the math;
    ragged K and split-K included."""
    g = torch.Generator().manual_seed(5)
    M, N, K = 3, 24, 200
    x = torch.randn(M, K, generator=g)
    w = torch.randn(2 * N if epilogue == "swiglu" else N, K, generator=g) / K ** 0.5
    kw = {"epilogue": epilogue}
    if norm:
        kw["norm_weight"] = 1 + 0.1 * torch.randn(K, generator=g)
    if epilogue == "residual":
        kw["residual"] = torch.randn(M, N, generator=g)
    base = {"BLOCK_M": 4, "BLOCK_N": 8, "BLOCK_K": 32, "SPLIT_K": 3}
    a = G.gemv(x, w, config=dict(base, prefetch=0), **kw)
    b = G.gemv(x, w, config=dict(base, prefetch=1), **kw)
    assert torch.equal(a, b)
    ref = G.gemv_reference(x, w, dtype=torch.float32, **kw)
    assert (b - ref).abs().max().item() < 1e-4


@pytest.mark.parametrize("epilogue", ["none", "swiglu"])
def test_gemv_folded_norm_dot_tiles_split_k(epilogue):
    """RMSNorm folded into the K loop (rstd applied at the end) on the tl.dot tiles, with the
    partial sums of squares carried through the split-K workspace."""
    g = torch.Generator().manual_seed(9)
    M, N, K = 18, 20, 136
    x = torch.randn(M, K, generator=g) * 3
    w = torch.randn(2 * N if epilogue == "swiglu" else N, K, generator=g) / K ** 0.5
    nw = 1 + 0.1 * torch.randn(K, generator=g)
    ref = G.gemv_reference(x, w, epilogue=epilogue, norm_weight=nw, dtype=torch.float32)
    for split in (1, 3):
        y = G.gemv(x, w, epilogue=epilogue, norm_weight=nw,
                   config={"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 32, "SPLIT_K": split})
        assert (y - ref).abs().max().item() < 1e-4, split


def test_outgrown_ticket_and_counter_buffers_stay_alive(monkeypatch):
    """The kernels' cached ticket / counter buffers (kernels/_counters.py: KDA decode's counters,
    the experts' down-kernel tickets) grow by replacement; a graph captured with the old buffer
    still points at it, so the old one must never be freed."""
    from optimized_model.k3.fast.kernels import _counters
    from optimized_model.k3.fast.kernels import kda_decode as KDA

    monkeypatch.setattr(_counters, "_CACHE", {})
    monkeypatch.setattr(_counters, "_RETIRED", [])
    for get in (MOE._tickets, KDA._counter):
        small = get(torch.device("cpu"), 10)
        assert get(torch.device("cpu"), 10) is small
        big = get(torch.device("cpu"), 100_000)
        assert big is not small and big.numel() >= 100_000 and not big.any()
        assert any(r is small for r in _counters._RETIRED)
    assert MOE._tickets(torch.device("cpu"), 1) is not KDA._counter(torch.device("cpu"), 1)  # one per purpose
