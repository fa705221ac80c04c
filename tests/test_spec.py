"""Spec loading and validation: every error names file, key path, bad value, allowed values, line."""

from pathlib import Path

import pytest

from fastpath.errors import SpecError
from fastpath.spec import find_line, load_spec

ROOT = Path(__file__).resolve().parents[1]
DOUBLE_SPEC = Path(__file__).parent / "doubles" / "stub" / "spec.toml"
REAL_SPEC = ROOT / "optimized_model" / "k3" / "fastpath.toml"


def spec_with(tmp_path: Path, old: str, new: str) -> Path:
    text = DOUBLE_SPEC.read_text()
    assert old in text, old
    path = tmp_path / "fastpath.toml"
    path.write_text(text.replace(old, new, 1))
    return path


def error_of(path: Path) -> str:
    with pytest.raises(SpecError) as info:
        load_spec(path)
    return str(info.value)


def line_of(path: Path, needle: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line)


def test_real_spec_is_valid():
    spec = load_spec(REAL_SPEC)
    assert spec.name == "k3-mini-latency-specialized"
    assert spec.engine == "embedded"
    assert spec.suites() == ["coverage", "kernels", "parity", "features", "evals", "perf"]
    smoke = spec.tier("smoke")
    assert smoke.scope["batch_sizes"] == [1, 2, 4]
    assert smoke.scope["hardware"] == ["sm_90"]  # not overridden: inherited from [scope]
    assert smoke.dtypes == ["float16"]
    assert spec.gates.settings["kernels_noise_floor"]["k"] == 2.0
    assert len(spec.digest) == 64


def test_double_spec_defaults_and_digest(tmp_path):
    spec = load_spec(DOUBLE_SPEC)
    assert spec.scope["draft_lengths"] == [0] and spec.scope["tensor_parallel"] == [1]
    assert spec.engine == "stub.engine:StubEngine"
    changed = load_spec(spec_with(tmp_path, "name = \"double\"", "name = \"double2\""))
    assert changed.digest != spec.digest


def test_bad_list_item_names_index_value_and_line(tmp_path):
    path = spec_with(tmp_path, "batch_sizes = [1, 2, 4]", "batch_sizes = [1, 2, -4]")
    msg = error_of(path)
    assert f"{path}:{line_of(path, 'batch_sizes = [1, 2, -4]')}: scope.batch_sizes[2]" in msg
    assert "-4" in msg and ">= 1" in msg


def test_unknown_key_is_rejected_with_allowed_keys(tmp_path):
    path = spec_with(tmp_path, "max_context = 64", "max_context = 64\nmax_contxt = 64")
    msg = error_of(path)
    assert "features.max_contxt" in msg and "unknown key" in msg
    assert "max_context" in msg.split("allowed keys:")[1]
    assert f":{line_of(path, 'max_contxt')}:" in msg


def test_unknown_top_level_table(tmp_path):
    path = spec_with(tmp_path, "[switch]", "[swtich]\nkey = 1\n\n[switch]")
    assert "swtich: unknown key 'swtich'" in error_of(path)


def test_wrong_type_names_expected_type(tmp_path):
    msg = error_of(spec_with(tmp_path, "max_context = 64", "max_context = \"64\""))
    assert "features.max_context: '64' is string; expected an integer" in msg


def test_disallowed_value_lists_allowed_values(tmp_path):
    msg = error_of(spec_with(tmp_path, "suite = \"kernels\"", "suite = \"kernel\""))
    assert "gates.kernels_noise_floor.suite: 'kernel' is not allowed" in msg
    assert "'coverage', 'kernels', 'parity'" in msg


def test_inline_table_value_error_points_at_its_line(tmp_path):
    path = spec_with(tmp_path, "mixed = \"mixed_batch\"", "mixed = \"mixed\"")
    msg = error_of(path)
    assert f":{line_of(path, 'fallbacks =')}: scope.fallbacks.mixed: 'mixed' is not allowed" in msg
    assert "'mixed_batch'" in msg


def test_missing_required_key(tmp_path):
    msg = error_of(spec_with(tmp_path, "engine = \"stub.engine:StubEngine\"\n", ""))
    assert "fastpath.engine: required key is missing" in msg


def test_unknown_tier_and_bad_dtype(tmp_path):
    path = spec_with(tmp_path, "[tiers.full]", "[tiers.huge]")
    assert "tiers.huge: unknown key 'huge'; allowed keys: 'smoke', 'full'" in error_of(path)
    path = spec_with(tmp_path, "dtype = \"bfloat16\"", "dtype = \"bf16\"")
    assert "tiers.full.engine_options.dtype: 'bf16' is not allowed" in error_of(path)


def test_all_problems_reported_at_once(tmp_path):
    path = spec_with(tmp_path, "hardware = [\"sm_90\"]", "hardware = [\"sm90\"]\nbogus = true")
    msg = error_of(path)
    assert "2 problems" in msg and "scope.hardware[0]" in msg and "scope.bogus" in msg


