"""Import a suite module (fastpath/suites/test_NAME.py) in a test, outside the plugin that registers
its marks, to call its helpers directly."""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

import pytest

SUITES = Path(__file__).resolve().parent.parent / "fastpath" / "suites"


def load_suite(name: str, alias: str | None = None):
    spec = importlib.util.spec_from_file_location(alias or f"_suite_{name}", SUITES / f"test_{name}.py")
    mod = importlib.util.module_from_spec(spec)
    with warnings.catch_warnings():  # the fastpath mark is registered by the plugin, absent here
        warnings.simplefilter("ignore", pytest.PytestUnknownMarkWarning)
        spec.loader.exec_module(mod)
    return mod
