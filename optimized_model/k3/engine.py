"""EmbeddedEngine: K3-mini in process, on CPU or one GPU (entry point "embedded").

    engine = fastpath.engine.create_engine("embedded", config="tiny", device="cpu", dtype="float16")
    model = engine.load("standard" | "standard_eager" | "oracle")
    model = engine.load("fast", additional_config={"decode_backend": "latency_specialized"})
    # = optimized_model.k3.fast.dispatch.switch_config(); the harness passes the spec's [switch]

Options: ``config`` "tiny" | "mini" | "trained"; ``device`` "cpu" | "cuda"; ``dtype`` (default
bfloat16 on cuda, float32 on cpu); ``seed`` (random weights); ``weights`` (a safetensors file of
trained weights, relative to the repository root, instead of the seeded random ones) with
``weights_sha256`` (its pinned digest: weights_file.py refuses any other file, in one line);
``use_graphs`` (default: True on cuda); ``threads``
(torch CPU threads; default: leave torch's setting); ``standard_compile`` (the torch.compile mode
of the standard path's benchmark step ``decode_step``: "default", "max-autotune-no-cudagraphs",
... or "off"; default "default" on cuda, "off" on cpu; runner.py); ``standard_compile_verify``
(that step at a draft, the verify step, compiled too; default false: eager in the graph);
``speculative`` (speculative
decoding in ``generate``, vLLM's speculative_config names: ``{method = "ngram", num_speculative_tokens
= 3, prompt_lookup_min = 2, prompt_lookup_max = 5}`` or ``{method = "synthetic",
num_speculative_tokens = 7, acceptance_length = 6}``, the latter for benchmarks only;
speculative.py, drafters.py; default off). Each result then carries ``speculative``, its
acceptance statistics (drafted, accepted, mean acceptance length).

"standard_eager" is the standard path with its benchmark step eager inside the CUDA graph (the
previous baseline, reported beside the compiled one); elsewhere it is the standard path.
``model.step_traffic(batch, context, draft)`` counts the bytes that step must move (traffic.py).

Paths share one set of weights: "standard" and "fast" use the same K3Model (the fast path
reads its tensors); "oracle" is the same weights upcast to fp32 with the torch recurrence and
the expert loop.

"fast" is behind the opt-in switch, ``additional_config`` as in vLLM: only when it holds the
fast path's own key and value (``optimized_model.k3.fast.dispatch.switch_on``) does the engine
build the fast decoder through ``dispatch.build_fast_decoder(model, state_factory)``; any other
config loads the standard path (its model's ``path`` is "standard": it reports no fast-path
event). With the switch on, if the decoder is missing, raises, or is None, ``load("fast")``
raises ``FastPathUnavailable`` — the standard path is never run under the name "fast".

On CPU the engine sets ``TRITON_INTERPRET=1`` before anything from optimized_model.k3.fast is
imported (fast Triton kernels then run in Triton's interpreter) and reports it in ``info()``.
"""

from __future__ import annotations

import importlib.util
import os
import platform
from collections.abc import Mapping
from typing import Any

import torch

from .config import active_bytes_per_token, get_config, param_counts

PATHS = ("standard", "standard_eager", "fast", "oracle")
_DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16,
           "fp16": torch.float16, "half": torch.float16, "float32": torch.float32, "fp32": torch.float32}


class FastPathUnavailable(RuntimeError):
    pass


def _parse_dtype(dtype: Any, device: str) -> torch.dtype:
    if dtype is None:
        return torch.bfloat16 if device == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    key = str(dtype).replace("torch.", "")
    if key not in _DTYPES:
        raise ValueError(f"dtype {dtype!r} is not supported; use one of bfloat16, float16, float32")
    return _DTYPES[key]


class K3LoadedModel:
    """A loaded model on one path (implements fastpath.engine.Model)."""

    def __init__(self, path: str, model, runner, tokenizer, speculative=None):
        self.path = path
        self.model = model
        self.runner = runner
        self.tokenizer = tokenizer
        self.device = model.device.type
        self.speculative = speculative  # a speculative.SpecConfig or None

    def generate(self, requests, speculative=None):
        """``speculative``: this call's settings instead of the engine's (a table or SpecConfig)."""
        from .generate import generate
        from .speculative import SpecConfig

        if not requests:
            return []
        spec = SpecConfig.parse(speculative) or self.speculative
        # a verify window may run num_speculative_tokens past max_tokens before it is cut
        extra = spec.num_speculative_tokens if spec is not None else 0
        self.runner.reserve = max(int(r.max_tokens) for r in requests) + 1 + extra
        return generate(self.runner, self.tokenizer, requests, speculative=spec)

    def score(self, token_ids: list[list[int]], prefill_len: int | None = None) -> list[torch.Tensor]:
        """Teacher-forced fp32 logits [len, vocab] per sequence (``K3Runner.score``)."""
        return self.runner.score(token_ids, prefill_len)

    def decode_step(self, batch: int, context: int, draft: int = 0):
        return self.runner.decode_step(batch, context, draft)

    def prompt_step(self, prompts: list[list[int]], tokens: int):
        """fastpath.engine.PromptModel: greedy decode of real prompts, ``tokens`` steps per ``reset()``."""
        return self.runner.prompt_step(prompts, tokens)

    def step_traffic(self, batch: int, context: int, draft: int = 0) -> dict:
        """Bytes the step ``decode_step(batch, context, draft)`` must move (fastpath.engine.RooflineModel)."""
        return self.runner.step_traffic(batch, context, draft)

    def prefill_step(self, batch: int, context: int):
        return self.runner.prefill_step(batch, context)

    def mixed_step(self, batch: int, context: int):
        return self.runner.mixed_step(batch, context)

    def close(self) -> None:
        self.runner = None
        self.model = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


