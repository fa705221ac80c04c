"""Set-up shared by the live vLLM tests (tests/test_vllm_*_live.py).

They need vLLM's CPU build, which lives in its own virtual environment (its torch /
transformers / xgrammar pins differ from the project's): `bash .ci/vllm-tests` makes it
(.ci/vllm-env) and runs them there, inside a network namespace with only loopback. In the
project's own venv they are skipped with that reason.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLUGIN_DIR = ROOT / "tests" / "doubles" / "vllm_plugin"
SWITCH = {"decode_backend": "latency_specialized"}
COMPONENTS = [{"name": "lm_head", "fast_kernel_patterns": [], "fallback_kernel_patterns": []}]

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
requires_vllm = pytest.mark.skipif(
    not HAVE_VLLM, reason="vLLM is not installed in this venv: the live vLLM tests run in the venv "
                          "that .ci/vllm-env makes (run them with: bash .ci/vllm-tests)")


def plugin_env() -> dict[str, str]:
    """What vLLM's processes need to find the fixture plugin (and this checkout's fastpath)."""
    path = os.pathsep.join([str(PLUGIN_DIR), str(ROOT), os.environ.get("PYTHONPATH", "")])
    return {"PYTHONPATH": path.rstrip(os.pathsep), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
            "TOKENIZERS_PARALLELISM": "false"}


def use_plugin() -> None:
    """This process and the ones vLLM spawns see the plugin's dist-info (its entry point)."""
    os.environ.update(plugin_env())
    for p in (str(PLUGIN_DIR), str(ROOT)):
        if p not in sys.path:
            sys.path.insert(0, p)


def make_fixture_model(out: Path) -> Path:
    use_plugin()
    from fastpath_vllm_fixture.make_model import make_model

    return make_model(out)


def engine_options(model_dir: Path, **extra) -> dict:
    return {"model": str(model_dir), "dtype": "float32", "max_model_len": 512, "max_num_seqs": 8,
            "compact_json": True, "profile": True, "components": COMPONENTS, "switch": {"key": "decode_backend", "value": "latency_specialized"},
            **extra}


def network_interfaces() -> list[str]:
    """The interfaces of this process's network namespace (`lo` alone under .ci/vllm-tests)."""
    return sorted(name for _, name in socket.if_nameindex())
