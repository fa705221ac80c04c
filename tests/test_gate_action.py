"""The fastpath-check action's steps and the PR gate's script, run locally with bash and python
against bundles built here (tests/bundle_factory.py) and tampered copies of them.

`fastpath` is this tree's real CLI (`python -m fastpath.cli`), digest and check alike.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from fastpath.bundle import pack
import bundle_factory

ROOT = Path(__file__).resolve().parents[1]
ACTION = ROOT / ".github/actions/fastpath-check/action.yml"
GATE = ROOT / ".github/scripts/fastpath_gate.py"
COMMITTED = ROOT / ".github/scripts/check-committed-bundles.sh"
SPEC = bundle_factory.SPEC_REL
NAME = "toy-fast"  # the factory spec's [fastpath] name
PYPROJECT = f'[project]\nname = "toy"\n\n[tool.fastpath]\ndefault_spec = "{SPEC}"\n'


def _executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


@pytest.fixture
def fastpath_bin(tmp_path) -> Path:
    """An executable `fastpath` running this tree's CLI (never an installed copy of another tree)."""
    (tmp_path / "bin").mkdir()
    return _executable(tmp_path / "bin" / "fastpath",
                       f'#!/usr/bin/env bash\nPYTHONPATH="{ROOT}" exec "{sys.executable}" -m fastpath.cli "$@"\n')


@pytest.fixture
def built(tmp_path):
    """A toy repository (the PR's tree), its full-tier bundle packed, signed by a trusted key."""
    b = bundle_factory.build(tmp_path / "build", tier="full")
    (b.repo / "pyproject.toml").write_text(PYPROJECT)
    b.archive = pack(b.bundle)
    return b


def _tampered(b, tmp_path: Path) -> Path:
    """A copy of the bundle whose report.html was edited after signing, re-packed."""
    copy = tmp_path / "tampered" / "toy.fastpath"
    shutil.copytree(b.bundle, copy)
    (copy / "report.html").write_text("<html>all green, trust me</html>")
    return pack(copy)


# --- the composite action's steps --------------------------------------------------------------

def _action_step(step_id: str) -> dict:
    steps = yaml.safe_load(ACTION.read_text())["runs"]["steps"]
    return next(s for s in steps if s.get("id") == step_id)


def run_check_step(tmp_path: Path, fastpath: Path, bundles: str, *, trust: Path, source: Path,
                   tier: str = "full", spec: str = "", freshness: str = "enforce"):
    """Run the action's `fastpath check` step with bash, as the runner would, and return
    (exit code, outputs, step summary, log)."""
    step = _action_step("check")
    env_values = {"FASTPATH": str(fastpath), "BUNDLES": bundles, "TRUST": str(trust), "TIER": tier,
                  "SOURCE": str(source), "SPEC": spec, "FRESHNESS": freshness}
    assert set(step["env"]) == set(env_values), "the test must feed every env var the step declares"
    out, summary = tmp_path / "github_output", tmp_path / "step_summary.md"
    out.write_text("")
    summary.write_text("")
    env = {**os.environ, **env_values, "GITHUB_OUTPUT": str(out), "GITHUB_STEP_SUMMARY": str(summary)}
    proc = subprocess.run(["bash", "-e", "-c", step["run"]], env=env, capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)
    outputs = dict(line.split("=", 1) for line in out.read_text().splitlines() if "=" in line)
    return proc.returncode, outputs, summary.read_text(), proc.stdout + proc.stderr


def test_action_passes_a_valid_bundle(built, fastpath_bin, tmp_path):
    rc, outputs, summary, log = run_check_step(tmp_path, fastpath_bin, str(built.archive),
                                               trust=built.trust, source=built.repo)
    assert rc == 0, log
    assert outputs["verdict"] == "pass"
    assert "fastpath check passed" in summary
    assert summary.count("fastpath check passed") == 1, "the report must reach the summary exactly once"


def test_action_fails_a_tampered_bundle_and_says_why(built, fastpath_bin, tmp_path):
    bad = _tampered(built, tmp_path)
    rc, outputs, summary, log = run_check_step(tmp_path, fastpath_bin, str(bad), trust=built.trust,
                                               source=built.repo)
    assert rc == 1, log
    assert outputs["verdict"] == "fail"
    assert "fastpath check failed" in summary
    assert "report.html" in summary and "content changed" in summary


