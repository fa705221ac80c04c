"""The pytest plugin: parametrization from the plan, fixtures, and outcome -> row rules."""

import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from fastpath.results import read_rows

DOUBLES = Path(__file__).parent / "doubles" / "stub"
SPEC = DOUBLES / "spec.toml"


def run_suite(tmp_path: Path, body: str, suite: str = "coverage", *extra: str) -> tuple[int, list[dict]]:
    """Run ``body`` as a suite module under the plugin; return pytest's exit code and the rows."""
    name = f"test_{suite}_{uuid.uuid4().hex[:8]}"  # unique: pytest caches modules by name
    tmp_path.mkdir(parents=True, exist_ok=True)
    module = tmp_path / f"{name}.py"
    module.write_text("import pytest\n" + textwrap.dedent(body))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    rows = tmp_path / "rows.jsonl"
    before = set(sys.modules)
    code = pytest.main([str(module), "-c", str(tmp_path / "pytest.ini"), "--rootdir", str(tmp_path),
                        "-p", "fastpath.pytest_plugin", "-p", "no:cacheprovider", "-q", "--capture=sys",
                        "--import-mode=importlib", "--fastpath-spec", str(SPEC), "--fastpath-tier", "smoke",
                        "--fastpath-rows", str(rows), "--fastpath-suite", suite, *extra])
    for mod in set(sys.modules) - before:
        if name in mod:
            del sys.modules[mod]
    return int(code), read_rows(rows)


def test_parametrized_from_plan_and_record(tmp_path):
    code, rows = run_suite(tmp_path, """
        @pytest.mark.fastpath(kind="decode", gate="coverage_fast_path_fired")
        def test_it(case, record, fp_spec, fp_tier):
            assert fp_spec.name == "double" and fp_tier.name == "smoke"
            ok = record("coverage_fast_path_fired", "batch", case["config"]["batch"], threshold=2, comparator="<=")
            assert ok == (case["config"]["batch"] <= 2)
    """)
    assert code == 0
    assert [(r["case_id"], r["status"], r["batch"], r["context"]) for r in rows] == [
        ("coverage/decode/b1-c16-d0", "pass", 1, 16), ("coverage/decode/b4-c16-d0", "fail", 4, 16)]


# suite tests that record one passing row per case of their kind
DECODE_TEST = """
    @pytest.mark.fastpath(kind="decode", gate="coverage_fast_path_fired")
    def test_decode(case, record):
        record("coverage_fast_path_fired", "ran", 1, threshold=1, comparator=">=")
"""
TWO_KINDS = DECODE_TEST + """
    @pytest.mark.fastpath(kind="fallback", gate="coverage_clean_fallback")
    def test_fallback(case, record):
        record("coverage_clean_fallback", "ran", 1, threshold=1, comparator=">=")
"""


def test_shards_split_the_suites_cases_between_them(tmp_path):
    body = TWO_KINDS
    _, whole = run_suite(tmp_path / "all", body)
    parts = [run_suite(tmp_path / f"s{i}", body, "coverage", "--fastpath-shard", f"{i}/2")[1] for i in range(2)]
    ids = [sorted(r["case_id"] for r in rows) for rows in parts]
    assert ids[0] and ids[1] and not set(ids[0]) & set(ids[1])
    assert sorted(ids[0] + ids[1]) == sorted(r["case_id"] for r in whole)
    code, _ = run_suite(tmp_path / "bad", body, "coverage", "--fastpath-shard", "2/2")
    assert code == 4  # a usage error: I must be below N


def test_shards_with_a_claims_folder_share_the_cases_out_as_they_go(tmp_path):
    """With --fastpath-claims a shard runs every case no other shard claimed first: a shard that
    finds half the cases claimed (another shard is busy on them) runs the rest, and a shard
    that starts after all were claimed runs none."""
    from fastpath.pytest_plugin import claim_name

    body = TWO_KINDS
    _, whole = run_suite(tmp_path / "all", body)
    every = [r["case_id"] for r in whole]
    claims = tmp_path / "claims"
    claims.mkdir()
    taken = every[::2]  # as if shard 0 of 2 were running these
    for case_id in taken:
        (claims / claim_name(case_id)).write_text("0/2\n")
    code, rows = run_suite(tmp_path / "s1", body, "coverage", "--fastpath-shard", "1/2", "--fastpath-claims", str(claims))
    assert code == 0 and sorted(r["case_id"] for r in rows) == sorted(set(every) - set(taken))
    assert sorted(p.name for p in claims.iterdir()) == sorted(claim_name(c) for c in every)
    assert all((claims / claim_name(c)).read_text() == "1/2\n" for c in set(every) - set(taken))
    code, rows = run_suite(tmp_path / "s0", body, "coverage", "--fastpath-shard", "0/2", "--fastpath-claims", str(claims))
    assert code == 0 and rows == []  # every case claimed: nothing ran here


