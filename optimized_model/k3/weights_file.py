"""Trained weights from one safetensors file, checked against the sha256 the spec pins.

    weights = load_weights("optimized_model/k3/checkpoints/trained.safetensors", sha256, cfg,
                           device="cuda", dtype=torch.bfloat16)

The file holds weights.py's names and layouts (written by lab/train's export: bf16, with the
router, its bias and the KDA decay parameters in fp32). A relative path is relative to the
repository root (the checkout this package lives in), so a spec's engine option means the same
file wherever verify runs. Every failure is one ``WeightsError`` line naming the path, the
expected digest and the fix: a missing file, a digest that is not the pinned one (a truncated,
changed or other checkpoint), a file safetensors cannot read, or one whose tensors are not this
config's. Values are rounded to ``round_dtype`` then stored in ``dtype`` as ``init_weights``
does (the oracle: the standard path's values upcast to fp32).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import torch

from .config import K3Config
from .weights import FP32_NAMES, init_weights

REPO_ROOT = Path(__file__).resolve().parents[2]
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


class WeightsError(ValueError):
    """A weights file that cannot be used (one line: path, expected digest, fix)."""


def resolve(path: str | Path) -> Path:
    p = Path(path)
    return p if p.is_absolute() else REPO_ROOT / p


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def verify_file(path: str | Path, sha256: str | None) -> Path:
    """The resolved path of a weights file whose bytes have the pinned ``sha256``."""
    p = resolve(path)
    if not sha256 or not SHA256_RE.match(str(sha256)):
        raise WeightsError(f"weights {p}: the spec must pin the file's sha256 (engine option weights_sha256, "
                           f"64 lowercase hex digits; got {sha256!r}); put its digest there")
    if not p.is_file():
        raise WeightsError(f"weights {p} does not exist (expected sha256 {sha256}); fix engine option weights, "
                           "or train and export it (lab/train)")
    actual = file_sha256(p)
    if actual != sha256:
        raise WeightsError(f"weights {p}: sha256 {actual} is not the pinned {sha256} (a truncated, changed or "
                           "other checkpoint); restore the file or pin the digest of the one you mean")
    return p


def load_weights(path: str | Path, sha256: str | None, cfg: K3Config, *, device, dtype: torch.dtype,
                 round_dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    p = verify_file(path, sha256)
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        raw = load_file(str(p))
    except (SafetensorError, OSError) as exc:
        raise WeightsError(f"weights {p} (sha256 {sha256}) is not a readable safetensors file ({exc}); "
                           "re-export it (lab/train)") from None
    want = _layout(cfg)
    if set(raw) != set(want) or any(tuple(raw[k].shape) != want[k] for k in want):
        bad = sorted(set(raw) ^ set(want)) or [k for k in want if tuple(raw[k].shape) != want[k]]
        raise WeightsError(f"weights {p} (sha256 {sha256}) are not config {cfg.name!r}'s tensors (first "
                           f"difference: {bad[0]}); load it with the config it was trained as")
    round_dtype = round_dtype or dtype
    out = {}
    for name in want:  # weights.py's order
        t = raw[name].to(device)
        out[name] = t.float() if name.split(".")[-1] in FP32_NAMES else t.to(round_dtype).to(dtype)
    return out


def _layout(cfg: K3Config) -> dict[str, tuple[int, ...]]:
    """Names and shapes of ``cfg``'s weights: init_weights on the meta device (no memory)."""
    w = init_weights(cfg, device="meta", dtype=torch.float32)
    return {k: tuple(v.shape) for k, v in w.items()}
