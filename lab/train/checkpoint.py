"""Training state as safetensors shards that fit what a GPU run may return (files of at most
16 MiB, at most 8 per run, 64 MiB in all): fp32 master weights, router biases and both AdamW
moments, ``MAX_SHARD_BYTES`` a file; the step, the data mix, the schedule position and the run
history ride in the first shard's metadata. Written under temporary names and renamed, so a run
killed while saving leaves the previous complete state.

``export_weights`` writes what the engine loads: one safetensors file, bf16 (fp32 for the
router, its bias and the KDA decay parameters, as weights.FP32_NAMES says).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

MAX_SHARD_BYTES = 15 * 1024 * 1024
SHARD_GLOB = "state-*.safetensors"
META_KEY = "train_meta"


def _shard_name(i: int) -> str:
    return f"state-{i:02d}.safetensors"


def state_tensors(model, optimizer) -> dict[str, torch.Tensor]:
    """master weights (w/), router biases (w/ too) and AdamW moments (m/, v/) by name."""
    out = {f"w/{n}": t.detach() for n, t in model.master.items()}
    for name, p in model.trainable_parameters().items():
        st = optimizer.state.get(p)
        if st:
            out[f"m/{name}"], out[f"v/{name}"] = st["exp_avg"], st["exp_avg_sq"]
    return out


def save_state(out_dir: str | Path, tensors: dict[str, torch.Tensor], meta: dict) -> list[Path]:
    """Pack ``tensors`` into shards of at most MAX_SHARD_BYTES; returns the files written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name in sorted(tensors):
        t = tensors[name].detach().float().contiguous().cpu()
        n = t.numel() * 4
        if n > MAX_SHARD_BYTES:
            raise ValueError(f"tensor {name} has {n} bytes, more than a shard ({MAX_SHARD_BYTES}); split it")
        if size + n > MAX_SHARD_BYTES and shards[-1]:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += n
    written = []
    for i, shard in enumerate(shards):
        path = out_dir / _shard_name(i)
        tmp = path.with_suffix(".tmp")
        md = {META_KEY: json.dumps({**meta, "shards": len(shards)})} if i == 0 else {}
        save_file(shard, str(tmp), metadata=md)
        written.append((tmp, path))
    for tmp, path in written:
        os.replace(tmp, path)
    for stale in out_dir.glob(SHARD_GLOB):  # shards of an earlier, larger state
        if int(stale.stem.split("-")[1]) >= len(shards):
            stale.unlink()
    return [p for _, p in written]


def load_state(src_dir: str | Path) -> tuple[dict[str, torch.Tensor], dict]:
    """(tensors by name, meta) from the shards in ``src_dir``; a missing shard is an error."""
    src = Path(src_dir)
    first = src / _shard_name(0)
    if not first.is_file():
        raise FileNotFoundError(f"no training state in {src}: {first.name} is missing; pass the folder "
                                "a previous run wrote (its $OUT files)")
    with safe_open(str(first), "pt") as f:
        meta = json.loads((f.metadata() or {})[META_KEY])
    tensors: dict[str, torch.Tensor] = {}
    for i in range(int(meta["shards"])):
        path = src / _shard_name(i)
        if not path.is_file():
            raise FileNotFoundError(f"training state in {src} is incomplete: {path.name} is missing "
                                    f"(the state has {meta['shards']} shards)")
        with safe_open(str(path), "pt") as f:
            for k in f.keys():
                tensors[k] = f.get_tensor(k)
    return tensors, meta


def load_weights(src: str | Path) -> tuple[dict[str, torch.Tensor], int]:
    """(fp32 master weights by name, their training step) from a state folder or from the engine's
    weights file (``export_weights``: bf16 weights upcast, the state's optimizer is not in it), so a
    fine-tune can start from the committed checkpoint when its training state is gone."""
    src = Path(src)
    if src.is_file():
        with safe_open(str(src), "pt") as f:
            tensors = {k: f.get_tensor(k).float() for k in f.keys()}
        return tensors, int(export_meta(src).get("step", 0))
    tensors, meta = load_state(src)
    return {k[2:]: t for k, t in tensors.items() if k.startswith("w/")}, int(meta["step"])


def restore(model, optimizer, tensors: dict[str, torch.Tensor], step: int) -> None:
    """Put saved master weights, biases and AdamW moments back into ``model`` / ``optimizer``."""
    with torch.no_grad():
        for name, t in model.master.items():
            t.copy_(tensors[f"w/{name}"])
    params = model.trainable_parameters()
    index = {id(p): i for i, p in enumerate(p for g in optimizer.param_groups for p in g["params"])}
    by_id = {id(p): n for n, p in params.items()}
    state = {}
    for pid, i in index.items():
        name = by_id[pid]
        if f"m/{name}" in tensors:
            state[i] = {"step": torch.tensor(float(step)), "exp_avg": tensors[f"m/{name}"].clone(),
                        "exp_avg_sq": tensors[f"v/{name}"].clone()}
    sd = optimizer.state_dict()
    optimizer.load_state_dict({"state": state, "param_groups": sd["param_groups"]})


EXPORT_META_KEY = "lab.train.export"


def export_weights(weights: dict[str, torch.Tensor], path: str | Path, meta: dict | None = None) -> Path:
    """One safetensors file of the engine's weights (``TrainableK3.export()``). ``meta`` rides as one
    sorted JSON string: safetensors writes a metadata table's keys in no fixed order, and two
    exports of one state got two sha256s (the digest the spec pins) from that alone."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    save_file({k: v.contiguous() for k, v in weights.items()}, str(tmp),
              metadata={EXPORT_META_KEY: json.dumps(meta or {}, sort_keys=True)})
    os.replace(tmp, path)
    return path


def export_meta(path: str | Path) -> dict:
    """What ``export_weights`` recorded (a file exported before it recorded one key, such as the
    first committed checkpoint, has its keys flat)."""
    with safe_open(str(path), "pt") as f:
        md = f.metadata() or {}
    return json.loads(md[EXPORT_META_KEY]) if EXPORT_META_KEY in md else md
