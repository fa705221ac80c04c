"""Configs the lab trains beside the product's (optimized_model/k3/config.py), known to
``get_config`` by name inside every lab.train process (this package's __init__ registers them),
so a training run, its export and the probe's engine all load them; the product's configs stay
untouched until a checkpoint of one is adopted."""

from __future__ import annotations

import dataclasses

from optimized_model.k3.config import CONFIGS, TRAINED

# the trained config with twice the MLA heads: lab/train/widen.py makes its first weights
TRAINED_MLA8 = dataclasses.replace(TRAINED, name="trained_mla8", mla_heads=2 * TRAINED.mla_heads)


def register() -> None:
    CONFIGS.setdefault(TRAINED_MLA8.name, TRAINED_MLA8)
