"""Plan expansion: Cartesian product of the tier's scope, waivers with reasons, JSON round trip."""

import json
from pathlib import Path

from typer.testing import CliRunner

from fastpath.cli import app
from fastpath.plan import Plan, build_plan
from fastpath.spec import load_spec

DOUBLE_SPEC = Path(__file__).parent / "doubles" / "stub" / "spec.toml"
REAL_SPEC = Path(__file__).resolve().parents[1] / "optimized_model" / "k3" / "fastpath.toml"


def spec_with(tmp_path, *edits):
    text = DOUBLE_SPEC.read_text()
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new, 1)
    path = tmp_path / "fastpath.toml"
    path.write_text(text)
    return load_spec(path)


def ids(cases):
    return [c.case_id for c in cases]


def test_smoke_plan_of_double_spec():
    plan = build_plan(load_spec(DOUBLE_SPEC), "smoke")
    assert plan.suites == ["coverage", "kernels"]
    cases, waivers = plan.for_suite("coverage")
    assert ids(cases) == ["coverage/decode/b1-c16-d0", "coverage/decode/b4-c16-d0",
                          "coverage/fallback/prefill", "coverage/fallback/mixed"]
    assert ids(w.case for w in waivers) == ["coverage/profiler/b1-c16-d0", "coverage/profiler/b4-c16-d0"]
    assert all("CUDA GPU" in w.reason for w in waivers)
    assert ids(plan.for_suite("kernels")[0]) == ["kernels/kernel/registry-float32"]
    assert plan.for_suite("kernels")[0][0].config == {"kernel": None, "dtype": "float32"}


def test_full_plan_uses_whole_scope_and_runs_profiler():
    plan = build_plan(load_spec(DOUBLE_SPEC), "full")
    decode = [c for c in plan.cases if c.kind == "decode"]
    assert len(decode) == 3 * 2  # scope batch_sizes x context_lengths
    assert {(c.config["batch"], c.config["context"]) for c in decode} == {(b, c) for b in (1, 2, 4) for c in (16, 32)}
    assert len([c for c in plan.cases if c.kind == "profiler"]) == 6
    assert plan.waivers == []
    assert ids(plan.for_suite("kernels")[0]) == ["kernels/kernel/registry-bfloat16"]


def test_explicit_kernel_names_times_dtypes(tmp_path):
    spec = spec_with(tmp_path, ("[tiers.smoke]", "[kernels]\nnames = [\"gemv\", \"kda\"]\n\n[tiers.smoke]"),
                     ("dtype = \"float32\" }", "dtype = \"float32\" }\ndtypes = [\"float32\", \"float16\"]"))
    cases = build_plan(spec, "smoke").for_suite("kernels")[0]
    assert ids(cases) == ["kernels/kernel/gemv-float32", "kernels/kernel/gemv-float16",
                          "kernels/kernel/kda-float32", "kernels/kernel/kda-float16",
                          "kernels/kernel/unnamed-float32", "kernels/kernel/unnamed-float16"]
    assert cases[3].config == {"kernel": "kda", "dtype": "float16"}
    # a list splits the suite, it never narrows it: the rest of the registry is one more case
    assert cases[5].config == {"kernel": None, "except": ["gemv", "kda"], "dtype": "float16"}


def test_pruning_rules_become_waivers_not_drops(tmp_path):
    spec = spec_with(tmp_path, ("context_lengths = [16]", "context_lengths = [16]\ndraft_lengths = [0, 2]\nmax_context = 17"))
    plan = build_plan(spec, "smoke")
    waived = {w.case.case_id: w.reason for w in plan.waivers}
    assert "speculative_decoding is false" in waived["coverage/decode/b1-c16-d2"]
    assert "coverage/decode/b1-c16-d0" in ids(plan.cases)
    # every combination is accounted for: 2 batches x 1 context x 2 drafts, decode + profiler
    decode_like = [i for i in plan.all_case_ids() if "/decode/" in i or "/profiler/" in i]
    assert len(decode_like) == 8


