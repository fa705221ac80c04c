"""The double engine: a tiny recurrent byte-level LM with standard / fast / oracle paths.

Math per position (x = token id)::

    e = Emb[x];  s = decay * s + e                     (fp32 state; "recurrence")
    h = rmsnorm(e + 0.2 s) ; f = W2 gelu(W1 h) + h     ("norm", "gemv")
    logits = Wlm rmsnorm(f)                            ("lm_head")

standard: fp16 weights and activations (plain torch); oracle: fp32; fast: fp16 through
``fast_path`` (chunked fp32 accumulation, its own sampler). Fast-path dispatch follows the
contract: decode steps with batch <= fast_path.MAX_BATCH engage every component (the emulated
"decode_graph" is captured once per batch size and replayed); prefill / mixed / larger
batches refuse every component with the reason.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import torch

from fastpath import trace

from . import fast_path

V_REAL = 258  # 256 bytes + bos + eos
VOCAB = 264
BOS, EOS = 256, 257
D, HID = 32, 64
COMPONENTS = ("gemv", "recurrence", "norm", "lm_head", "sampler", "decode_graph")


class ByteTokenizer:
    vocab_size = VOCAB
    n_real_tokens = V_REAL
    bos_id = BOS
    eos_id = EOS

    def encode(self, text: str, *, bos: bool = True) -> list[int]:
        return ([BOS] if bos else []) + list(text.encode("utf-8"))

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids if int(i) < 256).decode("utf-8", errors="replace")

    def apply_chat_template(self, turns, *, add_generation_prompt=True):
        return self.encode("".join(t["content"] for t in turns))


@dataclass
class Result:
    token_ids: list[int]
    text: str
    finish_reason: str
    logprobs: list[float] | None = None


@dataclass
class Comp:
    name: str
    fast_kernel_patterns: list[str] = field(default_factory=list)
    fallback_kernel_patterns: list[str] = field(default_factory=list)
    layers: list[int] | None = None  # the layers it serves (None: once per step)


# The double has one block (layer 0): recurrence, norm and the FFN gemv serve it; the head,
# the sampler and the emulated graph run once per step.
LAYERED = ("recurrence", "norm", "gemv")


def _weights(seed: int = 1234) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    r = lambda *s, scale=1.0: torch.randn(*s, generator=g) * scale  # noqa: E731
    return {
        "emb": r(VOCAB, D),
        "decay": torch.linspace(0.5, 0.995, D),
        "g1": 1 + 0.1 * r(D),
        "w1": r(HID, D, scale=D**-0.5),
        "w2": r(D, HID, scale=HID**-0.5),
        "g2": 1 + 0.1 * r(D),
        "wlm": r(VOCAB, D, scale=2.5 * D**-0.5),
    }


class DoubleModel:
    def __init__(self, path: str, dtype: torch.dtype):
        self.path = path
        self.device = "cpu"
        self.tokenizer = ByteTokenizer()
        self.dtype = torch.float32 if path == "oracle" else dtype
        self.w = {k: v.to(self.dtype) if k != "decay" else v for k, v in _weights().items()}
        self._graphs: set[int] = set()
        self._prefix_cache: dict = {}

    # ---- math --------------------------------------------------------------------------
    def _std_forward(self, tok: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        w = self.w
        e = w["emb"][tok]
        s = w["decay"] * s + e.float()
        x = e + (0.2 * s).to(self.dtype)
        h = torch.nn.functional.rms_norm(x, (D,), w["g1"], 1e-6)
        f = torch.nn.functional.gelu(h @ w["w1"].T) @ w["w2"].T + h
        z = torch.nn.functional.rms_norm(f, (D,), w["g2"], 1e-6)
        return (z @ w["wlm"].T).float(), s

    def _fast_forward(self, tok: torch.Tensor, s: torch.Tensor, context: int) -> tuple[torch.Tensor, torch.Tensor]:
        w = self.w
        B = tok.shape[0]
        e = w["emb"][tok]
        with trace.layer(0):  # the block's events name its layer
            s = fast_path.recurrence(s, e, w["decay"], context)
            trace.engaged("recurrence", "fp32_state", batch=B)
            x = e + (0.2 * s).to(self.dtype)
            h = fast_path.rmsnorm(x, w["g1"])
            trace.engaged("norm", "fused", batch=B)
            f = fast_path.gemv(torch.nn.functional.gelu(fast_path.gemv(h, w["w1"])), w["w2"]) + h
            trace.engaged("gemv", "smallm" if B <= 2 else "splitk", batch=B)
        z = fast_path.rmsnorm(f, w["g2"])
        logits = fast_path.gemv(z, w["wlm"]).float()
        trace.engaged("lm_head", "gemv", batch=B)
        return logits, s

    def _in_scope(self, batch: int) -> bool:
        return self.path == "fast" and 1 <= batch <= fast_path.MAX_BATCH

    def _refuse(self, reason: str, **shape) -> None:
        if self.path == "fast":
            for c in COMPONENTS:
                trace.refused(c, reason, **shape)

    def _step(self, tok: torch.Tensor, s: torch.Tensor, context: int, kind: str = "decode"):
        """One step for a batch. Returns (logits fp32 [B, V], new state, fast?)."""
        B = tok.shape[0]
        if kind == "decode" and self._in_scope(B):
            if B not in self._graphs:  # emulate graph capture on first use, then replays
                self._graphs.add(B)
                with trace.capturing(("double", id(self), B)):
                    trace.engaged("decode_graph", "emulated", batch=B)
            trace.replayed(("double", id(self), B))
            logits, s = self._fast_forward(tok, s, context)
            return logits, s, True
        if kind == "decode":
            self._refuse("batch_out_of_scope", batch=B, context=context)
        else:
            self._refuse(kind, batch=B, context=context)
        logits, s = self._std_forward(tok, s)
        return logits, s, False

    def _prefill(self, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        self._refuse("prefill", batch=1, context=len(ids))
        key = tuple(ids)
        if key in self._prefix_cache:  # prefix cache: the same prompt is prefilled once
            rows, s = self._prefix_cache[key]
            return rows.clone(), s.clone()
        rows, s = self._prefill_uncached(ids)
        if len(self._prefix_cache) < 256:
            self._prefix_cache[key] = (rows.clone(), s.clone())
        return rows, s

    def _prefill_uncached(self, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        s = torch.zeros(1, D)
        logits = None
        rows = []
        for t in ids:
            logits, s = self._std_forward(torch.tensor([t]), s)
            rows.append(logits)
        return torch.cat(rows), s

    # ---- protocol ----------------------------------------------------------------------
    def score(self, token_ids: list[list[int]], prefill_len: int | None = None) -> list[torch.Tensor]:
        """Teacher forcing: rows from ``prefill_len`` on come from decode steps fed the true
        token (the fast path on the fast model), earlier ones from a prefill."""
        out = []
        for ids in token_ids:
            start = len(ids) if prefill_len is None else max(1, min(int(prefill_len), len(ids)))
            rows, s = self._prefill(ids[:start])
            rows = [rows]
            for i in range(start, len(ids)):
                logits, s, _ = self._step(torch.tensor([ids[i]]), s, i)
                rows.append(logits)
            out.append(torch.cat(rows))
        return out

    def _sample(self, logits, reqs, gens, matchers, fast: bool) -> list[int]:
        B = logits.shape[0]
        allowed = None
        if any(m is not None for m in matchers):
            import xgrammar as xgr

            allowed = torch.ones(B, VOCAB, dtype=torch.bool)
            bm = xgr.allocate_token_bitmask(1, VOCAB)
            for b, m in enumerate(matchers):
                if m is not None:
                    m.fill_next_token_bitmask(bm)
                    ids = torch.arange(VOCAB)
                    allowed[b] = ((bm[0].long()[ids >> 5] >> (ids & 31)) & 1).bool()
        noise = torch.ones(B, VOCAB)
        for b, g in enumerate(gens):
            if g is not None:
                noise[b].exponential_(1.0, generator=g)
        temps = [r.temperature for r in reqs]
        if fast:
            trace.engaged("sampler", "vectorised", batch=B)
            return fast_path.sample(logits, temps, [r.top_k for r in reqs], [r.top_p for r in reqs], noise, allowed,
                                V_REAL).tolist()
        return _std_sample(logits, reqs, noise, allowed)

    def generate(self, requests) -> list[Result]:
        import xgrammar as xgr

        matchers = []
        for r in requests:
            if r.structured:
                matchers.append(xgr.GrammarMatcher(_compile(r.structured)))
            else:
                matchers.append(None)
        gens = []
        for r in requests:
            gens.append(torch.Generator().manual_seed(int(r.seed)) if r.temperature > 0 else None)
        states, last = [], []
        for r in requests:
            rows, s = self._prefill(list(r.prompt_ids))
            states.append(s)
            last.append(rows[-1:])
        out = [[] for _ in requests]
        done = [False] * len(requests)
        finish = ["length"] * len(requests)
        logits = torch.cat(last)
        fast = False
        ctx = [len(r.prompt_ids) for r in requests]
        for step in range(max(r.max_tokens for r in requests)):
            active = [i for i in range(len(requests)) if not done[i]]
            if not active:
                break
            toks = self._sample(logits[active], [requests[i] for i in active], [gens[i] for i in active],
                                [matchers[i] for i in active], fast)
            for i, t in zip(active, toks):
                out[i].append(t)
                m = matchers[i]
                if m is not None:
                    if not m.accept_token(t):
                        done[i], finish[i] = True, "grammar_error"
                        continue
                    if m.is_terminated():
                        done[i], finish[i] = True, "grammar"
                        continue
                if t == EOS or t in requests[i].stop_token_ids:
                    done[i], finish[i] = True, "stop"
                elif len(out[i]) >= requests[i].max_tokens:
                    done[i] = True
            active = [i for i in range(len(requests)) if not done[i]]
            if not active:
                break
            tok = torch.tensor([out[i][-1] for i in active])
            s = torch.cat([states[i] for i in active])
            new_logits, s, fast = self._step(tok, s, max(ctx[i] + len(out[i]) for i in active))
            logits = torch.zeros(len(requests), VOCAB)
            for j, i in enumerate(active):
                states[i] = s[j:j + 1]
                logits[i] = new_logits[j]
        return [Result(o, self.tokenizer.decode(o), f) for o, f in zip(out, finish)]

    def decode_step(self, batch: int, context: int, draft: int = 0):
        tok = torch.arange(batch) % 256
        s = torch.randn(batch, D, generator=torch.Generator().manual_seed(context))

        def step():  # one whole decode step: model + sampler (greedy)
            logits, _, fast = self._step(tok, s, context)
            reqs = [_Greedy()] * batch
            return self._sample(logits, reqs, [None] * batch, [None] * batch, fast)

        return step

    def prefill_step(self, batch: int, context: int):
        tok = torch.arange(batch) % 256
        s = torch.zeros(batch, D)
        return lambda: self._step(tok, s, context, kind="prefill")

    def mixed_step(self, batch: int, context: int):
        tok = torch.arange(batch) % 256
        s = torch.zeros(batch, D)
        return lambda: self._step(tok, s, context, kind="mixed_batch")

    def close(self) -> None:
        pass


class _Greedy:
    temperature, top_k, top_p = 0.0, 0, 1.0


_GRAMMARS: dict[str, Any] = {}


def _compile(structured: dict):
    import xgrammar as xgr

    key = json.dumps(structured, sort_keys=True)
    if key not in _GRAMMARS:
        vocab = [bytes([i]) for i in range(256)] + [b"<bos>", b"<eos>"] + [b"<pad%d>" % i for i in range(6)]
        info = xgr.TokenizerInfo(vocab, vocab_size=VOCAB, stop_token_ids=[EOS])
        comp = xgr.GrammarCompiler(info)
        if "json_schema" in structured:
            sch = structured["json_schema"]
            _GRAMMARS[key] = comp.compile_json_schema(sch if isinstance(sch, str) else json.dumps(sch),
                                                      any_whitespace=False)
        else:
            _GRAMMARS[key] = comp.compile_regex(structured["regex"])
    return _GRAMMARS[key]


def _std_sample(logits, reqs, noise, allowed) -> list[int]:
    out = []
    for b, r in enumerate(reqs):
        x = logits[b].float().clone()
        x[V_REAL:] = float("-inf")
        if allowed is not None:
            x[~allowed[b]] = float("-inf")
        if r.temperature <= 0:
            out.append(int(torch.argmax(x)))
            continue
        x = x / r.temperature
        if 0 < r.top_k < VOCAB:
            x[x < torch.topk(x, r.top_k).values[-1]] = float("-inf")
        p = torch.softmax(x, -1)
        if r.top_p < 1:
            sp = torch.sort(p, descending=True).values
            idx = torch.nonzero(torch.cumsum(sp, -1) >= r.top_p)
            if idx.numel():
                p[p < sp[idx[0, 0]]] = 0
        q = p / p.sum()
        out.append(int(torch.argmax(torch.where(q > 0, q / noise[b], torch.full_like(q, -1.0)))))
    return out


# ---- kernel registry ---------------------------------------------------------------------------
@dataclass
class Kernel:
    name: str
    component: str
    fast: Any
    standard: Any
    oracle: Any
    make_inputs: Any
    shapes: list[dict]
    value_classes: list[str]
    dtypes: list[str]
    atol_floor: dict[str, float]
    k: float = 2.0
    deterministic: bool = True
    kernel_patterns: list[str] = field(default_factory=list)


_DT = {"float16": torch.float16, "float32": torch.float32, "bfloat16": torch.bfloat16}


def _gemv_inputs(shape, value_class, dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    m, n, k = shape["m"], shape["n"], shape["k"]
    x = torch.randn(m, k, generator=g)
    w = torch.randn(n, k, generator=g) * k**-0.5
    if value_class == "large":
        x = x * 300
    elif value_class == "near_zero":
        x = x * 1e-4
    elif value_class == "ties":
        x = torch.ones(m, k)
    return {"x": x.to(_DT[dtype]), "w": w.to(_DT[dtype])}


def _norm_inputs(shape, value_class, dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape["m"], shape["n"], generator=g)
    if value_class == "large":
        x = x * 1000
    elif value_class == "near_zero":
        x = x * 1e-3
    return {"x": x.to(_DT[dtype]), "g": (1 + 0.1 * torch.randn(shape["n"], generator=g)).to(_DT[dtype])}


def kernel_registry() -> list[Kernel]:
    return [
        Kernel("double_gemv", "gemv",
               fast=lambda x, w: fast_path.gemv(x, w),
               standard=lambda x, w: x @ w.T,
               oracle=lambda x, w: x.float() @ w.float().T,
               make_inputs=_gemv_inputs,
               shapes=[{"m": 1, "n": 64, "k": 32}, {"m": 3, "n": 67, "k": 48}, {"m": 8, "n": 264, "k": 32},
                       {"m": 2, "n": 129, "k": 64}],
               value_classes=["normal", "large", "near_zero", "ties"], dtypes=["float16", "float32"],
               atol_floor={"float32": 1e-5, "float16": 1e-3}, kernel_patterns=[r"^double_gemv"]),
        Kernel("double_rmsnorm", "norm",
               fast=lambda x, g: fast_path.rmsnorm(x, g),
               standard=lambda x, g: torch.nn.functional.rms_norm(x, (x.shape[-1],), g, 1e-6),
               oracle=lambda x, g: torch.nn.functional.rms_norm(x.float(), (x.shape[-1],), g.float(), 1e-6),
               make_inputs=_norm_inputs,
               shapes=[{"m": 1, "n": 32}, {"m": 5, "n": 33}, {"m": 8, "n": 64}],
               value_classes=["normal", "large", "near_zero"], dtypes=["float16", "float32"],
               atol_floor={"float32": 1e-5, "float16": 1e-3}, kernel_patterns=[r"^double_rmsnorm"]),
    ]


# The opt-in switch this double's fast path answers to (its spec's [switch]).
SWITCH = {"key": "decode_backend", "value": "latency_specialized"}


def switch_on(additional_config: Any) -> bool:
    """As a real engine decides: its own key with its own value, nothing else."""
    return bool(additional_config) and additional_config.get(SWITCH["key"]) == SWITCH["value"]


class TinyLMEngine:
    name = "double"

    def __init__(self, config: str = "tiny", device: str = "cpu", dtype: str = "float16", **_: Any):
        self.device = device
        self.dtype = dtype
        self._models: dict[str, DoubleModel] = {}

    def info(self) -> dict:
        return {"device": "cpu", "arch": "cpu", "device_name": "cpu", "model_config": "double",
                "dtype": self.dtype, "triton_interpreter": False, "switch": dict(SWITCH)}

    def load(self, path: str, *, additional_config: Any = None) -> DoubleModel:
        if path not in ("standard", "fast", "oracle"):
            raise ValueError(path)
        if path == "fast" and not switch_on(additional_config):
            path = "standard"  # switch off: the standard path, which reports nothing
        return DoubleModel(path, _DT[self.dtype])

    def components(self) -> list[Comp]:
        return [Comp(c, [rf"^double_{c}"], [rf"^std_{c}"], [0] if c in LAYERED else None) for c in COMPONENTS]

    def kernels(self) -> list[Kernel]:
        return kernel_registry()

    def fast_path_available(self):
        return True, ""
