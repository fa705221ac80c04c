"""The lab's training configs (lab/train/configs.py): what adopting a checkpoint of one needs of
the product, checked before any GPU time is spent on training it."""

from __future__ import annotations

import dataclasses
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any fast kernel module is imported

import pytest
import torch

from fastpath import trace
from lab.train.configs import LAB_CONFIGS
from optimized_model.k3.config import get_config
from optimized_model.k3.fast import dispatch
from optimized_model.k3.model import K3Model


def test_the_trained_config_puts_attention_at_every_second_layer_as_its_lab_name_did():
    assert get_config("trained").layer_kinds == ["kda", "mla"] * 4
    assert get_config("trained_mla_every2") == dataclasses.replace(get_config("trained"), name="trained_mla_every2")
    assert get_config("trained_mla_every4").layer_kinds == ["kda", "kda", "kda", "mla"] * 2


@pytest.mark.parametrize("name", [c.name for c in LAB_CONFIGS])
def test_the_fast_path_decodes_a_lab_config_as_the_standard_path_does(name, one_torch_thread):
    """In the interpreter (trained_mla8's sm_90 build: ``lab.aot`` compiled 93 launches, none
    over the shared memory, session 31)."""
    cfg = get_config(name)
    m = K3Model.build(cfg, device="cpu", dtype=torch.float32, seed=0)
    fd = dispatch.build_fast_decoder(m, lambda b, cap: m.new_state(b, cap))
    st = m.random_state(2, 9, 64, seed=1)
    st_f = st.clone()
    st_f.max_len = 9
    tok = torch.tensor([5, 200])
    ref = m.decode(tok, st)[:, : cfg.n_real_tokens]
    with trace.recording() as rec:
        out = fd.decode(tok, st_f)[:, : cfg.n_real_tokens]
    assert len(rec.engaged("mla_decode")) == cfg.layer_kinds.count("mla")
    assert len(rec.engaged("kda_decode")) == cfg.layer_kinds.count("kda")
    assert (out - ref).abs().max().item() < 1e-4 and (out.argmax(-1) == ref.argmax(-1)).all()
