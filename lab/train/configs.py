"""Configs the lab trains beside the product's (optimized_model/k3/config.py), known to
``get_config`` by name inside every lab.train process (this package's __init__ registers them),
so a training run, its export and the probe's engine all load them; the product's configs stay
untouched until a checkpoint of one is adopted."""

from __future__ import annotations

import dataclasses

from optimized_model.k3.config import CONFIGS, TRAINED

# the trained config with twice the MLA heads: lab/train/widen.py makes its first weights
TRAINED_MLA8 = dataclasses.replace(TRAINED, name="trained_mla8", mla_heads=2 * TRAINED.mla_heads)
# the trained config with an MLA layer at every 2nd layer (1, 3, 5, 7), not every 4th: trained
# checkpoints choose MRCR's k-th message with layer 3 alone, the last MLA layer's gates shut
# (docs/k3-mini.md, "The 8-head config from the start"); an earlier second attention layer may
# mark the k-th heading for a later one to copy after
TRAINED_MLA_EVERY2 = dataclasses.replace(TRAINED, name="trained_mla_every2", mla_every=2)

LAB_CONFIGS = (TRAINED_MLA8, TRAINED_MLA_EVERY2)


def register() -> None:
    for cfg in LAB_CONFIGS:
        CONFIGS.setdefault(cfg.name, cfg)
