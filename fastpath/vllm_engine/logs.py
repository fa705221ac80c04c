"""vLLM's own log lines about what it selected (attention backend, model runner, compilation,
CUDA graphs), parsed into evidence rows.

vLLM's engine core and workers are other processes: ``logging_config(path)`` writes a logging
configuration (``VLLM_LOGGING_CONFIG_PATH``, read by vLLM in every process it starts) that keeps
vLLM's usual stderr handler and adds a file, which ``parse_backend_lines`` reads back. The
patterns and the lines they are tested on are quoted in tests/test_vllm_logs.py with their source.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

# name -> regex over one log line's message; the named groups are the evidence.
PATTERNS: dict[str, re.Pattern[str]] = {
    # vllm/platforms/cuda.py (get_attn_backend_cls): the automatic choice, and a forced one.
    "attention_backend": re.compile(
        r"Using (?P<backend>[A-Z0-9_]+) attention backend out of potential backends: (?P<candidates>.+?)\.?$"),
    "attention_backend_forced": re.compile(r"Using (?P<backend>[A-Z0-9_]+) backend\.$"),
    # vllm/config/vllm.py: the V2 model runner falls back to V1 without Triton (the CPU build).
    "model_runner_fallback": re.compile(r"Model Runner V2 requires (?P<needs>\w+); using the (?P<runner>V\d) model runner"),
    # vllm/config/vllm.py: enforce_eager turns off torch.compile and CUDA graphs.
    "eager": re.compile(r"Enforce eager set, disabling (?P<disabled>torch\.compile, CUDAGraphs)"),
    # vllm/v1/attention/backends/utils.py: the KV-cache layout chosen for the backend.
    "kv_cache_layout": re.compile(r"Using (?P<layout>[A-Z]+) KV cache layout\."),
    # vllm/v1/engine/core.py: the engine's version banner.
    "engine": re.compile(r"Initializing a (?P<engine>V\d) LLM engine \(v(?P<version>[^)]+)\)"),
}

# "(EngineCore pid=18418) INFO 12-01 23:29:52 [utils.py:347] Using LBHNC KV cache layout."
_PREFIX = re.compile(r"^(?:\((?P<proc>[^)]*)\)\s+)?(?P<level>[A-Z]+) \S+ \S+ \[(?P<where>[^\]]+)\] (?P<msg>.*)$")


def parse_backend_lines(text: str) -> list[dict]:
    """One row per recognised line: {"kind", "process", "source", "line", **groups}."""
    rows = []
    for raw in text.splitlines():
        m = _PREFIX.match(raw.strip())
        if not m:
            continue
        msg = m.group("msg").strip()
        for kind, pat in PATTERNS.items():
            hit = pat.search(msg)
            if hit:
                rows.append({"kind": kind, "process": m.group("proc") or "", "source": m.group("where"),
                             "line": raw.strip(), **hit.groupdict()})
                break
    return rows


def logging_config(log_file: str | Path) -> dict:
    """vLLM's default logging configuration plus a file handler on ``log_file``."""
    fmt = "(pid=%(process)d) %(levelname)s %(asctime)s [%(fileinfo)s:%(lineno)d] %(message)s"
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"vllm": {"()": "vllm.logging_utils.NewLineFormatter", "datefmt": "%m-%d %H:%M:%S",
                                "format": fmt}},
        "handlers": {
            "stderr": {"class": "logging.StreamHandler", "formatter": "vllm", "stream": "ext://sys.stderr"},
            "evidence": {"class": "logging.FileHandler", "formatter": "vllm", "filename": str(log_file),
                         "mode": "a", "encoding": "utf-8"},
        },
        "loggers": {"vllm": {"handlers": ["stderr", "evidence"], "level": "INFO", "propagate": False}},
    }


def write_logging_config(directory: str | Path) -> tuple[Path, Path]:
    """(config path for VLLM_LOGGING_CONFIG_PATH, the log file it appends to)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    log_file = directory / "vllm.log"
    cfg = directory / "vllm-logging.json"
    cfg.write_text(json.dumps(logging_config(log_file), indent=1))
    return cfg, log_file