def test_context_over_tier_max_is_waived(tmp_path):
    spec = spec_with(tmp_path, ("context_lengths = [16]", "context_lengths = [16, 32]\nmax_context = 20"))
    waived = {w.case.case_id: w.reason for w in build_plan(spec, "smoke").waivers}
    assert "max_context" in waived["coverage/decode/b1-c32-d0"]


def test_plan_json_round_trip():
    plan = build_plan(load_spec(REAL_SPEC), "smoke")
    data = json.loads(json.dumps(plan.to_json()))
    # engine_options: the smoke tier's coverage variant on the trained config
    assert set(data) == {"schema", "spec", "spec_digest", "tier", "suites", "cases", "waivers", "engine_options"}
    assert list(data["engine_options"]) == ["coverage@trained"]
    assert set(data["cases"][0]) == {"suite", "kind", "case_id", "config"}
    assert data["waivers"][0]["reason"]
    again = Plan.from_json(data)
    assert again.to_json() == data
    assert len(set(plan.all_case_ids())) == len(plan.all_case_ids())  # case ids are unique


def test_real_spec_features_and_parity():
    plan = build_plan(load_spec(REAL_SPEC), "smoke")
    assert ids(plan.for_suite("parity")[0]) == ["parity/parity/c16", "parity/parity/c64"]
    feats = ids(plan.for_suite("features")[0])
    assert "features/structured/json_schema-sampled" in feats and "features/masks/top_p" in feats


def test_cli_plan_table_and_json():
    runner = CliRunner()
    result = runner.invoke(app, ["plan", str(DOUBLE_SPEC), "--tier", "smoke"])
    assert result.exit_code == 0, result.output
    assert "coverage/profiler/b4-c16-d0" in result.output and "needs a CUDA GPU" in result.output
    result = runner.invoke(app, ["plan", str(DOUBLE_SPEC), "--tier", "full", "--json"])
    assert result.exit_code == 0
    assert json.loads(result.output)["tier"] == "full"


def test_cli_plan_errors_have_cause_and_fix_without_traceback(tmp_path):
    result = CliRunner().invoke(app, ["plan", str(tmp_path / "missing.toml")])
    assert result.exit_code == 2
    assert "error:" in result.output and "fix:" in result.output and "Traceback" not in result.output
    result = CliRunner().invoke(app, ["plan", str(DOUBLE_SPEC), "--tier", "medium"])
    assert result.exit_code == 2 and "'medium' is not one of 'smoke', 'full'" in result.output  # a usage error