class EmbeddedEngine:
    """Implements fastpath.engine.Engine for K3-mini."""

    name = "embedded"

    def __init__(self, config: str = "tiny", device: str = "cpu", dtype: Any = None, seed: int = 0,
                 use_graphs: bool | None = None, threads: int | None = None, standard_compile: str | None = None,
                 standard_compile_verify: bool = False, weights: str | None = None, weights_sha256: str | None = None,
                 speculative: Mapping[str, Any] | None = None, **unknown: Any):
        if unknown:
            raise TypeError(f"embedded engine: unknown option(s) {sorted(unknown)}; known: config, device, "
                            "dtype, seed, use_graphs, threads, standard_compile, standard_compile_verify, weights, "
                            "weights_sha256, speculative")
        if not isinstance(standard_compile_verify, bool):
            raise ValueError(f"standard_compile_verify {standard_compile_verify!r}: true or false")
        self.standard_compile_verify = standard_compile_verify
        from .speculative import SpecConfig

        self.speculative = SpecConfig.parse(speculative)  # a bad table fails here, in one line
        if weights_sha256 is not None and not weights:
            raise ValueError("embedded engine: weights_sha256 without weights; add engine option weights "
                             "(the checkpoint's path) or drop the digest")
        self.weights, self.weights_sha256 = weights, weights_sha256
        if weights:  # a missing or other file fails here, in one line, before any suite runs
            from .weights_file import verify_file

            verify_file(weights, weights_sha256)
        if threads:  # torch CPU threads (1 is much faster than the default on a shared small box)
            torch.set_num_threads(int(threads))
        self.cfg = get_config(config)
        device = str(device)
        if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
            raise ValueError(f"device {device!r}: use 'cpu' or 'cuda'")
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise RuntimeError(
                f"device={device!r} requested but no CUDA GPU is usable here (torch {torch.__version__}, "
                f"torch.version.cuda={torch.version.cuda}, torch.cuda.is_available() is False). Fix: run "
                "on a machine with an NVIDIA GPU and a CUDA build of torch, or use the CPU tier "
                "(config='tiny', device='cpu', dtype='float16')."
            )
        self.device = torch.device(device)
        self.dtype = _parse_dtype(dtype, self.device.type)
        self.seed = int(seed)
        self.use_graphs = use_graphs
        if standard_compile is None:
            standard_compile = "default" if self.device.type == "cuda" else "off"
        if not isinstance(standard_compile, str) or not standard_compile:
            raise ValueError(f"standard_compile {standard_compile!r}: use a torch.compile mode such as "
                             "'default' or 'max-autotune-no-cudagraphs', or 'off'")
        self.standard_compile = standard_compile
        if self.device.type == "cpu":
            # before anything from optimized_model.k3.fast is imported (docs/architecture.md)
            os.environ["TRITON_INTERPRET"] = "1"
        self._models: dict[str, Any] = {}

    # -- protocol ------------------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        if self.device.type == "cuda":
            major, minor = torch.cuda.get_device_capability(self.device)
            arch, name = f"sm_{major}{minor}", torch.cuda.get_device_name(self.device)
        else:
            arch, name = "cpu", platform.processor() or platform.machine() or "cpu"
        pc = param_counts(self.cfg)
        return {
            "engine": self.name,
            "device": self.device.type,
            "arch": arch,
            "device_name": name,
            "model_config": self.cfg.name,
            "dtype": str(self.dtype).replace("torch.", ""),
            "triton_interpreter": os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"),
            "seed": self.seed,
            "weights": self.weights,
            "weights_sha256": self.weights_sha256,
            "params_total": pc["total"],
            "params_active_per_token": pc["active_per_token"],
            "active_bytes_per_token": active_bytes_per_token(self.cfg, torch.finfo(self.dtype).bits // 8),
            "vocab_size": self.cfg.vocab_size,
            "torch": torch.__version__,
            "cuda_graphs": self._graphs_on(),
            "cpu_threads": torch.get_num_threads(),
            "switch": self._own_switch(),
            "standard_compile": self.standard_compile,
            "standard_compile_verify": self.standard_compile_verify and self.standard_compile != "off",
            "batch_buckets": self._batch_buckets(),
            "speculative": None if self.speculative is None else dict(vars(self.speculative)),
        }

    def _batch_buckets(self) -> list[int]:
        """Where the fast path's tuning table for this device changes a choice (fast/tuning)."""
        try:
            from .fast import tuning
        except Exception:
            return []
        return tuning.batch_boundaries(self.device)

    def _graphs_on(self) -> bool:
        return self.device.type == "cuda" if self.use_graphs is None else bool(self.use_graphs)

    def _model(self, oracle: bool):
        from .model import K3Model

        key = "oracle" if oracle else "standard"
        if key not in self._models:
            if self.weights:
                from .weights_file import load_weights

                # the oracle: the standard path's values (rounded to its dtype), in fp32
                w = load_weights(self.weights, self.weights_sha256, self.cfg, device=self.device,
                                 dtype=torch.float32 if oracle else self.dtype, round_dtype=self.dtype)
                self._models[key] = K3Model(self.cfg, w, oracle=oracle)
            else:
                self._models[key] = K3Model.build(self.cfg, device=self.device, dtype=self.dtype, seed=self.seed,
                                                  oracle=oracle)
        return self._models[key]

    def load(self, path: str, *, additional_config: Mapping[str, str] | None = None) -> K3LoadedModel:
        """``path`` "standard" | "oracle" | "fast"; "fast" runs the fast path only when
        ``additional_config`` carries its switch (else the standard path, see the module doc)."""
        from .runner import K3Runner
        from .tokenizer import K3Tokenizer

        if path not in PATHS:
            raise ValueError(f"path {path!r}: use one of {', '.join(PATHS)}")
        tok = K3Tokenizer()
        if path == "oracle":
            model = self._model(oracle=True)
            return K3LoadedModel(path, model, K3Runner(model, use_graphs=False), tok, self.speculative)
        model = self._model(oracle=False)
        if path == "fast" and not self._switch_on(additional_config):
            path = "standard"  # switch off: what vLLM runs without it (no fast-path event)
        if path in ("standard", "standard_eager"):
            mode = self.standard_compile if path == "standard" else None
            runner = K3Runner(model, use_graphs=self._graphs_on(), compile_mode=mode,
                              compile_verify=self.standard_compile_verify)
            return K3LoadedModel(path, model, runner, tok, self.speculative)
        decoder = self._build_fast(model)
        runner = K3Runner(model, use_graphs=self._graphs_on(), fast_decoder=decoder, fast_mode=True)
        return K3LoadedModel(path, model, runner, tok, self.speculative)

    def _build_fast(self, model):
        ok, why = self.fast_path_available()
        if not ok:
            raise FastPathUnavailable(f"fast path unavailable: {why}")
        try:
            from .fast import dispatch

            decoder = dispatch.build_fast_decoder(
                model, lambda batch, max_context: model.new_state(batch, max_context))
        except Exception as exc:
            raise FastPathUnavailable(f"fast path unavailable: building it failed with "
                                      f"{type(exc).__name__}: {exc}") from exc
        if decoder is None:
            raise FastPathUnavailable("fast path unavailable: build_fast_decoder returned None here")
        return decoder

    @staticmethod
    def _switch_on(additional_config: Mapping[str, str] | None) -> bool:
        """True iff ``additional_config`` holds the fast path's own switch key and value."""
        try:
            from .fast import dispatch
        except Exception as exc:  # the switch's key lives in the fast package
            raise FastPathUnavailable(f"fast path not importable ({type(exc).__name__}: {exc})") from exc

        return dispatch.switch_on(additional_config)

    @staticmethod
    def _own_switch() -> dict[str, str] | None:
        try:
            from .fast import dispatch
        except Exception:
            return None
        return dispatch.own_switch()

    def fast_path_available(self) -> tuple[bool, str]:
        try:
            if importlib.util.find_spec("optimized_model.k3.fast.runtime") is None:
                return False, "fast path not built yet (optimized_model/k3/fast/runtime.py is missing)"
            from .fast import dispatch
        except Exception as exc:
            return False, f"fast path not importable ({type(exc).__name__}: {exc})"
        return dispatch.fast_path_available()

    def components(self) -> list[Any]:
        try:
            from .fast import registry
        except Exception:
            return []
        return list(registry.components(cfg=self.cfg))

    def kernels(self) -> list[Any]:
        try:
            from .fast import registry
        except Exception:
            return []
        return list(registry.kernels())
