"""The engine's weights file from a training state: ``python3 -m lab.train.export STATE_DIR OUT``.

Writes OUT (one safetensors file, bf16; fp32 where weights.FP32_NAMES says) from the master
weights of the state a GPU run returned, and prints its sha256: the spec's engine option
``weights_sha256``. ``--as-config trained`` adopts a lab config's weights as the product config
that now has its shapes (the file records the config it loads as).
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
    ap.add_argument("--as-config", default=None,
                    help="the config the file loads as (default: the state's); its weights must have the state's names and shapes")
    args = ap.parse_args(argv)
    tensors, meta = checkpoint.load_state(args.state_dir)
    config = args.as_config or meta["config"]
    m = TrainableK3.create(get_config(config), device="cpu", compute_dtype=torch.float32)
    names = {k[2:] for k in tensors if k.startswith("w/")}
    if names != set(m.master) or any(tuple(tensors[f"w/{n}"].shape) != tuple(t.shape) for n, t in m.master.items()):
        raise SystemExit(f"{args.state_dir}: its weights (config {meta['config']}) do not have config {config}'s "
                         f"names and shapes: export as {meta['config']}, or pass a config of the same shapes")
    with torch.no_grad():
        for name, t in m.master.items():
            t.copy_(tensors[f"w/{name}"])
    path = checkpoint.export_weights(m.export(torch.bfloat16), args.out,
                                     {"config": config, "step": meta["step"], "trained_s": meta["trained_s"],
                                      "aime_style": TrainConfig.from_json(meta["train_config"]).mix.aime_style})
    print(f"{path}: sha256 {hashlib.sha256(path.read_bytes()).hexdigest()} ({path.stat().st_size} bytes, "
          f"config {config}, step {meta['step']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