def test_cli_plan_defaults_to_the_projects_spec(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text('[tool.fastpath]\ndefault_spec = "spec.toml"\n')
    (tmp_path / "spec.toml").write_text(DOUBLE_SPEC.read_text())
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["plan", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["cases"] == build_plan(load_spec(DOUBLE_SPEC), "smoke").to_json()["cases"]


def test_every_declared_fallback_of_the_real_spec_is_a_coverage_case(tmp_path):
    """context_out_of_scope is declared like the others; its case drives a context past
    features.max_context (the dispatch's limit), at an in-scope batch."""
    spec = load_spec(REAL_SPEC)
    cases = {c.case_id: c for c in build_plan(spec, "smoke").for_suite("coverage")[0] if c.kind == "fallback"}
    assert set(cases) == {f"coverage/fallback/{s}{v}" for s in
                          ("prefill", "mixed", "batch_out_of_scope", "context_out_of_scope", "verify_rows")
                          for v in ("", "@trained")}  # the trained config's coverage variant too
    cfg = cases["coverage/fallback/context_out_of_scope"].config
    assert cfg["reason"] == "context_out_of_scope" and cfg["batch"] in spec.scope["batch_sizes"]
    assert cfg["out_of_scope_context"] == spec.features["max_context"] + 1


def test_perf_cases_cover_the_scope_on_full_and_the_smallest_batch_on_smoke(tmp_path):
    spec = load_spec(REAL_SPEC)
    cases, waivers = build_plan(spec, "full").for_suite("perf")
    speed = [c for c in cases if c.kind == "speedup"]
    shapes = {(c.config["batch"], c.config["context"], c.config["draft"]) for c in speed}
    # draft 0 everywhere; a draft where batch x (draft + 1) <= 64 rows and context + draft fits
    assert shapes == {(b, c, d) for b in (1, 2, 4, 8, 16, 32, 64) for c in (1024, 8192, 32768) for d in (0, 3, 7)
                      if d == 0 or (b * (d + 1) <= 64 and c < 32768)}
    assert len(speed) == 21 + 10 + 8
    waived = {(w.case.config["batch"], w.case.config["draft"]): w.reason for w in waivers}
    assert "max_verify_rows" in waived[(32, 3)] and "verify_rows_out_of_scope" in waived[(16, 7)]
    assert len(waivers) == 7 * 3 * 3 - len(speed)
    prompts = [f"perf/prompts/{p}-b{b}" for p in ("mrcr-c1024", "mrcr-c32768", "aime25") for b in (1, 4)]
    assert [c.case_id for c in cases if c.kind != "speedup"] == ["perf/control/b1-c1024-d0", *prompts,
                                                                  "perf/summary/table"]
    cases, waivers = build_plan(spec, "smoke").for_suite("perf")
    assert ids(cases) == ["perf/speedup/b1-c16-d0", "perf/speedup/b1-c16-d3", "perf/speedup/b1-c64-d0",
                          "perf/control/b1-c16-d0", "perf/prompts/mrcr-c512-b1", "perf/prompts/mrcr-c2048-b1",
                          "perf/prompts/aime25-b1", "perf/summary/table"]
    speed_waivers = [w for w in waivers if w.case.kind == "speedup"]
    assert sorted((w.case.config["batch"], w.case.config["draft"]) for w in speed_waivers) == [
        (1, 3), (2, 0), (2, 0), (2, 3), (2, 3), (4, 0), (4, 0), (4, 3), (4, 3)]
    assert all("smallest batch only" in w.reason or "max_context" in w.reason for w in speed_waivers)


def test_prompt_cases_decode_on_the_named_suites_engine(tmp_path):
    """[perf] prompt_decode: cases at the tier's smallest and largest MRCR bucket and on AIME per
    batch size, on the engine of the suite it names (recorded in the plan where that engine has
    options of its own); a batch beyond the tier's documents is a waiver; no table, no cases."""
    spec = load_spec(REAL_SPEC)
    plan = build_plan(spec, "full")
    prompts = [c for c in plan.cases if c.kind == "prompts"]
    assert {c.config["engine_suite"] for c in prompts} == {"evals"}
    assert plan.engine_options["perf@prompts"] == plan.engine_options["evals"]
    assert plan.engine_options["evals"]["config"] == "trained"
    assert [(c.config["task"], c.config["bucket"]) for c in prompts if c.config["batch"] == 1] == [
        ("mrcr", 1024), ("mrcr", 32768), ("aime25", None)]
    smoke = build_plan(spec, "smoke")
    assert "perf@prompts" not in smoke.engine_options  # the smoke tier's evals run on its own engine
    assert {w.case.case_id for w in smoke.waivers if w.case.kind == "prompts"} == {
        "perf/prompts/mrcr-c512-b4", "perf/prompts/mrcr-c2048-b4", "perf/prompts/aime25-b4"}
    text = REAL_SPEC.read_text()
    line = next(x for x in text.splitlines() if x.startswith("prompt_decode = "))
    bare = tmp_path / "bare.toml"
    bare.write_text(text.replace(line + "\n", ""))
    assert not [c for c in build_plan(load_spec(bare), "full").cases if c.kind == "prompts"]


def test_perf_draft_without_spec_decode_is_waived(tmp_path):
    spec = spec_with(tmp_path, ("context_lengths = [16, 32]", "context_lengths = [16, 32]\ndraft_lengths = [0, 2]"),
                     ("[gates.coverage_fast_path_fired]", "[gates.perf_speedup]\nsuite = \"perf\"\n\n"
                                                           "[gates.coverage_fast_path_fired]"))
    _, waivers = build_plan(spec, "full").for_suite("perf")
    assert waivers and all(w.case.config["draft"] == 2 and "speculative_decoding" in w.reason for w in waivers)


# perf needs a declared acceptance length for every draft length in scope (spec.py)
ACCEPTANCE = ("[gates]\n", "[perf]\nsynthetic_acceptance_length = { 1 = 1.5, 3 = 3.0 }\n\n[gates]\n")


def test_verify_steps_over_max_verify_rows_are_waived_with_the_fallback_named(tmp_path):
    spec = spec_with(tmp_path, ("context_lengths = [16, 32]", "context_lengths = [16, 32]\ndraft_lengths = [0, 1, 3]\n"
                                "max_verify_rows = 8"),
                     ("max_context = 64", "max_context = 64\nspeculative_decoding = true"), ACCEPTANCE)
    plan = build_plan(spec, "full")
    waived = {w.case.case_id: w.reason for w in plan.waivers}
    # batch 4 x (3 + 1) = 16 rows > 8: waived on decode and profiler alike; 4 x 2 = 8 and 2 x 4 = 8 run
    for cid in ("coverage/decode/b4-c16-d3", "coverage/profiler/b4-c32-d3"):
        assert "max_verify_rows" in waived[cid] and "verify_rows_out_of_scope" in waived[cid], cid
    assert {"coverage/decode/b4-c16-d1", "coverage/decode/b2-c32-d3"} <= set(ids(plan.cases))
    assert not any("max_verify_rows" in r for cid, r in waived.items() if "-d0" in cid)
    # no limit declared: nothing is waived for rows
    spec = spec_with(tmp_path, ("context_lengths = [16, 32]", "context_lengths = [16, 32]\ndraft_lengths = [0, 3]"),
                     ("max_context = 64", "max_context = 64\nspeculative_decoding = true"), ACCEPTANCE)
    assert not any("max_verify_rows" in w.reason for w in build_plan(spec, "full").waivers)


def test_real_spec_drafts_on_both_tiers(tmp_path):
    spec = load_spec(REAL_SPEC)
    assert spec.scope["draft_lengths"] == [0, 3, 7] and spec.scope["max_verify_rows"] == 64
    assert spec.features["speculative_decoding"] is True
    assert spec.tier("smoke").scope["draft_lengths"] == [0, 3]
    smoke = build_plan(spec, "smoke")
    decode = [c.case_id for c in smoke.cases if c.kind == "decode"]
    # the smoke tier verifies one draft, at the smallest batch (context 64 + 3 > max_context 64);
    # its trained-config variant one shape without
    assert [i for i in decode if "-d0" not in i] == ["coverage/decode/b1-c16-d3"]
    assert [i for i in decode if i.endswith("@trained")] == ["coverage/decode/b1-c16-d0@trained"]
    reasons = {w.case.case_id: w.reason for w in smoke.waivers}
    assert "smallest batch only" in reasons["coverage/decode/b2-c16-d3"]
    fallback = next(c for c in smoke.cases if c.case_id == "coverage/fallback/verify_rows").config
    assert fallback["reason"] == "verify_rows_out_of_scope"
    assert (fallback["draft"], fallback["out_of_scope_batch"]) == (3, 17)  # 68 rows > 64, 16 x 4 = 64 would run
    full = build_plan(spec, "full")
    runs = {(c.config["batch"], c.config["draft"]) for c in full.cases if c.kind == "decode"}
    # 64 rows: draft 3 up to batch 16, draft 7 up to batch 8; the batch 16 at draft 7
    # (128 rows) is past the tables: waived with the fallback named
    assert (16, 3) in runs and (8, 7) in runs and (16, 7) not in runs and (32, 3) not in runs
    full_reasons = {w.case.case_id: w.reason for w in full.waivers}
    assert "exceed scope.max_verify_rows" in full_reasons["coverage/decode/b16-c1024-d7"]
    assert "exceed scope.max_verify_rows" in full_reasons["coverage/profiler/b16-c1024-d7"]