def test_context_beyond_max_context(tmp_path):
    msg = error_of(spec_with(tmp_path, "context_lengths = [16, 32]", "context_lengths = [16, 128]"))
    assert "scope.context_lengths[1]: 128 exceeds features.max_context = 64" in msg


def test_toml_syntax_and_missing_file(tmp_path):
    bad = tmp_path / "x.toml"
    bad.write_text("[fastpath\nname = 1\n")
    assert "not valid TOML" in error_of(bad)
    err = pytest.raises(SpecError, load_spec, tmp_path / "nope.toml").value
    assert "does not exist" in err.cause and "default_spec" in err.fix


def test_undefined_tier_lookup():
    spec = load_spec(DOUBLE_SPEC)
    with pytest.raises(SpecError, match="tier 'medium' is not defined"):
        spec.tier("medium")


def test_find_line_prefers_deepest_match():
    text = "[a]\nx = 1\n[a.b]\nx = 2\ny = { z = 3 }\n"
    assert find_line(text, ["a", "x"]) == 2
    assert find_line(text, ["a", "b", "x"]) == 4
    assert find_line(text, ["a", "b", "y", "z"]) == 5
    assert find_line(text, ["nope"]) is None


def test_sources_validation_and_subject_are_schema_checked(tmp_path):
    ok = spec_with(tmp_path, 'globs = ["src/**/*.py"]', 'globs = ["src/**/*.py"]\nvalidation = ["suites/*.py"]\n'
                   'subject = ["model/*.py"]')
    s = load_spec(ok)
    assert (s.validation_globs, s.subject_globs, s.declared_sources) == (["suites/*.py"], ["model/*.py"],
                                                                         frozenset({"validation", "subject"}))
    assert load_spec(DOUBLE_SPEC).validation_globs is None  # defaults apply (fastpath.digest)
    bad = spec_with(tmp_path, 'globs = ["src/**/*.py"]', 'globs = ["src/**/*.py"]\nsubject = ["../outside/*.py"]')
    assert "sources.subject[0]: '../outside/*.py' is not valid; expected a relative glob inside the repository" in error_of(bad)
    bad = spec_with(tmp_path, 'globs = ["src/**/*.py"]', 'globs = ["src/**/*.py"]\nvalidation = []')
    assert "sources.validation: is empty" in error_of(bad)
    bad = spec_with(tmp_path, 'globs = ["src/**/*.py"]', 'globs = ["src/**/*.py"]\nweights = ["w.bin"]')
    assert "unknown key 'weights'; allowed keys: globs, validation, subject" in error_of(bad)


def test_real_spec_declares_all_three_source_sets():
    s = load_spec(REAL_SPEC)
    assert s.declared_sources == {"validation", "subject"}
    assert "optimized_model/k3/*.py" in s.subject_globs and "fastpath/**/*.py" in s.validation_globs


def test_perf_settings_default_and_validate(tmp_path):
    spec = load_spec(REAL_SPEC)
    assert spec.perf["rounds"] >= 10 and spec.perf["min_speedup"] == 1.0 and spec.perf["max_extra_batches"] == 1
    path = spec_with(tmp_path, "[gates]", "[perf]\nrounds = 5\nconfidence = 1.5\nbogus = 1\n\n[gates]")
    text = error_of(path)
    assert "perf.rounds: 5 is too small" in text and "perf.bogus: unknown key" in text
    path = spec_with(tmp_path, "[gates]", "[perf]\nconfidence = 1.0\n\n[gates]")
    assert "perf.confidence: 1.0 is too large; expected a number < 1" in error_of(path)
    from fastpath.spec import PERF_DEFAULTS

    assert load_spec(spec_with(tmp_path, "[gates]", "[perf]\nreplays = 7\n\n[gates]")).perf == {
        **PERF_DEFAULTS, "replays": 7}
    assert PERF_DEFAULTS["prompt_decode"] is None  # no prompt cases unless a spec asks
    path = spec_with(tmp_path, "[gates]", "[perf]\nprompt_decode = { engine = \"train\", batch_sizes = [0] }\n\n[gates]")
    text = error_of(path)
    assert "perf.prompt_decode.engine: 'train' is not allowed" in text and "perf.prompt_decode.batch_sizes[0]: 0 is too small" in text