def test_the_retry_runs_the_released_cases_and_not_the_helper_tests(tmp_path):
    """The suite's retry (--fastpath-retry, after its shards) runs the cases still unclaimed and
    none of the helper tests, which ran in shard 0; a lone shard with claims that is not the retry
    runs them; --fastpath-retry without a claims folder is a usage error."""
    body = DECODE_TEST + """
    def test_helper(tmp_path_factory):
        raise AssertionError("a helper test ran")
"""
    claims = tmp_path / "claims"
    claims.mkdir()
    code, rows = run_suite(tmp_path / "retry", body, "coverage", "--fastpath-claims", str(claims), "--fastpath-retry")
    assert code == 0 and rows and all(r["case_id"].startswith("coverage/decode/") for r in rows)
    code, rows = run_suite(tmp_path / "lone", body, "coverage", "--fastpath-claims", str(tmp_path / "other"))
    assert code == 1 and [r["case_id"] for r in rows if "a helper test ran" in r["message"]] == ["coverage/test/test_helper"]
    code, _ = run_suite(tmp_path / "bad", body, "coverage", "--fastpath-retry")
    assert code == 4


def test_a_case_is_claimed_by_one_shard_only():
    import tempfile

    from fastpath.pytest_plugin import FastpathSession

    with tempfile.TemporaryDirectory() as tmp:
        shards = [FastpathSession.__new__(FastpathSession) for _ in range(3)]
        for i, shard in enumerate(shards):
            shard.shard, shard.claims = (i, 3), Path(tmp) / "claims"
        won = [[s.claim(f"kernels/kernel/k{j}") for s in shards] for j in range(4)]
        assert all(w.count(True) == 1 for w in won)
        assert won[0] == [True, False, False]


def test_a_kind_the_plan_has_no_case_of_is_not_an_item(tmp_path):
    """A suite test of a kind the plan never makes (a spec without that gate) is parametrized with
    an empty set: it is deselected, not an internal error, in one process and in shards alike."""
    body = DECODE_TEST + """
    @pytest.mark.fastpath(kind="no_such_kind", gate="coverage_fast_path_fired")
    def test_never_planned(case, record):
        raise AssertionError("no case of this kind exists")
"""
    for extra in ((), ("--fastpath-shard", "0/2"), ("--fastpath-shard", "1/2")):
        code, rows = run_suite(tmp_path / "-".join(extra or ("one",)).replace("/", "of"), body, "coverage", *extra)
        assert code == 0 and all(r["case_id"].startswith("coverage/decode/") for r in rows), (extra, rows)


def test_exception_becomes_error_row_with_traceback_tail(tmp_path):
    code, rows = run_suite(tmp_path, """
        @pytest.mark.fastpath(kind="fallback", gate="coverage_clean_fallback")
        def test_it(case):
            raise RuntimeError("engine exploded at " + case["case_id"])
    """)
    assert code == 1
    assert [r["status"] for r in rows] == ["error", "error"]
    assert rows[0]["gate"] == "coverage_clean_fallback"
    assert "RuntimeError" in rows[0]["message"] and "engine exploded at coverage/fallback/prefill" in rows[0]["message"]


def test_failed_assertion_without_failing_row_becomes_fail_row(tmp_path):
    code, rows = run_suite(tmp_path, """
        @pytest.mark.fastpath(kind="fallback", gate="coverage_clean_fallback")
        def test_it(case, record):
            record("coverage_clean_fallback", "x", 1, passed=True)
            assert case["config"]["fallback"] == "prefill", "wrong step"
    """)
    assert code == 1
    assert [(r["case_id"], r["status"], r["metric"]) for r in rows] == [
        ("coverage/fallback/prefill", "pass", "x"),
        ("coverage/fallback/mixed", "pass", "x"), ("coverage/fallback/mixed", "fail", "assertion")]
    assert "wrong step" in rows[-1]["message"]


def test_failed_assertion_after_failing_row_adds_nothing(tmp_path):
    code, rows = run_suite(tmp_path, """
        @pytest.mark.fastpath(kind="fallback")
        def test_it(case, record):
            assert record("coverage_clean_fallback", "x", 0, threshold=1, comparator=">=")
    """)
    assert code == 1
    assert [r["status"] for r in rows] == ["fail", "fail"] and {r["metric"] for r in rows} == {"x"}


def test_skip_without_waiver_becomes_waiver_row_and_waive_writes_one(tmp_path):
    code, rows = run_suite(tmp_path, """
        @pytest.mark.fastpath(kind="fallback", gate="coverage_clean_fallback")
        def test_it(case, waive):
            if case["config"]["fallback"] == "prefill":
                pytest.skip("no prefill on this box")
            waive("coverage_clean_fallback", "mixed batches not built yet")
    """)
    assert code == 0
    assert [(r["status"], r["message"]) for r in rows] == [
        ("waived", "skipped without a waiver: no prefill on this box"),
        ("waived", "mixed batches not built yet")]


