"""The Engine protocol: how the harness drives a subject.

Engines are found by name through the ``fastpath.engines`` entry-point group, so the harness
never imports a subject directly. An engine module may import only ``fastpath.trace`` from the
harness; it therefore returns its own objects, which must carry the attributes documented on
the protocols below (duck typing, checked by ``tests/test_engine_contract.py``-style tests).

Paths: ``"standard"`` (what a generic engine runs), ``"fast"`` (the fast path behind the
opt-in switch) and ``"oracle"`` (the standard math in fp32, the numerics reference). An engine
may offer ``"standard_eager"`` (``OPTIONAL_PATHS``): the standard path with its benchmark step
not compiled, where "standard" compiles it; the perf suite reports it beside.

The opt-in switch travels as vLLM's ``additional_config`` does: a mapping ``{key: value}``
built from the spec's ``[switch]`` table (``switch_config``), passed to ``Engine.load("fast",
additional_config=...)``. The engine, not the harness, decides whether the switch is its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

PATHS = ("standard", "fast", "oracle")
OPTIONAL_PATHS = ("standard_eager",)
ENTRY_POINT_GROUP = "fastpath.engines"


@dataclass
class GenerationRequest:
    """One request. ``structured`` is None, {"json_schema": dict|str} or {"regex": str}."""

    prompt_ids: list[int]
    max_tokens: int = 32
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int = 0
    stop_token_ids: list[int] = field(default_factory=list)
    stop_strings: list[str] = field(default_factory=list)
    structured: dict[str, Any] | None = None
    logprobs: bool = False
    ignore_eos: bool = False  # keep generating past eos (long-generation parity, benchmarks)


@runtime_checkable
class GenerationResult(Protocol):
    token_ids: list[int]
    text: str
    finish_reason: str  # "stop" | "length" | "grammar"
    logprobs: list[float] | None


@runtime_checkable
class Tokenizer(Protocol):
    vocab_size: int  # padded size (LM-head rows)
    bos_id: int
    eos_id: int

    def encode(self, text: str, *, bos: bool = True) -> list[int]: ...
    def decode(self, ids: Sequence[int]) -> str: ...
    def apply_chat_template(self, turns: list[dict[str, str]], *, add_generation_prompt: bool = True) -> list[int]: ...


@runtime_checkable
class KernelEntry(Protocol):
    """A fast kernel as the kernel suite sees it (registry entry).

    fast(**inputs) / standard(**inputs) / oracle(**inputs) return a tensor or a tuple of tensors.
    make_inputs(shape: dict, value_class: str, dtype, device, seed: int) -> dict of inputs.
    shapes: list of shape dicts (scope batch sizes plus edge shapes). value_classes: names
    understood by make_inputs ("normal", "large", "near_zero", "ties", "masked_inf", ...).
    atol_floor: {dtype name: float}. k: noise-floor multiplier. deterministic: repeat must be
    bitwise equal. kernel_patterns: regexes of GPU kernel names this kernel launches.
    Optional: boundary_shapes, shapes at the tuning table's bucket and tile edges (both sides of
    a bucket's batch limit, partial tiles) that every tier runs, the smoke tier beside its pick
    of ``shapes``. A shape with ``steps`` > 1 runs that many consecutive calls, state carried.
    """

    name: str
    component: str
    fast: Callable[..., Any]
    standard: Callable[..., Any]
    oracle: Callable[..., Any]
    make_inputs: Callable[..., dict]
    shapes: list[dict]
    value_classes: list[str]
    dtypes: list[str]
    atol_floor: dict[str, float]
    k: float
    deterministic: bool
    kernel_patterns: list[str]


@runtime_checkable
class Component(Protocol):
    """A fast-path component and the GPU kernel names that prove which path ran.

    layers: the model layers (indices) the component serves, declared by the engine from the
    model's config; in every in-scope decode step it must engage at each of them, with events
    naming the layer (``fastpath.trace.layer``), so a layer that reports nothing is still
    expected. ``None``: a component that runs once per step (LM head, sampler, whole-step
    graph), whose events name no layer. An engine whose components lack the attribute is
    judged per step only, and the coverage gate says so. Optional: ``verify_variants`` and
    ``verify_kernel_patterns``, the trace variants and kernel names that prove a speculative
    verify step (draft > 0) ran the component's verify kernels, expected at draft > 0 (absent
    or empty: it runs the same kernels at batch x (draft + 1) rows)."""

    name: str
    fast_kernel_patterns: list[str]
    fallback_kernel_patterns: list[str]
    layers: list[int] | None


@runtime_checkable
class Model(Protocol):
    """A loaded model on one path."""

    path: str
    tokenizer: Tokenizer
    device: str

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Optional capability: ``generate(requests, speculative=None)``, where ``speculative`` is
        vLLM's speculative_config as a table (``{"method": "ngram", "num_speculative_tokens": K}``)
        and each result then carries ``speculative``, its acceptance statistics (``steps``,
        ``drafted``, ``accepted``). The features suite checks speculation only through it
        (fastpath/speculative_checks.py); an engine without it gets error rows when the spec
        declares features.speculative_decoding."""
        ...

    def score(self, token_ids: list[list[int]], prefill_len: int | None = None) -> list[Any]:
        """Teacher-forced logits (fp32 tensor [len, vocab]; row i predicts token i + 1).

        The first ``prefill_len`` positions (default: all) come from a prefill; every later
        position from a decode step fed the true token. Prefill is outside a decode fast
        path's scope, so parity MUST pass ``prefill_len`` < len to exercise the fast path."""
        ...

    def decode_step(self, batch: int, context: int, draft: int = 0) -> Callable[[], None]:
        """A callable running one decode step of ``batch`` sequences at ``context`` tokens
        (CUDA-graph replay where the path uses graphs). Events go to fastpath.trace."""
        ...

    def prefill_step(self, batch: int, context: int) -> Callable[[], None]: ...

    def mixed_step(self, batch: int, context: int) -> Callable[[], None]:
        """One step mixing a prefill with ``batch - 1`` decodes (out of fast-path scope)."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class RooflineModel(Protocol):
    """Optional capability of a Model: the perf suite's roofline (no method: no MBU rows)."""

    def step_traffic(self, batch: int, context: int, draft: int = 0) -> dict:
        """Bytes the step ``decode_step(batch, context, draft)`` must move at least, counted
        from its real tensors (the same tokens and state): every weight it reads once (for
        MoE only the experts its tokens were routed to, from the router's output), its state
        and cache reads and writes, its inputs and outputs. Returns ints:
        ``{"total", "weights", "experts", "embedding", "state", "cache", "io"}`` (total = the
        sum of the others), plus ``"experts_touched"``: [distinct experts per MoE layer] and
        ``"n_experts"`` (0 and [] for a dense model)."""
        ...


