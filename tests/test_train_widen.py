"""lab.train.widen: doubling the trained config's MLA heads keeps what the model computes."""

from __future__ import annotations

import time

import pytest
import torch

from lab.train import checkpoint, widen
from lab.train.loop import TrainConfig, train
from lab.train.trainable import TrainableK3
from optimized_model.k3.config import get_config


def _per_position_ce(cfg, weights):
    m = TrainableK3.create(cfg, device="cpu", compute_dtype=torch.float32, moe_backend="loop")
    with torch.no_grad():
        for name, t in m.master.items():
            t.copy_(weights[name])
        tokens = torch.randint(1, 256, (2, 48), generator=torch.Generator().manual_seed(1))
        return m.loss(tokens, torch.tensor([48, 40]), torch.ones(2, 48))[1]


def test_doubled_mla_heads_compute_what_the_narrow_model_did_until_the_noise_breaks_the_tie(one_torch_thread):
    narrow = get_config("trained")
    weights = TrainableK3.create(narrow, device="cpu", compute_dtype=torch.float32, seed=3).export(torch.float32)
    wide = widen.widen(weights, narrow, heads="copied", noise=0.0, seed=0)
    assert get_config("trained_mla8").mla_heads == 2 * narrow.mla_heads
    assert wide["L3.q_b"].shape[0] == 2 * weights["L3.q_b"].shape[0] and wide["L7.o_proj"].shape[1] == 2 * weights["L7.o_proj"].shape[1]
    assert torch.equal(wide["L0.qkv_proj"], weights["L0.qkv_proj"])
    base = _per_position_ce(narrow, weights)
    torch.testing.assert_close(_per_position_ce(get_config("trained_mla8"), wide), base, rtol=1e-4, atol=1e-4)
    noisy = widen.widen(weights, narrow, heads="copied", noise=0.5, seed=0)
    H, nope = narrow.mla_heads, narrow.qk_nope
    assert torch.equal(noisy["L3.q_b"][: H * nope], weights["L3.q_b"])  # the originals stay
    assert not torch.equal(noisy["L3.q_b"][H * nope:], weights["L3.q_b"])  # the copies move
    assert (_per_position_ce(get_config("trained_mla8"), noisy) - base).abs().max() > 1e-3


def test_fresh_heads_start_silent_with_queries_unlike_the_old_ones(one_torch_thread):
    narrow = get_config("trained")
    weights = TrainableK3.create(narrow, device="cpu", compute_dtype=torch.float32, seed=3).export(torch.float32)
    wide = widen.widen(weights, narrow, heads="fresh", seed=0)
    H, nope, v = narrow.mla_heads, narrow.qk_nope, narrow.v_head
    assert torch.equal(wide["L3.o_proj"][:, : H * v], weights["L3.o_proj"])  # the old heads speak as before
    assert float(wide["L3.o_proj"][:, H * v:].abs().max()) == 0.0  # the new ones not yet
    for name, rows in (("q_b", H * nope), ("gate_proj", H * v)):  # queries and gates drawn anew
        new, old = wide[f"L3.{name}"][rows:], weights[f"L3.{name}"]
        assert abs(float(torch.nn.functional.cosine_similarity(new.flatten(), old.flatten(), dim=0))) < 0.05, name
    assert torch.equal(wide["L3.kv_b"][H * (nope + v):], weights["L3.kv_b"])  # keys and values copied
    torch.testing.assert_close(_per_position_ce(get_config("trained_mla8"), wide), _per_position_ce(narrow, weights),
                               rtol=1e-4, atol=1e-4)


def test_fresh_heads_can_speak_from_the_start(one_torch_thread):
    narrow = get_config("trained")
    weights = TrainableK3.create(narrow, device="cpu", compute_dtype=torch.float32, seed=3).export(torch.float32)
    H, v = narrow.mla_heads, narrow.v_head
    loud = widen.widen(weights, narrow, heads="fresh", out_scale=0.5, seed=0)
    old, new = weights["L3.o_proj"], loud["L3.o_proj"][:, H * v:]
    assert torch.equal(loud["L3.o_proj"][:, : H * v], old)
    assert 0.4 < float(new.std() / old.std()) < 0.6  # at the asked share of the old heads' spread
    assert (_per_position_ce(get_config("trained_mla8"), loud) - _per_position_ce(narrow, weights)).abs().max() > 1e-4
    with pytest.raises(ValueError, match="out_scale"):  # copies share their heads' outputs
        widen.widen(weights, narrow, heads="copied", out_scale=0.5)


def test_a_fine_tune_starts_from_the_widened_file(tmp_path, one_torch_thread):
    narrow = get_config("trained")
    weights = TrainableK3.create(narrow, device="cpu", compute_dtype=torch.float32, seed=3).export(torch.bfloat16)
    checkpoint.export_weights(weights, tmp_path / "narrow.safetensors", {"config": "trained", "step": 7})
    assert widen.main([str(tmp_path / "narrow.safetensors"), str(tmp_path / "wide.safetensors")]) == 0
    assert checkpoint.export_meta(tmp_path / "wide.safetensors")["config"] == "trained_mla8"
    said: list[str] = []
    train(TrainConfig(config="trained_mla8"), device="cpu", out_dir=tmp_path / "ft", deadline=time.monotonic() + 600,
          compute_dtype=torch.float32, moe_backend="loop", max_steps=0, say=said.append,
          init_from=tmp_path / "wide.safetensors")
    state, meta = checkpoint.load_state(tmp_path / "ft")
    assert meta["config"] == "trained_mla8" and any("(step 7); a fresh optimizer" in s for s in said)
    assert torch.equal(state["w/L3.kv_b"], torch.cat([weights["L3.kv_b"]] * 2).float())
    # a resumed run builds the state's config, whatever the command line's default (session 31's
    # second segment failed on exactly this: the trained config's shapes for a trained_mla8 state)
    said.clear()
    train(TrainConfig(config="trained"), device="cpu", out_dir=tmp_path / "ft2", deadline=time.monotonic() + 600,
          compute_dtype=torch.float32, moe_backend="loop", max_steps=0, say=said.append, resume=tmp_path / "ft")
    assert checkpoint.load_state(tmp_path / "ft2")[1]["config"] == "trained_mla8"
    assert any("resuming with the training config the state was saved with" in s for s in said)