def test_plan_waived_cases_skip_with_plan_reason(tmp_path):
    code, rows = run_suite(tmp_path, """
        @pytest.mark.fastpath(kind="profiler", gate="coverage_profiler_kernels")
        def test_it(case):
            raise AssertionError("must not run: the plan waives profiler cases on smoke")
    """)
    assert code == 0
    assert [r["status"] for r in rows] == ["waived", "waived"]
    assert all(r["gate"] == "coverage_profiler_kernels" and "CUDA GPU" in r["message"] for r in rows)


def test_gateless_error_and_silent_pass_are_not_lost(tmp_path):
    code, rows = run_suite(tmp_path, """
        @pytest.mark.fastpath(kind="decode")
        def test_raises(case):
            raise ValueError("x")

        @pytest.mark.fastpath(kind="fallback", gate="coverage_clean_fallback")
        def test_records_nothing(case):
            pass
    """)
    by_metric = {}
    for r in rows:
        by_metric.setdefault(r["metric"], []).append(r)
    assert {r["gate"] for r in by_metric["exception"]} == {""}
    assert "names no gate" in by_metric["exception"][0]["message"]
    assert [r["status"] for r in by_metric["result"]] == ["error", "error"]
    assert "recorded no row" in by_metric["result"][0]["message"]


def test_engine_models_and_gate_fixtures(tmp_path):
    code, rows = run_suite(tmp_path, """
        @pytest.mark.fastpath(kind="kernel", gate="kernels_noise_floor")
        def test_it(case, fp_engine, fp_models, fp_gate, record):
            assert fp_models["fast"] is fp_models["fast"]  # loaded once
            assert fp_engine.loads == ["fast"]
            assert fp_gate("kernels_noise_floor")["atol"] == 1e-6
            with pytest.raises(KeyError, match="not in the spec"):
                fp_gate("nope")
            record("kernels_noise_floor", "ok", 1, passed=True, kernel="double_scale")
    """, suite="kernels")
    assert code == 0, rows
    assert [(r["case_id"], r["kernel"], r["dtype"]) for r in rows] == [
        ("kernels/kernel/registry-float32", "double_scale", "float32")]


def _spec_with_suite_options(tmp_path: Path) -> Path:
    text = SPEC.read_text().replace('engine_options = { mode = "good", dtype = "float32" }',
                                    'engine_options = { mode = "good", dtype = "float32" }\n'
                                    'suite_engine_options = { coverage = { model = "trained" } }')
    path = tmp_path / "spec.toml"
    path.write_text(text)
    return path


def test_a_suite_gets_its_own_engine_options_and_the_plan_records_them(tmp_path, monkeypatch):
    from fastpath.plan import Plan, build_plan
    from fastpath.spec import load_spec

    spec = load_spec(_spec_with_suite_options(tmp_path))
    tier = spec.tier("smoke")
    assert tier.engine_options_for("coverage") == {"mode": "good", "dtype": "float32", "model": "trained"}
    assert tier.engine_options_for("kernels") == tier.engine_options_for(None) == {"mode": "good", "dtype": "float32"}
    plan = build_plan(spec, "smoke")
    assert plan.to_json()["engine_options"] == {"coverage": tier.engine_options_for("coverage")}
    assert Plan.from_json(plan.to_json()).engine_options == plan.engine_options
    assert "engine_options" not in build_plan(load_spec(SPEC), "smoke").to_json()  # unchanged without them
    monkeypatch.setattr(sys.modules[__name__], "SPEC", spec.path)
    body = """
        @pytest.mark.fastpath(kind="{kind}", gate="{gate}")
        def test_it(case, record, fp_engine):
            record("{gate}", "model_option", 1.0 if str(fp_engine.options.get("model")) == "{want}" else 0.0,
                   threshold=1.0, comparator=">=")
    """
    for suite, kind, gate, want in (("coverage", "decode", "coverage_fast_path_fired", "trained"),
                                    ("kernels", "kernel", "kernels_noise_floor", "None")):
        run_dir = tmp_path / suite
        run_dir.mkdir()
        text = body.replace("{kind}", kind).replace("{gate}", gate).replace("{want}", want)
        code, rows = run_suite(run_dir, text, suite=suite)
        assert rows and all(r["suite"] == suite and r["status"] == "pass" for r in rows), (suite, rows[:1])