@runtime_checkable
class PromptModel(Protocol):
    """Optional capability of a Model: the perf suite's prompt cases (decode on real prompts,
    ``[perf] prompt_decode``; a spec that asks for them needs it)."""

    def prompt_step(self, prompts: list[list[int]], tokens: int) -> Callable[[], None]:
        """Prefill ``prompts`` (token ids) once; each call of the returned step is then one
        greedy decode step of every sequence, fed its own last token (events to fastpath.trace,
        as generate's). The step has ``reset()`` (back to the prefill's end: every segment
        decodes the same tokens; the perf timer calls it before each segment, untimed), at most
        ``tokens`` calls per reset, ``generated_ids()`` (per sequence, the tokens decoded since
        the reset) and ``traffic()`` (as ``step_traffic``, for the first step after a reset)."""
        ...


@runtime_checkable
class Engine(Protocol):
    name: str

    def info(self) -> dict[str, Any]:
        """{"device": "cpu"|"cuda", "arch": "sm_90"|"cpu", "device_name": str,
        "model_config": str, "dtype": str, "triton_interpreter": bool, ...}; optionally
        "switch": {"key": str, "value": str}, the switch its fast path answers to (named in
        the coverage gate's message when the spec's switch does not engage it), and
        "batch_buckets": [int], the batch sizes at which the fast path's tuning changes a
        choice on this device (the largest batch of each bucket but the last): parity and the
        kernels suite's smoke selection run a batch on both sides of each."""
        ...

    def load(self, path: str, *, additional_config: Mapping[str, str] | None = None) -> Model:
        """The model on ``path``. ``additional_config`` is the opt-in switch exactly as vLLM's
        ``additional_config`` (``{"decode_backend": "latency_specialized"}``); the harness
        passes ``switch_config(spec.switch)`` when it loads "fast" and nothing otherwise.

        The engine turns its fast path on ONLY when it finds its own switch key with its own
        value there. Any other config (wrong value, missing key, None) loads a model that runs
        the standard path and reports no fast-path event, as vLLM would."""
        ...

    def components(self) -> list[Component]: ...

    def kernels(self) -> list[KernelEntry]: ...

    def fast_path_available(self) -> tuple[bool, str]:
        """(True, "") or (False, the reason, e.g. "no CUDA device and no Triton interpreter")."""
        ...


def switch_config(switch: Mapping[str, str]) -> dict[str, str]:
    """The spec's ``[switch]`` table (``{"key": k, "value": v}``) as ``additional_config``
    (``{k: v}``), the form ``Engine.load`` takes."""
    return {str(switch["key"]): str(switch["value"])}


def switch_text(switch: Mapping[str, str] | None) -> str:
    """``key=value`` of a ``[switch]``-shaped mapping, for messages ("?" when unknown)."""
    if not switch or "key" not in switch or "value" not in switch:
        return "?"
    return f"{switch['key']}={switch['value']}"


class EngineNotFound(LookupError):
    pass


def available_engines() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def create_engine(name: str, **options: Any) -> Engine:
    """Instantiate engine ``name`` registered under the ``fastpath.engines`` entry points."""
    eps = available_engines()
    if name not in eps:
        known = ", ".join(sorted(eps)) or "none"
        raise EngineNotFound(
            f"no engine named {name!r} (registered: {known}). Engines register under the "
            f"'{ENTRY_POINT_GROUP}' entry-point group; is the package installed (pip install -e .)?"
        )
    factory = eps[name].load()
    return factory(**options)
