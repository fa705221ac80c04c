"""The ``trained`` config: its checkpoint fits one 16 MiB file, and its fast path runs under
Triton's interpreter — every component engaged at every layer (coverage) and the logits of the
standard path (parity), fp32 and fp16 against the fp32 oracle. Its sm_90 build is checked by
``python3 -m lab.aot --config trained`` (93 launches compile, none over the H200's shared memory)."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any fast kernel module is imported

import pytest
import torch

from fastpath import trace
from optimized_model.k3.config import get_config, param_counts
from optimized_model.k3.fast import dispatch, registry
from optimized_model.k3.model import K3Model

CFG = get_config("trained")


def test_the_bf16_checkpoint_fits_one_16_mib_file():
    assert 2 * param_counts(CFG)["total"] + 64 * 1024 <= 16 * 2**20  # + the safetensors header
    dims = (CFG.hidden, CFG.kda_head_dim, CFG.kda_dim, CFG.q_lora, CFG.kv_lora, CFG.qk_nope, CFG.v_head,
            CFG.moe_latent, CFG.expert_inter, CFG.shared_inter, CFG.dense_inter, CFG.n_experts, CFG.top_k)
    assert all(d & (d - 1) == 0 for d in dims), dims  # the fast kernels' tiles are powers of two


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_fast_decode_on_the_trained_config(dtype, one_torch_thread):
    m = K3Model.build(CFG, device="cpu", dtype=dtype, seed=0)
    orc = K3Model.build(CFG, device="cpu", dtype=torch.float32, seed=0, oracle=True, round_dtype=dtype)
    fd = dispatch.build_fast_decoder(m, lambda b, cap: m.new_state(b, cap))
    st = m.random_state(2, 9, 64, seed=1)
    st_o, st_f = st.to_dtype(torch.float32), st.clone()
    st_f.max_len = 9
    tok = torch.tensor([5, 200])
    n = CFG.n_real_tokens
    ref_s = m.decode(tok, st)[:, :n].float()
    ref_o = orc.decode(tok, st_o)[:, :n]
    with trace.recording() as rec:
        out = fd.decode(tok, st_f)[:, :n]
    comps = rec.components()
    for name in registry.COMPONENT_NAMES:
        if name == "sampler":
            continue
        expect = {"refused:no_cuda"} if name == "decode_graph" else None
        assert name in comps and (comps[name] == expect if expect else not any(v.startswith("refused") for v in comps[name])), (name, comps)
    kinds = CFG.layer_kinds
    assert len(rec.engaged("kda_decode")) == kinds.count("kda") and len(rec.engaged("mla_decode")) == kinds.count("mla")
    assert len(rec.engaged("moe_experts")) == CFG.n_layers - 1
    if dtype == torch.float32:
        assert (out - ref_s).abs().max().item() < 1e-4
    else:  # the noise-floor rule of the kernels suite: within 2x the standard path's own error
        noise = (ref_s - ref_o).abs().max().item()
        assert (out - ref_o).abs().max().item() <= max(2 * noise, 1e-2)
    assert (out.argmax(-1) == ref_s.argmax(-1)).all()
