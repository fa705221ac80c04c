import json
import subprocess

from fastpath import environment
from fastpath.environment import REDACTED, allowed_env, capture, redact_argv


def test_secret_env_vars_are_never_captured(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_abcdefghijklmnop")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3tvalue")
    monkeypatch.setenv("GITHUB_AUTH", "zzz")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    env = capture(["fastpath", "verify"], {"global": 7}, tmp_path)
    text = json.dumps(env)
    for secret in ("hf_abcdefghijklmnop", "s3cr3tvalue", "HF_TOKEN", "AWS_SECRET", "GITHUB_AUTH"):
        assert secret not in text
    assert env["env"]["CUDA_VISIBLE_DEVICES"] == "0"
    assert env["triton_interpreter"] is True
    assert env["seeds"] == {"global": 7}


def test_allow_list_filters_secret_names_even_if_allowed(monkeypatch):
    monkeypatch.setattr(environment, "ENV_ALLOW", ("OMP_NUM_THREADS", "MY_API_KEY"))
    assert allowed_env({"OMP_NUM_THREADS": "2", "MY_API_KEY": "x", "PATH": "/bin"}) == {"OMP_NUM_THREADS": "2"}


def test_argv_redaction():
    argv = ["fastpath", "verify", "--hf-token", "abc123", "--api-key=xyz", "PASSWORD=hunter2",
            "--tier", "full", "ghp_0123456789abcdefghij", "--seed", "3"]
    out = redact_argv(argv)
    assert out == ["fastpath", "verify", "--hf-token", REDACTED, f"--api-key={REDACTED}", f"PASSWORD={REDACTED}",
                   "--tier", "full", REDACTED, "--seed", "3"]


def test_capture_fields_without_git(tmp_path):
    env = capture(["x"], {}, tmp_path)
    assert env["git"] == {"available": False}
    assert env["python"]["version"].count(".") == 2
    assert env["packages"]["pandas"]  # installed here
    assert env["packages"]["fastpath"]
    assert env["hardware"] == "cpu" or env["hardware"].startswith("sm_")


def _git(root, *args):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=root, check=True,
                   capture_output=True)


def test_git_commit_dirty_flag_and_diff_digest(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.py").write_text("1\n")
    _git(tmp_path, "add", "a.py")
    _git(tmp_path, "commit", "-qm", "c")
    clean = environment.git_state(tmp_path)
    assert clean["available"] and len(clean["commit"]) == 40 and clean["dirty"] is False
    (tmp_path / "a.py").write_text("2\n")
    dirty = environment.git_state(tmp_path)
    assert dirty["dirty"] is True and dirty["diff_sha256"] != clean["diff_sha256"]
    (tmp_path / "new.py").write_text("n\n")
    untracked = environment.git_state(tmp_path)
    assert untracked["untracked_count"] == 1
    assert untracked["untracked_sha256"] != dirty["untracked_sha256"]
    assert untracked["diff_sha256"] == dirty["diff_sha256"]


def test_gpu_facts_from_nvidia_smi(monkeypatch):
    monkeypatch.setattr(environment.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(environment, "_run", lambda cmd, cwd=None, timeout=20.0:
                        b"NVIDIA H200, 9.0, 143771, 570.86.15\nNVIDIA H200, 9.0, 143771, 570.86.15\n")
    gpu = environment._gpu_from_smi()
    assert [d["arch"] for d in gpu["devices"]] == ["sm_90", "sm_90"]
    assert gpu["driver"] == "570.86.15" and gpu["devices"][0]["memory_bytes"] == 143771 * 2**20
