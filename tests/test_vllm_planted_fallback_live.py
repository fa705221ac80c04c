"""The planted silent fallback (FASTPATH_VLLM_FIXTURE_FAULT=silent_fallback: the fixture's
switched-on model runs vLLM's stock LM head and reports nothing) fails the coverage gate of
`fastpath verify` run through vLLM, naming the switch."""

from __future__ import annotations

from test_vllm_verify_live import gate_status, run_verify
from vllm_live import requires_vllm

pytestmark = requires_vllm


def test_a_silent_fallback_inside_vllm_fails_the_coverage_gate(tmp_path):
    proc, summary = run_verify(tmp_path, "coverage", FASTPATH_VLLM_FIXTURE_FAULT="silent_fallback")
    status = gate_status(summary)
    assert status.get("coverage_fast_path_fired") == "fail", (status, proc.stdout[-4000:])
    assert proc.returncode != 0
    assert "decode_backend=latency_specialized" in proc.stdout
