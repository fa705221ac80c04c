"""The opt-in switch: the harness passes the spec's [switch] to ``Engine.load("fast",
additional_config=...)`` and an engine runs its fast path only for its own key and value.

Both doubles (tests/doubles/) are checked the way the real engine is (tests/test_k3_engine.py),
and the coverage suite, run on the tiny-LM double with a spec whose switch differs, must fail
its gate saying the switch did not engage."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fastpath import trace
from fastpath.engine import switch_config, switch_text
from fastpath.pytest_plugin import LazyModels
from fastpath.suite_helpers import no_event_reason

REPO = Path(__file__).resolve().parent.parent
DOUBLES = REPO / "tests" / "doubles"
TINY_SPEC = DOUBLES / "tiny_lm" / "spec.toml"

MISMATCHES = [
    {"decode_backend": "default"},           # wrong value
    {"other_key": "latency_specialized"},    # missing key
    {},
    None,
]


def test_switch_config_is_additional_config_shaped():
    assert switch_config({"key": "decode_backend", "value": "latency_specialized"}) == {
        "decode_backend": "latency_specialized"}
    assert switch_text({"key": "k", "value": "v"}) == "k=v" and switch_text(None) == "?"


def test_lazy_models_pass_the_spec_switch_to_the_fast_path_only():
    calls = []

    class Engine:
        def load(self, path, **kw):
            calls.append((path, kw))
            return object()

    models = LazyModels(lambda: Engine(), {"key": "decode_backend", "value": "x"})
    models["fast"], models["standard"], models["oracle"], models["fast"]
    assert calls == [("fast", {"additional_config": {"decode_backend": "x"}}), ("standard", {}), ("oracle", {})]


def _stub_engine():
    from stub.engine import SWITCH, StubEngine

    return StubEngine(), {SWITCH["key"]: SWITCH["value"]}


def _tiny_engine():
    from tiny_lm.engine import SWITCH, TinyLMEngine

    return TinyLMEngine(), {SWITCH["key"]: SWITCH["value"]}


@pytest.mark.parametrize("make", [_stub_engine, _tiny_engine], ids=["stub", "tiny_lm"])
def test_double_engines_honour_the_switch(make):
    engine, own = make()
    assert engine.info()["switch"] == {"key": next(iter(own)), "value": next(iter(own.values()))}
    for config in MISMATCHES + [{next(iter(own)): "latency_specialized_v2"}]:
        model = engine.load("fast", additional_config=config)
        with trace.recording() as rec:
            model.decode_step(1, 16)()
        assert rec.events == [], f"additional_config={config}: the fast path reported {rec.events[:2]}"
    model = engine.load("fast", additional_config=own)
    with trace.recording() as rec:
        model.decode_step(1, 16)()
    assert rec.engaged(), "the engine's own switch did not engage its fast path"


def test_no_event_reason_names_both_switches():
    class Spec:
        switch = {"key": "decode_backend", "value": "turbo"}

    class Engine:
        def __init__(self, switch):
            self.switch = switch

        def info(self):
            return {"switch": self.switch} if self.switch else {}

    own = {"key": "decode_backend", "value": "latency_specialized"}
    assert no_event_reason(Spec, Engine(own)) == (
        "no fast-path event: the switch decode_backend=turbo did not engage the fast path "
        "(engine expects decode_backend=latency_specialized)")
    assert "does not state" in no_event_reason(Spec, Engine(None))
    Spec.switch = own  # the right switch and still silent: the fast path itself did not fire
    assert no_event_reason(Spec, Engine(own)).endswith("on: the fast path did not fire")


def _run_coverage(tmp_path: Path, spec_text: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """fastpath/suites/test_coverage.py (decode and fallback cases) under the plugin, on ``spec_text``."""
    spec = tmp_path / "spec.toml"
    spec.write_text(spec_text)
    rows = tmp_path / "rows.jsonl"
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    suites = REPO / "fastpath" / "suites"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(DOUBLES)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))
    cmd = [sys.executable, "-m", "pytest", str(suites / "test_coverage.py"), "-c", str(tmp_path / "pytest.ini"),
           "--rootdir", str(suites), "--confcutdir", str(suites), "-p", "fastpath.pytest_plugin",
           "-p", "no:cacheprovider", "--import-mode=importlib", "-q", "--no-header",
           "--fastpath-spec", str(spec), "--fastpath-tier", "smoke", "--fastpath-rows", str(rows),
           "--fastpath-suite", "coverage", "-k", "decode or fallback"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    return proc, [json.loads(line) for line in rows.read_text().splitlines() if line.strip()]


def test_coverage_gate_fails_when_the_spec_switch_is_not_the_engines(tmp_path):
    text = TINY_SPEC.read_text()
    wrong = text.replace('value = "latency_specialized"', 'value = "default"')
    assert wrong != text
    proc, rows = _run_coverage(tmp_path, wrong)  # failing rows, not failing tests: read the rows
    assert rows, proc.stdout[-2000:] + proc.stderr[-2000:]
    for gate in ("coverage_fast_path_fired", "coverage_clean_fallback"):
        gate_rows = [r for r in rows if r["gate"] == gate]
        assert gate_rows and all(r["status"] == "fail" for r in gate_rows), gate
        assert all("no fast-path event: the switch decode_backend=default did not engage the fast path "
                   "(engine expects decode_backend=latency_specialized)" in r["message"] for r in gate_rows)


def test_coverage_gate_passes_with_the_engines_own_switch(tmp_path):
    proc, rows = _run_coverage(tmp_path, TINY_SPEC.read_text())
    assert proc.returncode == 0 and rows, proc.stdout[-2000:] + proc.stderr[-2000:]
    gated = [r for r in rows if r["gate"] != "coverage_profiler_kernels"]
    assert gated and all(r["status"] == "pass" for r in gated), [r for r in gated if r["status"] != "pass"][:2]
    # tiny_lm launches no Triton kernel, so the CPU second source has nothing to see: a visible waiver
    second = [r for r in rows if r["gate"] == "coverage_profiler_kernels"]
    assert second and all(r["status"] == "waived" and "no second source on CPU" in r["message"] for r in second)
    assert {"coverage_fast_path_fired", "coverage_clean_fallback"} <= {r["gate"] for r in rows}
