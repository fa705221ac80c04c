"""The engine's weights file from a training state: ``python3 -m lab.train.export STATE_DIR OUT``.

Writes OUT (one safetensors file, bf16; fp32 where weights.FP32_NAMES says) from the master
weights of the state a GPU run returned, and prints its sha256: the spec's engine option
``weights_sha256``.
"""

from __future__ import annotations

import argparse
import hashlib

import torch


def main(argv: list[str] | None = None) -> int:
    from lab.train import checkpoint
    from lab.train.loop import TrainConfig
    from lab.train.trainable import TrainableK3
    from optimized_model.k3.config import get_config

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("state_dir")
    ap.add_argument("out")
    args = ap.parse_args(argv)
    tensors, meta = checkpoint.load_state(args.state_dir)
    m = TrainableK3.create(get_config(meta["config"]), device="cpu", compute_dtype=torch.float32)
    with torch.no_grad():
        for name, t in m.master.items():
            t.copy_(tensors[f"w/{name}"])
    path = checkpoint.export_weights(m.export(torch.bfloat16), args.out,
                                     {"config": meta["config"], "step": meta["step"], "trained_s": meta["trained_s"],
                                      "aime_style": TrainConfig.from_json(meta["train_config"]).mix.aime_style})
    print(f"{path}: sha256 {hashlib.sha256(path.read_bytes()).hexdigest()} ({path.stat().st_size} bytes, "
          f"config {meta['config']}, step {meta['step']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