def test_max_verify_rows_is_validated_and_tiers_narrow_draft_lengths(tmp_path):
    path = spec_with(tmp_path, "context_lengths = [16, 32]",
                     "context_lengths = [16, 32]\ndraft_lengths = [0, 3]\nmax_verify_rows = 0")
    err = error_of(path)
    assert f"{path}:{line_of(path, 'max_verify_rows')}: scope.max_verify_rows: 0 is too small" in err
    path = spec_with(tmp_path, "context_lengths = [16, 32]", "context_lengths = [16, 32]\nmax_verify_rows = 64")
    err = error_of(path)
    assert "scope.max_verify_rows: 64 is set but scope.draft_lengths has no draft > 0" in err
    path = spec_with(tmp_path, "context_lengths = [16, 32]",
                     "context_lengths = [16, 32]\ndraft_lengths = [0, 3, 7]\nmax_verify_rows = 64")
    spec = load_spec(path)
    assert spec.scope["max_verify_rows"] == 64
    assert load_spec(DOUBLE_SPEC).scope["max_verify_rows"] is None  # default: no limit declared
    real = load_spec(REAL_SPEC)
    assert real.tier("smoke").scope["draft_lengths"] == [0, 3] and real.tier("full").scope["draft_lengths"] == [0, 3, 7]
    # the fallback the coverage suite drives is a reason the trace may record
    path = spec_with(tmp_path, 'fallbacks = { prefill = "prefill", mixed = "mixed_batch" }',
                     'fallbacks = { prefill = "prefill", verify_rows = "verify_rows_out_of_scope" }')
    assert load_spec(path).scope["fallbacks"]["verify_rows"] == "verify_rows_out_of_scope"


def test_synthetic_acceptance_length_is_validated_and_keyed_by_draft(tmp_path):
    from fastpath.spec import acceptance_length

    drafts = "context_lengths = [16, 32]\ndraft_lengths = [0, 3, 7]"
    ok = spec_with(tmp_path, "context_lengths = [16, 32]", drafts)
    ok.write_text(ok.read_text().replace("[gates]\n", "[perf]\nsynthetic_acceptance_length = { 3 = 3.0, 7 = 6 }\n\n[gates]\n", 1))
    perf = load_spec(ok).perf
    assert perf["synthetic_acceptance_length"] == {3: 3.0, 7: 6.0}
    assert acceptance_length(perf, 0) == 1.0 and acceptance_length(perf, 7) == 6.0
    with pytest.raises(SpecError, match=r"draft length 5 has no \[perf\] synthetic_acceptance_length"):
        acceptance_length(perf, 5)
    bad = ok.read_text().replace("7 = 6 }", "7 = 9, x = 2, 1 = 0.5 }")
    ok.write_text(bad)
    text = error_of(ok)
    assert "perf.synthetic_acceptance_length.1: 0.5 is too small" in text
    ok.write_text(bad.replace(", 1 = 0.5", ""))
    text = error_of(ok)
    assert "perf.synthetic_acceptance_length.7: 9 is out of range; expected 1 <= acceptance length <= draft + 1 = 8" in text
    assert "perf.synthetic_acceptance_length.x: 'x' is not a draft length" in text
    # a draft length in scope (here only in a tier's slice) without one: perf could not count its tokens
    missing = spec_with(tmp_path, "batch_sizes = [1, 4]", "batch_sizes = [1, 4]\ndraft_lengths = [0, 3]")
    load_spec(missing)  # speculative decoding off: the plan prunes every draft case
    missing.write_text(missing.read_text().replace("max_context = 64", "max_context = 64\nspeculative_decoding = true", 1))
    assert ("perf.synthetic_acceptance_length: draft length 3 is in scope but has no acceptance length; "
            "add 3 = AL (1 <= AL <= 4)") in error_of(missing)


def test_a_named_set_of_engine_options_is_written_once_and_used_by_name(tmp_path):
    sets = '[engine_option_sets.trained]\nconfig = "trained"\nweights_sha256 = "ab"\n\n[tiers.smoke]'
    path = spec_with(tmp_path, "[tiers.smoke]", sets)
    text = path.read_text().replace('engine_options = { mode = "good", dtype = "bfloat16" }',
                                    'engine_options = { mode = "good", dtype = "bfloat16" }\n'
                                    'suite_engine_options.parity = { use = "trained", weights_sha256 = "cd" }\n'
                                    'coverage_variants.trained = { engine_options = { use = "trained" } }')
    path.write_text(text)
    full = load_spec(path).tier("full")
    # the set, then the map's own keys over it, then (as before) over the tier's engine_options
    assert full.engine_options_for("parity") == {"mode": "good", "dtype": "bfloat16", "config": "trained",
                                                  "weights_sha256": "cd"}
    assert full.engine_options_for("coverage", "trained")["weights_sha256"] == "ab"
    assert full.engine_options_for("perf") == {"mode": "good", "dtype": "bfloat16"}
    path.write_text(text.replace('{ use = "trained" } }', '{ use = "trainde" } }'))
    assert ("tiers.full.coverage_variants.trained.engine_options.use: 'trainde' is not a set of "
            "[engine_option_sets]; expected one of 'trained'") in error_of(path)
    path.write_text(text.replace('weights_sha256 = "ab"', 'dtype = "bf16"'))
    assert "tiers.full.suite_engine_options.parity.dtype: 'bf16' is not allowed" in error_of(path)


def test_the_real_spec_names_its_checkpoint_once():
    text = REAL_SPEC.read_text()
    spec = load_spec(REAL_SPEC)
    digest = spec.tier("full").engine_options_for("parity")["weights_sha256"]
    assert text.count(digest) == 1
    for tier in ("smoke", "full"):
        assert spec.tier(tier).engine_options_for("coverage", "trained")["weights_sha256"] == digest