def test_action_checks_each_of_several_bundles(built, fastpath_bin, tmp_path):
    bad = _tampered(built, tmp_path)
    rc, outputs, summary, log = run_check_step(tmp_path, fastpath_bin, f"  {built.archive}\n\n{bad}\n",
                                               trust=built.trust, source=built.repo)
    assert rc == 1 and outputs["verdict"] == "fail", log
    assert "fastpath check passed" in summary and "fastpath check failed" in summary
    assert "2 bundle(s), 1 failed: fail" in log


def test_action_with_no_bundle_is_an_error(built, fastpath_bin, tmp_path):
    rc, outputs, _, log = run_check_step(tmp_path, fastpath_bin, " \n", trust=built.trust, source=built.repo)
    assert rc == 2 and outputs["verdict"] == "fail"
    assert "no bundle given" in log


def test_action_stops_workflow_commands_in_the_report(built, fastpath_bin, tmp_path):
    rc, _, _, log = run_check_step(tmp_path, fastpath_bin, str(built.archive), trust=built.trust,
                                   source=built.repo)
    lines = log.splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith("::stop-commands::"))
    token = lines[start].split("::")[2]
    assert len(token) == 32 and f"::{token}::" in lines[start + 1:]


def test_action_installs_fastpath_from_its_own_repository(tmp_path):
    """The install step must pip-install the action's repository, never the caller's checkout."""
    log = tmp_path / "calls.log"
    fake_python = _executable(tmp_path / "fake-python", f"""#!/usr/bin/env bash
echo "$0 $*" >> "{log}"
if [ "$1 $2" = "-m venv" ]; then mkdir -p "$3/bin"; cp "$0" "$3/bin/python"; fi
if [ "$1 $2" = "-m pip" ]; then touch "$(dirname "$0")/fastpath"; chmod +x "$(dirname "$0")/fastpath"; fi
""")
    step = _action_step("install")
    assert step["env"]["ACTION_ROOT"] == "${{ github.action_path }}/../../.."
    action_root = tmp_path / "actions/owner/fastpath/v1"
    caller = tmp_path / "caller"
    caller.mkdir()
    out = tmp_path / "github_output"
    env = {**os.environ, "ACTION_ROOT": str(action_root), "PYTHON": str(fake_python),
           "RUNNER_TEMP": str(tmp_path / "runner-temp"), "GITHUB_OUTPUT": str(out)}
    (tmp_path / "runner-temp").mkdir()
    proc = subprocess.run(["bash", "-e", "-c", step["run"]], env=env, cwd=caller, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    calls = log.read_text().splitlines()
    pip = [c for c in calls if " -m pip install" in c]
    assert len(pip) == 1 and pip[0].endswith(f" {action_root}"), calls
    fastpath = out.read_text().strip().split("=", 1)[1]
    assert fastpath == str(tmp_path / "runner-temp/fastpath-check-venv/bin/fastpath")


# --- the PR gate's script -----------------------------------------------------------------------

@pytest.fixture
def trees(built, tmp_path):
    """(base, pr): the PR changed a fast-path file relative to the base and carries its bundle;
    the base's trust policy lists the key that signed it."""
    pr = built.repo
    (pr / "bundles").mkdir()
    shutil.copy(built.archive, pr / "bundles" / f"{NAME}.full.fastpath.tar.gz")
    base = tmp_path / "base"
    shutil.copytree(pr, base, ignore=shutil.ignore_patterns("bundles"))
    (base / "bundles").mkdir()
    shutil.copy(built.trust, base / "bundles" / "trusted_keys.toml")
    (base / "subject/fast/kernels/gemv.py").write_text("BLOCK = 32\n")  # what the PR changed
    return base, pr


def run_gate(tmp_path: Path, base: Path, pr: Path, fastpath: Path, *extra: str):
    summary = tmp_path / "gate_summary.md"
    summary.write_text("")
    env = {k: v for k, v in os.environ.items() if k != "GITHUB_STEP_SUMMARY"}
    proc = subprocess.run([sys.executable, str(GATE), "--base", str(base), "--pr", str(pr),
                           "--fastpath", str(fastpath), "--summary", str(summary), *extra],
                          env=env, capture_output=True, text=True, timeout=600)
    return proc.returncode, summary.read_text(), proc.stdout + proc.stderr


def _row(summary: str) -> str:
    return next(l for l in summary.splitlines() if l.startswith(f"| `{SPEC}`"))


def test_gate_passes_a_changed_spec_with_a_valid_bundle(trees, fastpath_bin, tmp_path):
    base, pr = trees
    rc, summary, log = run_gate(tmp_path, base, pr, fastpath_bin)
    assert rc == 0, log
    row = _row(summary)
    assert "fast_path" in row and "✅ pass" in row and f"bundles/{NAME}.full.fastpath.tar.gz" in row
    assert "fastpath check passed" in summary


def test_gate_keeps_the_report_page_of_the_bundle_it_checked(trees, fastpath_bin, tmp_path):
    base, pr = trees
    rc, summary, log = run_gate(tmp_path, base, pr, fastpath_bin, "--reports", str(tmp_path / "reports"))
    assert rc == 0, log
    page = (tmp_path / "reports" / f"{NAME}.report.html").read_text()
    assert 'id="checked"' in page and "fastpath check: passed" in page and "Content-Security-Policy" in page


def test_gate_skips_a_spec_whose_attested_parts_did_not_change(trees, fastpath_bin, tmp_path):
    base, pr = trees
    shutil.copy(pr / "subject/fast/kernels/gemv.py", base / "subject/fast/kernels/gemv.py")
    (pr / "bundles" / f"{NAME}.full.fastpath.tar.gz").unlink()  # not needed when nothing changed
    (pr / "README.md").write_text("docs only\n")
    rc, summary, log = run_gate(tmp_path, base, pr, fastpath_bin)
    assert rc == 0, log
    assert "unchanged (skipped)" in _row(summary) and "| none |" in _row(summary)


def test_gate_fails_a_changed_spec_without_its_bundle(trees, fastpath_bin, tmp_path):
    base, pr = trees
    (pr / "bundles" / f"{NAME}.full.fastpath.tar.gz").unlink()
    rc, summary, log = run_gate(tmp_path, base, pr, fastpath_bin)
    assert rc == 1, log
    assert "missing bundle" in _row(summary) and "fastpath verify" in _row(summary)


def test_gate_fails_a_tampered_bundle_and_shows_the_reason(trees, built, fastpath_bin, tmp_path):
    base, pr = trees
    shutil.copy(_tampered(built, tmp_path), pr / "bundles" / f"{NAME}.full.fastpath.tar.gz")
    rc, summary, log = run_gate(tmp_path, base, pr, fastpath_bin)
    assert rc == 1, log
    assert "❌ fail" in _row(summary)
    assert "report.html" in summary and "content changed" in summary


def test_gate_fails_a_bundle_whose_tree_moved_on(trees, fastpath_bin, tmp_path):
    base, pr = trees
    (pr / "subject/fast/hooks.py").write_text("def fire():\n    return 'faster'\n")  # after the run
    rc, summary, log = run_gate(tmp_path, base, pr, fastpath_bin)
    assert rc == 1, log
    assert "❌ fail" in _row(summary) and "source" in summary


def test_gate_reads_the_trust_policy_from_the_base_not_the_pr(trees, built, fastpath_bin, tmp_path):
    base, pr = trees
    other = bundle_factory.build(tmp_path / "other")  # a different key pair
    shutil.copy(other.trust, base / "bundles" / "trusted_keys.toml")
    shutil.copy(built.trust, pr / "bundles" / "trusted_keys.toml")  # the PR vouching for itself
    rc, summary, log = run_gate(tmp_path, base, pr, fastpath_bin)
    assert rc == 1, log
    assert "❌ fail" in _row(summary) and "signature" in summary


def test_gate_reads_the_gated_specs_from_the_base_not_the_pr(trees, fastpath_bin, tmp_path):
    base, pr = trees
    (base / "pyproject.toml").write_text(PYPROJECT + f'gated_specs = ["{SPEC}"]\n')
    (pr / "pyproject.toml").write_text(PYPROJECT + 'gated_specs = ["nothing/here.toml"]\n')
    (pr / "bundles" / f"{NAME}.full.fastpath.tar.gz").unlink()
    rc, summary, log = run_gate(tmp_path, base, pr, fastpath_bin)
    assert rc == 1, log
    assert "missing bundle" in _row(summary)
    assert "nothing/here.toml" not in summary


def test_gate_refuses_a_bundle_that_is_a_link(trees, built, fastpath_bin, tmp_path):
    base, pr = trees
    bundle = pr / "bundles" / f"{NAME}.full.fastpath.tar.gz"
    bundle.unlink()
    bundle.symlink_to(built.archive)
    rc, summary, log = run_gate(tmp_path, base, pr, fastpath_bin)
    assert rc == 1, log
    assert "not a regular file" in _row(summary)


def test_gate_fails_when_the_pr_removes_a_gated_spec(trees, fastpath_bin, tmp_path):
    base, pr = trees
    (pr / SPEC).unlink()
    rc, summary, log = run_gate(tmp_path, base, pr, fastpath_bin)
    assert rc == 1, log
    assert "gated_specs" in _row(summary)


def test_gate_without_a_spec_list_in_the_base_is_a_usage_error(trees, fastpath_bin, tmp_path):
    base, pr = trees
    (base / "pyproject.toml").write_text('[project]\nname = "toy"\n')
    rc, _, log = run_gate(tmp_path, base, pr, fastpath_bin)
    assert rc == 2
    assert "gated_specs" in log and "fix:" in log


def test_gate_workflow_step_runs_the_base_script_on_the_two_checkouts(trees, fastpath_bin, tmp_path):
    """The workflow's gate step, run with bash as written, in a workspace holding base/ and pr/."""
    base, pr = trees
    ws = tmp_path / "workspace"
    ws.mkdir()
    shutil.move(base, ws / "base")
    shutil.move(pr, ws / "pr")
    (ws / "base/.github/scripts").mkdir(parents=True)
    shutil.copy(GATE, ws / "base/.github/scripts" / GATE.name)
    venv = tmp_path / "runner-temp/fastpath-base/bin"  # what the install step leaves
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(sys.executable)
    (venv / "fastpath").symlink_to(fastpath_bin)
    wf = yaml.safe_load((ROOT / ".github/workflows/fastpath-gate.yml").read_text())
    step = next(s for s in wf["jobs"]["gate"]["steps"] if s.get("name", "").startswith("Gate"))
    summary = tmp_path / "summary.md"
    env = {**os.environ, **step.get("env", {}), "RUNNER_TEMP": str(tmp_path / "runner-temp"),
           "GITHUB_STEP_SUMMARY": str(summary)}
    proc = subprocess.run(["bash", "-e", "-c", step["run"]], cwd=ws, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "✅ pass" in _row(summary.read_text())
    (ws / "pr/subject/fast/hooks.py").write_text("def fire():\n    return 'faster'\n")
    summary.write_text("")
    proc = subprocess.run(["bash", "-e", "-c", step["run"]], cwd=ws, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 1 and "❌ fail" in _row(summary.read_text())


def test_fastpath_digest_json_has_the_gate_contract_shape(built):
    """The real `fastpath digest --json` prints what the gate reads."""
    proc = subprocess.run([sys.executable, "-m", "fastpath.cli", "digest", str(built.spec), "--source",
                           str(built.repo), "--json"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert isinstance(data["name"], str) and set(data["parts"]) == {"fast_path", "validation", "subject", "spec"}


# --- the repository's own CI: every committed bundle ---------------------------------------------

def _fake_checker(tmp_path: Path, behaviour: str) -> Path:
    """A `fastpath` that logs its arguments and answers per bundle name (stale / broken / ok)."""
    log = tmp_path / "checker.log"
    return _executable(tmp_path / "fake-fastpath", f"""#!/usr/bin/env bash
echo "$*" >> "{log}"
case "$2" in
  *stale*) echo "warning: stale fast_path: optimized_model/k3/fast/x.py changed"; exit 0 ;;
  *broken*) echo "signature rejected: bad signature"; exit 1 ;;
  *) {behaviour} ;;
esac
""")


def run_committed(tmp_path: Path, names: list[str], fastpath: Path):
    repo = tmp_path / "repo"
    (repo / ".github/scripts").mkdir(parents=True)
    shutil.copy(COMMITTED, repo / ".github/scripts" / COMMITTED.name)
    (repo / "bundles").mkdir()
    for n in names:
        (repo / "bundles" / n).write_bytes(b"")
    proc = subprocess.run(["bash", str(repo / ".github/scripts" / COMMITTED.name)], capture_output=True, text=True,
                          env={**os.environ, "FASTPATH": str(fastpath)})
    calls = (tmp_path / "checker.log").read_text().splitlines() if (tmp_path / "checker.log").exists() else []
    return proc.returncode, proc.stdout + proc.stderr, calls


def test_committed_bundles_are_checked_at_the_tier_of_their_name(tmp_path):
    rc, log, calls = run_committed(tmp_path, ["a.smoke.fastpath.tar.gz", "b.full.fastpath.tar.gz"],
                                   _fake_checker(tmp_path, "exit 0"))
    assert rc == 0, log
    assert calls == [f"check bundles/{n}.fastpath.tar.gz --freshness warn --require-tier {t} "
                     "--trust bundles/trusted_keys.toml --source ." for n, t in (("a.smoke", "smoke"), ("b.full", "full"))]


def test_a_stale_committed_bundle_warns_naming_the_part(tmp_path):
    rc, log, _ = run_committed(tmp_path, ["k3-stale.smoke.fastpath.tar.gz"], _fake_checker(tmp_path, "exit 0"))
    assert rc == 0, log
    assert ("bundles: WARNING: bundles/k3-stale.smoke.fastpath.tar.gz: warning: stale fast_path: "
            "optimized_model/k3/fast/x.py changed") in log


def test_a_broken_or_misnamed_committed_bundle_fails(tmp_path):
    rc, log, _ = run_committed(tmp_path, ["k3-broken.full.fastpath.tar.gz", "ok.smoke.fastpath.tar.gz"],
                               _fake_checker(tmp_path, "exit 0"))
    assert rc == 1 and "bundles: FAIL bundles/k3-broken.full.fastpath.tar.gz" in log
    assert "bundles: ok bundles/ok.smoke.fastpath.tar.gz" in log
    rc, log, _ = run_committed(tmp_path / "x", ["k3.fastpath.tar.gz"], _fake_checker(tmp_path, "exit 0"))
    assert rc == 1 and "NAME.smoke.fastpath.tar.gz" in log


# --- the committed reference bundles, through the action ----------------------------------------

COMMITTED_BUNDLES = sorted((ROOT / "bundles").glob("*.fastpath.tar.gz"))


@pytest.mark.parametrize("bundle", COMMITTED_BUNDLES, ids=lambda p: p.name)
def test_action_on_a_committed_bundle_and_a_tampered_copy(bundle, fastpath_bin, tmp_path):
    """--freshness warn: a committed bundle whose tree moved on is only stale; its integrity holds."""
    import tarfile

    tier = bundle.name.removesuffix(".fastpath.tar.gz").rsplit(".", 1)[1]
    kw = dict(trust=ROOT / "bundles/trusted_keys.toml", source=ROOT, tier=tier, freshness="warn")
    rc, outputs, summary, log = run_check_step(tmp_path, fastpath_bin, str(bundle), **kw)
    assert rc == 0 and outputs["verdict"] == "pass", log
    with tarfile.open(bundle) as tar:  # our own committed archive: trusted input
        tar.extractall(tmp_path / "x", filter="data")
    (copy,) = (tmp_path / "x").glob("*.fastpath")
    (copy / "summary.json").write_text((copy / "summary.json").read_text().replace('"pass"', '"fail"', 1))
    rc, outputs, summary, log = run_check_step(tmp_path, fastpath_bin, str(pack(copy)), **kw)
    assert rc == 1 and outputs["verdict"] == "fail", log
    assert "summary.json" in summary and "content changed" in summary
