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


def profiler_case_rows(coverage, engine, model, monkeypatch, case: dict, production_tokens: int) -> list[dict]:
    """The coverage suite's GPU-only profiler case driven on CPU: the Triton interpreter's launches
    stand in for torch.profiler's kernel names (a test of the case's bookkeeping). Its rows."""
    from fastpath import launches

    def interpreted(run):
        with launches.recording() as rec:
            run()
        return rec.names

    monkeypatch.setattr(coverage, "_profile_kernels", interpreted)
    monkeypatch.setattr(coverage.H, "device_kind", lambda e: "cuda")
    monkeypatch.setattr(coverage, "PRODUCTION_TOKENS", production_tokens)
    rows: list[dict] = []

    def record(gate, metric, value, **kw):
        rows.append({"gate": gate, "metric": metric, "value": value, **kw})

    coverage.test_profiler_kernels(case, engine, {"fast": model}, record, waive=None)
    return rows
