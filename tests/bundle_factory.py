"""Builds a valid signed bundle from synthetic data, for the evidence/check tests.

Independent of `fastpath verify`: a tiny repo with a spec (valid for fastpath.spec; a second
spec beside it), fast-path sources, subject code, a suite, the plan from fastpath.plan, one
passing row per case (waiver rows for waivers), a summary, a key pair and a trust policy listing it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from fastpath import environment
from fastpath.bundle import write_bundle
from fastpath.digest import attested_parts
from fastpath.gates import evaluate
from fastpath.plan import Plan, build_plan
from fastpath.spec import load_spec
from fastpath.signing import generate_keypair, keyid, load_public_key, public_key_hex, sign_bundle

SPEC = """\
[fastpath]
schema = 1
name = "toy-fast"
engine = "embedded"

[switch]
key = "decode_backend"
value = "latency_specialized"

[sources]
globs = ["subject/fast/**/*.py", "subject/fast/**/*.json"]

[scope]
hardware = ["sm_90"]
tensor_parallel = [1]
batch_sizes = [1, 2]
context_lengths = [64, 128]
draft_lengths = [0]
dcp_sizes = [1]
fallbacks = { prefill = "prefill" }

[features]
max_context = 128

[tiers.smoke]
engine_options = { config = "tiny", device = "cpu", dtype = "float32" }
batch_sizes = [1]
context_lengths = [64]

[tiers.full]
engine_options = { config = "mini", device = "cuda", dtype = "bfloat16" }

[gates]
version = "toy-rules-1"

[gates.coverage_fast_path_fired]
suite = "coverage"

[gates.coverage_clean_fallback]
suite = "coverage"

[gates.coverage_profiler_kernels]
suite = "coverage"
"""

GATE_OF_KIND = {"decode": "coverage_fast_path_fired", "fallback": "coverage_clean_fallback",
                "profiler": "coverage_profiler_kernels"}
SPEC_REL = "subject/fastpath.toml"
OTHER_SPEC_REL = "subject/other.toml"  # a second spec of the same repository


@dataclass
class Built:
    repo: Path
    spec: Path
    bundle: Path
    private_key: Path
    public_key: Path
    trust: Path
    keyid: str


def make_repo(root: Path) -> Path:
    (root / "subject/fast/kernels").mkdir(parents=True)
    (root / "fastpath/suites").mkdir(parents=True)
    (root / "pyproject.toml").write_text('[project]\nname = "toy"\n[tool.fastpath]\n'
                                         f'default_spec = "{SPEC_REL}"\n')
    (root / SPEC_REL).write_text(SPEC)
    (root / OTHER_SPEC_REL).write_text(SPEC.replace('name = "toy-fast"', 'name = "toy-other"'))
    (root / "subject/model.py").write_text("LAYERS = 2\n")
    (root / "fastpath/suites/test_coverage.py").write_text("def test_fired():\n    pass\n")
    (root / "subject/fast/hooks.py").write_text("def fire():\n    return 'fast'\n")
    (root / "subject/fast/kernels/gemv.py").write_text("BLOCK = 64\n")
    (root / "subject/fast/tuning.json").write_text('{"b1": 64}\n')
    return root


def make_rows(plan: dict) -> pd.DataFrame:
    rows = []
    for status, cases in (("pass", plan["cases"]), ("waived", plan["waivers"])):
        for c in cases:
            cfg = c["config"]
            rows.append({
                "suite": c["suite"], "case_id": c["case_id"], "gate": GATE_OF_KIND[c["kind"]],
                "metric": "fired", "value": 1.0, "threshold": 1.0, "comparator": ">=", "status": status,
                "passed": status == "pass", "batch": cfg.get("batch"), "context": cfg.get("context"),
                "draft": cfg.get("draft"), "message": c.get("reason", ""),
            })
    return pd.DataFrame(rows)


def gate_summary(rows: pd.DataFrame, tier: str, spec: Path, plan: dict) -> dict:
    """summary.json as fastpath.gates writes it."""
    return evaluate(load_spec(spec), rows, Plan.from_json(plan), tier).to_summary()


def write_trust(path: Path, public_key: Path, tiers: list[str]) -> str:
    pub = load_public_key(public_key)
    kid = keyid(pub)
    path.write_text(f'[[keys]]\nkeyid = "{kid}"\npublic_key = "{public_key_hex(pub)}"\n'
                    f'owner = "tests"\ntiers = {tiers!r}\n'.replace("'", '"'))
    return kid


def build(tmp: Path, *, tier: str = "full", hardware: str = "sm_90", sign: bool = True,
          trust_tiers: list[str] | None = None, spec_rel: str = SPEC_REL, repo: Path | None = None) -> Built:
    """A repo (or ``repo``, already made), a bundle of a passing run of ``spec_rel`` for ``tier``
    on ``hardware``, a key pair and a trust policy listing it (for ``trust_tiers``); signed
    unless ``sign`` is false."""
    repo = repo or make_repo(tmp / "repo")
    spec_path = repo / spec_rel
    plan = build_plan(load_spec(spec_path), tier).to_json()
    rows = make_rows(plan)
    env = environment.capture(["fastpath", "verify", "--tier", tier], {"global": 0}, repo)
    env["hardware"] = hardware
    env["gpu"] = None if hardware == "cpu" else {"devices": [{"name": "Toy GPU", "arch": hardware}],
                                                 "driver": "0", "cuda": "0"}
    logs = tmp / "logs"
    logs.mkdir(parents=True)
    (logs / "pytest.log").write_text("collected 3 items\n")
    priv, pub, _ = generate_keypair(tmp / "keys" / "k.key", tmp / "keys" / "k.pub")
    trust = tmp / "trusted_keys.toml"
    kid = write_trust(trust, pub, trust_tiers or ["smoke", "full"])
    bundle = write_bundle(tmp / "out" / "toy.fastpath", spec_path=spec_path, plan=plan, rows=rows,
                          summary=gate_summary(rows, tier, spec_path, plan), environment=env, logs_dir=logs,
                          report_html="<html>toy</html>", attested=attested_parts(repo, load_spec(spec_path)),
                          sign=(lambda d: sign_bundle(d, priv)) if sign else None)
    return Built(repo, spec_path, bundle, priv, pub, trust, kid)