def test_a_bad_dtype_in_suite_engine_options_names_its_key(tmp_path):
    from fastpath.errors import SpecError
    from fastpath.spec import load_spec

    path = _spec_with_suite_options(tmp_path)
    path.write_text(path.read_text().replace('model = "trained"', 'dtype = "bf16"'))
    with pytest.raises(SpecError, match=r"tiers\.smoke\.suite_engine_options\.coverage\.dtype: 'bf16' is not allowed"):
        load_spec(path)
    path.write_text(path.read_text().replace("coverage = {", "speed = {"))
    with pytest.raises(SpecError, match="unknown key 'speed'"):
        load_spec(path)


def _spec_with_a_coverage_variant(tmp_path: Path, variant: str = 'trained = { engine_options = { model = "trained" }, '
                                  'batch_sizes = [2] }') -> Path:
    text = SPEC.read_text().replace('engine_options = { mode = "good", dtype = "float32" }',
                                    'engine_options = { mode = "good", dtype = "float32" }\n'
                                    f'coverage_variants = {{ {variant} }}')
    path = tmp_path / "spec.toml"
    path.write_text(text)
    return path


def test_a_coverage_variant_adds_its_cases_and_they_run_on_its_engine(tmp_path, monkeypatch):
    """Coverage cases again, over the variant's slice of the scope, ids ending in @NAME, run by
    fp_case_engine on an engine made with the variant's options; the tier's own cases keep
    theirs, and the plan records both."""
    from fastpath.plan import build_plan
    from fastpath.spec import load_spec

    spec = load_spec(_spec_with_a_coverage_variant(tmp_path))
    tier = spec.tier("smoke")
    assert tier.engine_options_for("coverage", "trained") == {"mode": "good", "dtype": "float32", "model": "trained"}
    assert tier.coverage_variant("trained").scope["batch_sizes"] == [2] and tier.scope["batch_sizes"] == [1, 4]
    plan = build_plan(spec, "smoke")
    assert [c.case_id for c in plan.cases if c.suite == "coverage"] == [
        "coverage/decode/b1-c16-d0", "coverage/decode/b4-c16-d0", "coverage/fallback/prefill",
        "coverage/fallback/mixed", "coverage/decode/b2-c16-d0@trained", "coverage/fallback/prefill@trained",
        "coverage/fallback/mixed@trained"]
    assert [w.case.case_id for w in plan.waivers] == [  # the profiler runs on the full tier only
        "coverage/profiler/b1-c16-d0", "coverage/profiler/b4-c16-d0", "coverage/profiler/b2-c16-d0@trained"]
    assert plan.to_json()["engine_options"] == {"coverage@trained": tier.engine_options_for("coverage", "trained")}
    monkeypatch.setattr(sys.modules[__name__], "SPEC", spec.path)
    code, rows = run_suite(tmp_path / "run", """
        @pytest.mark.fastpath(kind="decode", gate="coverage_fast_path_fired")
        def test_it(case, record, fp_case_engine, fp_case_models):
            want = "trained" if case["config"].get("variant") == "trained" else None
            assert fp_case_models["fast"] is fp_case_models["fast"]
            record("coverage_fast_path_fired", "model_option", 1.0 if fp_case_engine.options.get("model") == want
                   else 0.0, threshold=1.0, comparator=">=")
    """)
    assert code == 0, rows
    assert [(r["case_id"], r["status"]) for r in rows] == [
        ("coverage/decode/b1-c16-d0", "pass"), ("coverage/decode/b4-c16-d0", "pass"),
        ("coverage/decode/b2-c16-d0@trained", "pass")]


@pytest.mark.parametrize("variant, error", [
    ('Trained = { engine_options = { model = "x" } }', r"'Trained' is not a valid variant name"),
    ('trained = { batch_sizes = [2] }', r"coverage_variants\.trained.*engine_options"),
    ('trained = { engine_options = { dtype = "bf16" } }', r"coverage_variants\.trained\.engine_options\.dtype"),
    ('trained = { engine_options = {}, context_lengths = [128] }', r"128 exceeds the tier's max_context = 64"),
])
def test_a_bad_coverage_variant_names_its_key(tmp_path, variant, error):
    from fastpath.errors import SpecError
    from fastpath.spec import load_spec

    with pytest.raises(SpecError, match=error):
        load_spec(_spec_with_a_coverage_variant(tmp_path, variant))


def test_parity_sequences_come_from_the_provider_the_gate_names():
    from fastpath import suite_helpers as H
    from optimized_model.k3.tokenizer import K3Tokenizer

    tok = K3Tokenizer()
    ids = H.sequence_prompt_ids(tok, 3, 40, "stub.engine:document_ids")
    assert len(ids) == 40 and tok.decode(ids).startswith("document 3: lorem")
    assert H.sequence_prompt_ids(tok, 3, 40) == H.prompt_ids(tok, 3, 40)
    with pytest.raises(ValueError, match="must return exactly n_tokens"):
        H.sequence_prompt_ids(tok, 3, 10000, "stub.engine:document_ids")
