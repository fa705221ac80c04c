"""``FastpathLM``: lm-evaluation-harness's ``LM`` over any fastpath Engine model.

Registered with lm-eval as ``"fastpath"``, so lm-eval's own entry points can build it too::

    lm_eval --model fastpath --model_args engine=embedded,path=fast,config=tiny,device=cpu,dtype=float16 ...

(``path``: standard | fast | oracle; "fast" is loaded with ``switch=KEY:VALUE``, default the
spec-style ``decode_backend:latency_specialized``), or wrap an already loaded model:
``FastpathLM(model)``. The same class runs every path: only the model differs.

- ``generate_until``: requests batched into ``Model.generate`` calls (at most ``max_batch``
  requests and ``max_prefill_tokens`` prompt tokens each, longest prompts first); each request's
  chat turns come from ``prompts.chat_turns`` (the document's message list for a task that
  names one in ``messages_fields``); lm-eval's generation kwargs map to the request:
  ``max_gen_toks`` -> max_tokens, ``until`` -> stop strings, ``do_sample``/``temperature``,
  ``top_p``, ``top_k``; the seed is derived from (``seed``, task, document, repeat), the same on
  every path and for every batching.
- ``loglikelihood``: the engine's teacher-forced ``Model.score`` with ``prefill_len`` before the
  continuation, so every continuation token is scored by a decode step (the fast path's).
- ``records``: per request (task, doc_id, repeat) the generated ids, their logprobs, the finish
  reason, the prompt length and the prompt ids, which lm-eval's string outputs do not carry
  (output agreement, oracle rescoring; never written to the bundle).
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

from fastpath.evals import require_lm_eval
from fastpath.evals.prompts import chat_turns

require_lm_eval()

from lm_eval.api.model import LM  # noqa: E402
from lm_eval.api.registry import register_model  # noqa: E402

from fastpath import progress  # noqa: E402
from fastpath.engine import GenerationRequest  # noqa: E402

DEFAULT_SWITCH = "decode_backend:latency_specialized"


def request_seed(seed: int, task: str | None, doc_id: int | None, repeat: int) -> int:
    """A 31-bit seed of one request: a function of its identity only (not of its batch)."""
    text = f"{seed}/{task}/{doc_id}/{repeat}".encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:4], "little") & 0x7FFFFFFF


def _switch(text: Any) -> dict[str, str]:
    if isinstance(text, dict):
        return {str(k): str(v) for k, v in text.items()}
    key, sep, value = str(text).partition(":")
    if not sep or not key or not value:
        raise ValueError(f"switch {text!r}: expected KEY:VALUE, e.g. {DEFAULT_SWITCH}")
    return {key: value}


@register_model("fastpath")
class FastpathLM(LM):
    def __init__(self, model: Any = None, *, engine: str | None = None, path: str = "standard",
                 switch: Any = DEFAULT_SWITCH, chat: bool = True, max_batch: int = 16,
                 max_prefill_tokens: int | None = None, max_gen_toks: int = 256, seed: int = 0,
                 messages_fields: dict[str, str] | None = None, reverse: bool = False, **engine_options: Any):
        super().__init__()
        if model is None:
            if not engine:
                raise ValueError("FastpathLM needs a loaded model or engine=NAME (e.g. engine=embedded)")
            from fastpath.engine import create_engine

            eng = create_engine(str(engine), **engine_options)
            model = eng.load(path, additional_config=_switch(switch)) if path == "fast" else eng.load(path)
        self.model = model
        self.tok = model.tokenizer
        self.chat = bool(chat)
        self.max_batch = max(1, int(max_batch))
        self.max_prefill_tokens = int(max_prefill_tokens) if max_prefill_tokens else None
        self.max_gen_toks = int(max_gen_toks)
        self.seed = int(seed)
        self.messages_fields = dict(messages_fields or {})
        self.reverse = bool(reverse)  # batch in the other order (the re-batched noise floor)
        self.records: dict[tuple[str | None, int | None, int], dict] = {}

    # -- prompts ---------------------------------------------------------------------------------
    def _prompt_ids(self, context: str, doc: dict | None, task: str | None) -> list[int]:
        if not self.chat:
            return list(self.tok.encode(context, bos=True))
        return list(self.tok.apply_chat_template(chat_turns(context, doc, self.messages_fields.get(task or ""))))

    def _batches(self, lengths: list[int]) -> list[list[int]]:
        """Request indices in batches: longest first (or reversed), at most max_batch requests
        and max_prefill_tokens prompt tokens per batch (a longer prompt goes alone)."""
        order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
        if self.reverse:
            order.reverse()
        batches: list[list[int]] = []
        for i in order:
            cur = batches[-1] if batches else None
            fits = cur is not None and len(cur) < self.max_batch and (
                self.max_prefill_tokens is None
                or (len(cur) + 1) * max(lengths[j] for j in cur + [i]) <= self.max_prefill_tokens)
            if fits:
                cur.append(i)
            else:
                batches.append([i])
        return batches

    # -- lm-eval's LM -----------------------------------------------------------------------------
    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        seen: dict[tuple, int] = {}
        reqs, keys = [], []
        for inst in requests:
            context, kwargs = inst.args[0], dict(inst.args[1] or {})
            ident = (inst.task_name, inst.doc_id)
            repeat = seen.get(ident, 0)
            seen[ident] = repeat + 1
            keys.append((inst.task_name, inst.doc_id, repeat))
            reqs.append(self._generation_request(self._prompt_ids(context, inst.doc, inst.task_name), kwargs,
                                                 request_seed(self.seed, inst.task_name, inst.doc_id, repeat)))
        out: list[str] = [""] * len(reqs)
        batches = self._batches([len(r.prompt_ids) for r in reqs])
        for n, batch in enumerate(batches, 1):
            progress.note(f"{self.model.path}: generate batch {n}/{len(batches)} ({len(batch)} requests, "
                          f"{max(reqs[i].max_tokens for i in batch)} tokens)")
            for i, res in zip(batch, self.model.generate([reqs[i] for i in batch])):
                out[i] = res.text
                self.records[keys[i]] = {"token_ids": list(res.token_ids), "logprobs": list(res.logprobs or []),
                                         "finish_reason": res.finish_reason, "prompt_tokens": len(reqs[i].prompt_ids),
                                         "max_tokens": reqs[i].max_tokens, "batch": len(batch),
                                         "prompt_ids": list(reqs[i].prompt_ids)}  # in memory only: oracle rescoring
        return out

    def _generation_request(self, ids: list[int], kwargs: dict, seed: int) -> GenerationRequest:
        until = kwargs.pop("until", None) or []
        until = [until] if isinstance(until, str) else [s for s in until if isinstance(s, str) and s]
        sample = bool(kwargs.get("do_sample", False))
        temperature = float(kwargs.get("temperature", 1.0 if sample else 0.0)) if sample else 0.0
        return GenerationRequest(prompt_ids=ids, max_tokens=int(kwargs.get("max_gen_toks", self.max_gen_toks)),
                                 temperature=temperature, top_p=float(kwargs.get("top_p", 1.0) or 1.0),
                                 top_k=int(kwargs.get("top_k", 0) or 0), seed=seed, stop_strings=until, logprobs=True)

    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        pairs = []
        for inst in requests:
            context, continuation = inst.args[0], inst.args[1]
            ctx = self._prompt_ids(context, inst.doc, inst.task_name) if context or self.chat else [self.tok.bos_id]
            pairs.append((ctx, list(self.tok.encode(continuation, bos=False))))
        return self._score_pairs(pairs)

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        pairs = [([self.tok.bos_id], list(self.tok.encode(inst.args[0], bos=False))) for inst in requests]
        return [lp for lp, _ in self._score_pairs(pairs)]

    def _score_pairs(self, pairs: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """Sum of the continuation's log-probabilities and whether greedy decoding gives it,
        every continuation token scored by a teacher-forced decode step."""
        import torch

        out: list[tuple[float, bool]] = [(0.0, True)] * len(pairs)
        for batch in self._batches([len(c) + len(x) for c, x in pairs]):
            todo = [i for i in batch if pairs[i][1]]  # an empty continuation has log-probability 0
            if not todo:
                continue
            seqs = [pairs[i][0] + pairs[i][1] for i in todo]
            prefill = max(1, min(len(pairs[i][0]) for i in todo) - 1)
            for i, logits in zip(todo, self.model.score(seqs, prefill_len=prefill)):
                ctx, cont = pairs[i]
                rows = torch.log_softmax(logits[len(ctx) - 1:len(ctx) + len(cont) - 1].double(), dim=-1)
                target = torch.as_tensor(cont)
                lp = float(rows.gather(1, target[:, None]).sum())
                out[i] = (lp if math.isfinite(lp) else float("-inf"), bool((rows.argmax(-1) == target).all()))
        return out

    def get_model_info(self) -> dict:
        return {"fastpath_path": self.model.path, "chat": self.chat, "max_batch": self.max_batch}
