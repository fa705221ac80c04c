"""The evals cases of the plan come from the spec's [evals] table; its errors name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastpath.errors import SpecError
from fastpath.plan import build_plan
from fastpath.spec import EVALS_DEFAULTS, load_spec

REAL_SPEC = Path(__file__).resolve().parent.parent / "optimized_model" / "k3" / "fastpath.toml"


def _spec(tmp_path: Path, old: str, new: str) -> Path:
    text = REAL_SPEC.read_text()
    assert old in text
    path = tmp_path / "fastpath.toml"
    path.write_text(text.replace(old, new))
    return path


def test_plan_has_a_case_per_mrcr_bucket_and_per_task():
    spec = load_spec(REAL_SPEC)
    for tier in ("smoke", "full"):
        cases = [c for c in build_plan(spec, tier).cases if c.suite == "evals"]
        buckets = spec.evals["mrcr"][tier]["buckets"]
        assert [c.case_id for c in cases] == [f"evals/mrcr/c{b}" for b in buckets] + ["evals/mrcr/all",
                                                                                      "evals/aime25/all"]
        assert [c.kind for c in cases] == ["bucket"] * len(buckets) + ["task", "task"]
        assert cases[-1].config["max_gen_toks"] == spec.evals["aime25"][tier]["max_gen_toks"]
    full = load_spec(REAL_SPEC).evals
    assert max(full["mrcr"]["full"]["buckets"]) >= 32768 and full["aime25"]["full"]["max_gen_toks"] >= 1024


def test_a_bucket_beyond_the_fast_paths_scope_is_a_waiver(tmp_path):
    spec = load_spec(_spec(tmp_path, "smoke = { buckets = [512, 2048]", "smoke = { buckets = [512, 65536]"))
    plan = build_plan(spec, "smoke")
    [w] = [w for w in plan.waivers if w.case.suite == "evals"]
    assert w.case.case_id == "evals/mrcr/c65536" and "features.max_context" in w.reason


def test_bad_evals_settings_name_the_key(tmp_path):
    with pytest.raises(SpecError, match=r"evals\.mrcr\.smoke\.buckets\[1\]: 1000 is not a power of two"):
        load_spec(_spec(tmp_path, "smoke = { buckets = [512, 2048]", "smoke = { buckets = [512, 1000]"))
    with pytest.raises(SpecError, match=r"evals\.aime25\.smoke\.max_gen_tok: unknown key"):
        load_spec(_spec(tmp_path, "smoke = { docs = 2, max_gen_toks = 3", "smoke = { docs = 2, max_gen_tok = 3"))
    with pytest.raises(SpecError, match=r"evals\.mrcr\.needles\[0\]: 3 is not allowed"):
        load_spec(_spec(tmp_path, "needles = [2, 4, 8]", "needles = [3]"))


def test_a_tier_table_overrides_only_the_keys_it_names(tmp_path):
    spec = load_spec(_spec(tmp_path, "smoke = { docs = 2, max_gen_toks = 3, steps = 3 }", "smoke = { docs = 5 }"))
    assert spec.evals["aime25"]["smoke"] == {**EVALS_DEFAULTS["aime25"]["smoke"], "docs": 5}
