"""Bytes per decode step (optimized_model/k3/traffic.py, ``Model.step_traffic``): counted from
the real tensors, the routed experts read from the router's output."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from optimized_model.k3 import traffic
from optimized_model.k3.model import K3Model
from optimized_model.k3.runner import K3Runner


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return K3Model.build("tiny", device="cpu", dtype=torch.float32, seed=0)


def same_rows_state(model, batch: int, context: int):
    """A state whose batch rows are all equal (row 0 copied): equal tokens then route alike."""
    st = model.random_state(batch, context, 64, seed=1)
    for t in (st.conv, st.kda, st.latent):
        t.copy_(t[:, :1].expand_as(t))
    return st


def test_bytes_change_with_routing_by_exactly_the_experts_touched(model):
    cfg = model.cfg
    st = same_rows_state(model, 4, 16)
    alike = traffic.decode_traffic(model, torch.full((4,), 7), st)
    spread = traffic.decode_traffic(model, torch.tensor([7, 40, 99, 200]), st)
    # four identical rows: every MoE layer reads exactly top_k experts
    assert alike["experts_touched"] == [cfg.top_k] * len(alike["experts_touched"])
    assert sum(spread["experts_touched"]) > sum(alike["experts_touched"])
    each = model.W(1, "experts_w13")[0].nbytes + model.W(1, "experts_w2")[0].nbytes
    extra = sum(spread["experts_touched"]) - sum(alike["experts_touched"])
    assert spread["experts"] - alike["experts"] == extra * each
    emb_row = model.w["embed"][0].nbytes
    assert spread["total"] - alike["total"] == extra * each + 3 * emb_row  # 4 distinct tokens vs 1
    assert spread["weights"] == alike["weights"] and spread["cache"] == alike["cache"]


def test_counts_match_the_router_and_the_state(model):
    st = model.random_state(2, 20, 64, seed=3)
    tokens = torch.tensor([5, 6])
    routed = traffic.routed_experts(model, tokens, st)
    assert sorted(routed) == [i for i in range(model.cfg.n_layers) if model.cfg.ffn_kind(i) == "moe"]
    t = traffic.step_bytes(model, tokens, st, routed)
    assert t["experts_touched"] == [int(torch.unique(routed[i]).numel()) for i in sorted(routed)]
    cfg = model.cfg
    row = cfg.kv_lora * st.latent.element_size()
    assert t["cache"] == cfg.n_mla * ((20 + 1) * 2 + 2) * row  # read 0..20 per sequence, write one
    assert t["state"] == 2 * (st.kda.nbytes + st.conv.nbytes + st.lengths.nbytes)
    assert t["total"] == sum(t[k] for k in ("weights", "experts", "embedding", "state", "cache", "io"))
    # routing read on a copy: the step does not advance the state it was given
    assert int(st.lengths[0]) == 20


def test_every_weight_counted_is_read_by_the_step(model):
    """The count takes every tensor of model.w as read: check against the tensors a decode
    step's ops actually receive (a weight the step never reads would inflate the roofline)."""
    ptrs: set[int] = set()

    class Seen(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            for a in torch.utils._pytree.tree_leaves((args, kwargs or {})):
                if isinstance(a, torch.Tensor):
                    ptrs.add(a.untyped_storage().data_ptr())
            return func(*args, **(kwargs or {}))

    st = model.random_state(2, 8, 64, seed=0)
    with Seen():
        model.decode(torch.tensor([1, 2]), st)
    unread = [n for n, w in model.w.items() if w.untyped_storage().data_ptr() not in ptrs]
    assert unread == []


def test_runner_step_traffic_uses_the_benchmark_steps_inputs(model):
    r = K3Runner(model, use_graphs=False)
    a = r.step_traffic(2, 16)
    state, tokens = r._bench_inputs(2, 16, 0)
    assert a == traffic.decode_traffic(model, tokens, state)
    v = r.step_traffic(2, 16, draft=3)
    state, tokens = r._bench_inputs(2, 16, 0, draft=3)
    assert tokens.shape == (2, 4) and v == traffic.decode_traffic(model, tokens, state)


def test_verify_bytes_grow_with_the_experts_the_drafts_tokens_touch(model):
    """A verify step reads the experts routed for ANY of its B*(K+1) tokens: drafts repeating
    the last token read only its experts; distinct drafts read more, by exactly their slices."""
    cfg = model.cfg
    st = same_rows_state(model, 1, 16)
    plain = traffic.decode_traffic(model, torch.tensor([7]), st)
    repeat = traffic.decode_traffic(model, torch.full((1, 4), 7), st)
    spread = traffic.decode_traffic(model, torch.tensor([[7, 40, 99, 200]]), st)
    routed = traffic.routed_experts(model, torch.tensor([[7, 40, 99, 200]]), st)
    assert spread["experts_touched"] == [int(torch.unique(routed[i]).numel()) for i in sorted(routed)]
    assert all(t >= cfg.top_k for t in repeat["experts_touched"])
    assert sum(spread["experts_touched"]) > sum(repeat["experts_touched"])
    each = model.W(1, "experts_w13")[0].nbytes + model.W(1, "experts_w2")[0].nbytes
    extra = sum(spread["experts_touched"]) - sum(repeat["experts_touched"])
    assert spread["experts"] - repeat["experts"] == extra * each
    emb_row = model.w["embed"][0].nbytes
    assert spread["total"] - repeat["total"] == extra * each + 3 * emb_row
    # the same weights, but 4 tokens' cache, trail and logits: more bytes than a decode step
    assert repeat["weights"] == plain["weights"] and repeat["total"] > plain["total"]


def test_verify_counts_the_cache_window_trail_and_logits_of_its_tokens(model):
    cfg, T = model.cfg, 4
    st = model.random_state(2, 20, 64, seed=3)
    t = traffic.decode_traffic(model, torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]]), st)
    row = cfg.kv_lora * st.latent.element_size()
    assert t["cache"] == cfg.n_mla * ((20 + T) * 2 + 2 * T) * row  # read 0..20+T-1, write T per sequence
    window = st.conv.nbytes // (cfg.kda_conv - 1) * (cfg.kda_conv - 1 + T)
    assert t["state"] == (2 * (st.kda.nbytes + st.conv.nbytes + st.lengths.nbytes)
                          + T * st.kda.nbytes + window + st.kda.nbytes + st.conv.nbytes)
    assert t["io"] == 2 * T * 8 + 2 * T * cfg.vocab_size * 4
    assert int(st.lengths[0]) == 20  # routed on a copy


def test_counting_leaves_the_model_object_untouched(model):
    before = dict(vars(model))
    traffic.decode_traffic(model, torch.tensor([3]), model.random_state(1, 8, 64, seed=0))
    assert vars(model).keys() == before.keys() and all(vars(model)[k] is v for k, v in before.items())
