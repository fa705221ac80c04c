"""K3-mini tensor parallelism and decode context parallelism on CPU: gloo, 2 and 4 processes
(torch.multiprocessing spawn), tiny config in fp32. Each multi-rank case prefills ragged prompts
and decodes several steps; its logits must equal the single-rank model's on the same seeded
weights, on every rank."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from optimized_model.k3.config import get_config
from optimized_model.k3.model import K3Model
from optimized_model.k3.parallel_check import generate_logits, random_inputs
from optimized_model.k3.shard import check_tp, shard_weights
from optimized_model.k3.weights import init_weights

pytestmark = pytest.mark.usefixtures("one_torch_thread")

GLOO = dist.is_available() and dist.is_gloo_available()
needs_gloo = pytest.mark.skipif(not GLOO, reason="torch.distributed with the gloo backend is not in this torch build")

# 4 heads per attention kind so that TP 4 has one head per rank (the tiny config has 2)
CONFIGS = {2: get_config("tiny"), 4: get_config("tiny", kda_heads=4, kda_head_dim=16, mla_heads=4)}
CASES = {2: (1, 2), 4: (1, 2, 4)}  # world size (= TP) -> DCP sizes
MOE = {2: None, 4: "loop"}  # the default (grouped where torch has it) and the per-expert loop
SEED, CAPACITY, STEPS = 5, 16, 5
LENGTHS = [9, 1]  # ragged; a 1-token prompt leaves DCP ranks with no visible position at first


def _generate(model):
    """(prefill logits then STEPS decode logits [1 + STEPS, B, vocab], final state)."""
    return generate_logits(model, *random_inputs(LENGTHS, STEPS), CAPACITY)


def _worker(rank: int, world: int, rdzv: str, out_dir: str) -> None:
    from optimized_model.k3.parallel import K3ParallelModel, Layout

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rdzv}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    try:
        cfg = CONFIGS[world]
        full = init_weights(cfg, seed=SEED)
        for dcp in CASES[world]:
            model = K3ParallelModel(cfg, full, Layout.from_world(dcp=dcp), moe_backend=MOE[world])
            logits, state = _generate(model)
            torch.save({"logits": logits, "latent": state.latent},
                       os.path.join(out_dir, f"tp{world}-dcp{dcp}-rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """world size -> directory of the ranks' saved logits (each world spawned once, lazily)."""
    import torch.multiprocessing as mp

    done: dict[int, str] = {}

    def get(world: int) -> str:
        if world not in done:
            d = tmp_path_factory.mktemp(f"k3-tp{world}")
            mp.spawn(_worker, args=(world, str(d / "rdzv"), str(d)), nprocs=world, join=True)
            done[world] = str(d)
        return done[world]

    return get


@needs_gloo
@pytest.mark.parametrize("world,dcp", [(w, d) for w, ds in CASES.items() for d in ds])
def test_parallel_logits_equal_single_rank(runs, world, dcp):
    cfg = CONFIGS[world]
    want, want_state = _generate(K3Model(cfg, init_weights(cfg, seed=SEED), moe_backend=MOE[world]))
    out_dir = runs(world)
    got = [torch.load(os.path.join(out_dir, f"tp{world}-dcp{dcp}-rank{r}.pt")) for r in range(world)]
    n = cfg.n_real_tokens
    for r in range(world):  # every rank ends with the same (all-gathered) logits
        assert torch.equal(got[r]["logits"], got[0]["logits"]), f"rank {r} logits differ from rank 0's"
    torch.testing.assert_close(got[0]["logits"][..., :n], want[..., :n], rtol=1e-4, atol=1e-4)
    assert torch.isinf(got[0]["logits"][..., n:]).all()
    # the decode steps do depend on the context (the comparison covers the cache, not just x)
    assert not torch.allclose(want[1:, 0, :n], want[1:, 1, :n], atol=1e-2)
    # the latent cache is split by position: group rank d holds positions d, d + dcp, ... only
    for r in range(world):
        lat, d = got[r]["latent"], r % dcp
        assert lat.shape[2] == -(-CAPACITY // dcp)
        for b, length in enumerate(want_state.lengths.tolist()):
            mine = want_state.latent[:, b, d:length:dcp]
            torch.testing.assert_close(lat[:, b, : mine.shape[1]], mine, rtol=1e-4, atol=1e-4)


@needs_gloo
def test_torchrun_launches_the_check_and_it_passes():
    """The launcher a harness would use: torchrun (env:// rendezvous), gloo, TP 2 x DCP 2."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "optimized_model.k3.parallel_check", "--dcp", "2", "--seed", str(SEED)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert sorted(r["rank"] for r in rows) == [0, 1]
    assert all(r["ok"] and r["tp"] == 2 and r["dcp"] == 2 and r["max_abs_err"] < 1e-4 for r in rows), rows


def test_shards_reassemble_the_full_weights():
    cfg = CONFIGS[4]
    full = init_weights(cfg, seed=SEED)
    parts = [shard_weights(cfg, full, r, 4) for r in range(4)]
    # row-split / column-split tensors concatenate back; the fused latent projection too
    torch.testing.assert_close(torch.cat([p["lm_head"] for p in parts]), full["lm_head"], rtol=0, atol=0)
    torch.testing.assert_close(torch.cat([p["L3.qkv_a"] for p in parts]), torch.cat([full["L3.q_a"], full["L3.kv_a"]]),
                               rtol=0, atol=0)
    torch.testing.assert_close(torch.cat([p["L1.experts_w2"] for p in parts], dim=-1), full["L1.experts_w2"],
                               rtol=0, atol=0)
    # w13 slices are gate-slice | up-slice: rank r's first half is the gate rows of its slice
    I4 = cfg.expert_inter // 4
    torch.testing.assert_close(parts[1]["L1.experts_w13"][:, :I4], full["L1.experts_w13"][:, I4:2 * I4], rtol=0, atol=0)
    # KDA q|k|v rows: rank 1 holds head 1 of each of q, k, v
    d, K = cfg.kda_dim, cfg.kda_head_dim
    want = torch.cat([full["L1.qkv_proj"][b * d + K: b * d + 2 * K] for b in range(3)])
    torch.testing.assert_close(parts[1]["L1.qkv_proj"], want, rtol=0, atol=0)


def test_tp_size_that_does_not_divide_names_the_dimension():
    with pytest.raises(ValueError, match="kda_heads=2"):
        check_tp(get_config("tiny"), 4)
