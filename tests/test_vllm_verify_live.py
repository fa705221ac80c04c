"""`fastpath verify` on the vLLM plugin fixture (tests/doubles/vllm_plugin/spec.toml, engine
"vllm"), live on vLLM's CPU build: the suites drive vLLM through the vllm engine and pass."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from vllm_live import PLUGIN_DIR, ROOT, make_fixture_model, plugin_env, requires_vllm

pytestmark = requires_vllm

SPEC = PLUGIN_DIR / "spec.toml"
# features is left out: fastpath/suites/test_features.py requires a fast-path component named "sampler"
# (K3-mini's own sampler); a fast path inside vLLM samples with vLLM's sampler (see the README).
SUITES = os.environ.get("FASTPATH_VLLM_VERIFY_SUITES", "coverage,kernels,parity")


def run_verify(tmp_path, suites: str, **env) -> tuple[subprocess.CompletedProcess, dict]:
    model = make_fixture_model(tmp_path / "model")
    out = tmp_path / "run"
    full_env = {**os.environ, **plugin_env(), "FASTPATH_VLLM_FIXTURE_MODEL": str(model), **env}
    proc = subprocess.run([sys.executable, "-m", "fastpath.cli", "verify", str(SPEC), "--tier", "smoke",
                           "--only", suites, "--out", str(out)], cwd=ROOT, env=full_env,
                          capture_output=True, text=True, timeout=1500)
    summary = {}
    for p in out.glob("*.fastpath/summary.json"):
        summary = json.loads(p.read_text())
    return proc, summary


def gate_status(summary: dict) -> dict[str, str]:
    return {name: g["status"] for name, g in summary.get("gates", {}).items()}


def test_verify_on_the_vllm_plugin_fixture_passes(tmp_path):
    proc, summary = run_verify(tmp_path, SUITES)
    status = gate_status(summary)
    assert status, proc.stdout[-4000:] + proc.stderr[-4000:]
    failed = {g: s for g, s in status.items() if s in ("fail", "error")}
    assert not failed, (failed, proc.stdout[-6000:])
    assert status["coverage_fast_path_fired"] == "pass"
    assert status["coverage_clean_fallback"] == "pass"
