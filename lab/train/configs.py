"""Configs the lab trains beside the product's (optimized_model/k3/config.py), known to
``get_config`` by name inside every lab.train process (this package's __init__ registers them),
so a training run, its export and the probe's engine all load them; the product's configs stay
untouched until a checkpoint of one is adopted."""

from __future__ import annotations

import dataclasses

from optimized_model.k3.config import CONFIGS, TRAINED

# the trained config as it was until session 40 (MLA at layers 3 and 7 only), kept for comparing with
# it: earlier states record that shape as `trained` (`lab.train.export --as-config trained_mla_every4`)
TRAINED_MLA_EVERY4 = dataclasses.replace(TRAINED, name="trained_mla_every4", mla_every=4)
# the trained config with twice the MLA heads: lab/train/widen.py makes its first weights (session 37
# trained it with the MLA layers of trained_mla_every4)
TRAINED_MLA8 = dataclasses.replace(TRAINED, name="trained_mla8", mla_heads=2 * TRAINED.mla_heads)
# the name sessions 38-40 trained the product's `trained` config under (MLA at every 2nd layer),
# before its checkpoint was adopted: their states and exports name it
TRAINED_MLA_EVERY2 = dataclasses.replace(TRAINED, name="trained_mla_every2")

LAB_CONFIGS = (TRAINED_MLA_EVERY4, TRAINED_MLA8, TRAINED_MLA_EVERY2)


def register() -> None:
    for cfg in LAB_CONFIGS:
        CONFIGS.setdefault(cfg.name, cfg)
