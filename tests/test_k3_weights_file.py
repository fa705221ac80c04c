"""The embedded engine loads trained weights from one safetensors file pinned by its sha256;
a missing, truncated or other file is one line naming the path and the expected digest."""

import hashlib

import pytest
import torch

from fastpath.engine import create_engine
from lab.train.checkpoint import export_weights
from lab.train.trainable import TrainableK3
from optimized_model.k3.config import get_config
from optimized_model.k3.model import K3Model
from optimized_model.k3.weights_file import WeightsError, load_weights


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    m = TrainableK3.create(get_config("tiny"), device="cpu", compute_dtype=torch.float32, seed=5)
    with torch.no_grad():  # not the seeded random weights: a loaded model must differ from them
        m.master["lm_head"].mul_(-1)
    path = export_weights(m.export(torch.bfloat16), tmp_path_factory.mktemp("ckpt") / "tiny.safetensors")
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def _logits(model, tokens):
    return model.score([tokens])[0]


def test_engine_loads_the_checkpoint_on_every_path(tiny_checkpoint, one_torch_thread):
    path, digest = tiny_checkpoint
    eng = create_engine("embedded", config="tiny", dtype="float32", weights=str(path), weights_sha256=digest)
    assert eng.info()["weights_sha256"] == digest
    tokens = [1, 72, 101, 108, 108, 111]
    std, orc = _logits(eng.load("standard"), tokens), _logits(eng.load("oracle"), tokens)
    ref = K3Model(get_config("tiny"), load_weights(path, digest, get_config("tiny"), device="cpu", dtype=torch.float32))
    with torch.inference_mode():
        want = ref.prefill(torch.tensor([tokens]), torch.tensor([len(tokens)]), ref.new_state(1, 64), all_logits=True)[0]
    n = ref.cfg.n_real_tokens
    assert torch.allclose(std[:, :n], want[:, :n], atol=1e-5) and torch.allclose(orc[:, :n], want[:, :n], atol=1e-4)
    seeded = _logits(create_engine("embedded", config="tiny", dtype="float32").load("standard"), tokens)
    assert not torch.allclose(seeded[:, :n], std[:, :n], atol=1e-2)


def _error(**options) -> str:
    with pytest.raises(WeightsError) as exc:
        create_engine("embedded", config="tiny", dtype="float32", **options)
    text = str(exc.value)
    assert "\n" not in text
    return text


def test_missing_truncated_and_other_files_fail_in_one_line(tiny_checkpoint, tmp_path):
    path, digest = tiny_checkpoint
    text = _error(weights=str(tmp_path / "none.safetensors"), weights_sha256=digest)
    assert str(tmp_path / "none.safetensors") in text and digest in text and "does not exist" in text
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(path.read_bytes()[:-100])
    text = _error(weights=str(cut), weights_sha256=digest)
    assert str(cut) in text and f"is not the pinned {digest}" in text
    assert "must pin" in _error(weights=str(path))
    assert "must pin" in _error(weights=str(path), weights_sha256="abc")


def test_a_checkpoint_of_another_config_is_refused(tiny_checkpoint):
    path, digest = tiny_checkpoint
    with pytest.raises(WeightsError, match="not config 'trained'"):
        load_weights(path, digest, get_config("trained"), device="cpu", dtype=torch.float32)
