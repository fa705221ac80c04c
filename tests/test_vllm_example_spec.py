"""examples/vllm-kimi-k3/fastpath.toml: a valid spec for a fast path inside vLLM whose plan is the
TP8 / TP16 matrix, and which this repository's PR gate does not protect (it attests vLLM's files)."""

import tomllib
from pathlib import Path

from fastpath.plan import build_plan
from fastpath.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "examples" / "vllm-kimi-k3" / "fastpath.toml"


def test_the_full_plan_is_the_tp8_tp16_matrix():
    spec = load_spec(SPEC)
    assert spec.engine == "vllm"
    plan = build_plan(spec, "full")
    decode = [c.config for c in plan.cases if c.suite == "coverage" and c.kind == "decode"]
    assert {c["tp"] for c in decode} == {8, 16}
    assert {c["batch"] for c in decode} == {1, 2, 4, 8, 16, 32, 64}
    assert {c["dcp"] for c in decode} == {1, 8} and {c["draft"] for c in decode} == {0, 1, 3}
    assert any(c.case_id.startswith("coverage/decode/tp16-") for c in plan.cases)


def test_the_pr_gate_does_not_ask_a_bundle_for_it():
    gated = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["fastpath"]["gated_specs"]
    assert "examples/vllm-kimi-k3/fastpath.toml" not in gated
