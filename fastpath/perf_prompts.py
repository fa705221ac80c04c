"""The perf suite's prompt cases: decode on the evals suite's own documents (``[perf] prompt_decode``).

The speedup cases time a step on a random state, where a router sees noise and spreads tokens
over its experts almost uniformly. A trained model on its own tasks routes unevenly (fewer or
more experts per step, some much more often), which moves the bytes a MoE step reads. A prompt
case measures that: the same documents the evals suite grades (same seed, same rendering as its
lm-eval adapter: MRCR's message list through the chat template, the aime25 prompt in one user
turn), the first ``batch`` of them prefilled on each path, then greedy decode of real tokens
(the engine's ``prompt_step``), timed in the suite's A B B A rounds from the same start each
segment. Reported, not gated: a trained model small enough to train in minutes is launch-bound,
so its speedup says how the fast path fares on real routing, not whether it beats a roofline.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastpath.evals import documents, sequences
from fastpath.evals.agreement import common_prefix


def eval_prompts(spec: Any, tier: str, tokenizer: Any, task: str, bucket: int | None, batch: int) -> list[list[int]]:
    """Token ids of the first ``batch`` documents the evals suite evaluates for ``task`` (MRCR: of
    ``bucket``), rendered as its adapter renders them."""
    ev = spec.evals
    spec_dir = Path(spec.path).parent
    if task == "mrcr":
        # one bucket's documents are drawn from a seed of their own: the same as in the full set
        one = {**ev, "mrcr": {**ev["mrcr"], tier: {**ev["mrcr"][tier], "buckets": [bucket]}}}
        rows = documents.mrcr_docs(one, tier, ev["seed"], sequences.count_tokens(tokenizer), spec_dir)
        render = sequences.render_mrcr
    elif task == "aime25":
        rows = documents.aime_docs(ev, tier, ev["seed"], spec_dir)
        render = sequences.render_aime
    else:
        raise ValueError(f"prompt cases know the tasks mrcr and aime25, not {task!r}")
    if len(rows) < batch:
        raise ValueError(f"{task}: {len(rows)} documents for a batch of {batch}; lower [perf] prompt_decode "
                         f"batch_sizes or raise [evals.{task}.{tier}] docs")
    return [render(tokenizer, row)[0] for row in rows[:batch]]


def token_agreement(a: list[list[int]], b: list[list[int]]) -> dict:
    """How far two greedy decodes of the same prompts agree: per sequence the common prefix, and
    the share of all tokens inside it (bf16 near-ties may fork them; the timing is per step either way)."""
    prefixes = [common_prefix(x, y) for x, y in zip(a, b)]
    total = sum(len(x) for x in a)
    return {"common_prefix": prefixes, "share": sum(prefixes) / total if total else 1.0}


def experts_per_layer(traffic: dict | None) -> float | None:
    """Mean distinct experts a step reads per MoE layer (None for a dense model or no roofline)."""
    touched = (traffic or {}).get("experts_touched") or []
    return sum(touched) / len(touched) if touched else None


def summary_table(rows: list[dict]) -> str:
    """The prompt cases as a markdown block of the perf summary."""
    if not rows:
        return ""
    head = ["prompts", "batch", "prompt tokens", "standard tok/s", "fast tok/s", "speedup [CI]", "MBU (fast)",
            "experts/layer real (random state)", "same tokens"]
    lines = ["### decode on the evals suite's prompts (reported, not gated)", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        real, rand = r.get("experts_per_layer"), r.get("random_experts_per_layer")
        experts = "–" if real is None else f"{real:.1f}" + ("" if rand is None else f" ({rand:.1f})")
        name = r["task"] + (f" c{r['bucket']}" if r.get("bucket") else "")
        cells = [name, str(r["batch"]), f"{min(r['prompt_tokens'])}-{max(r['prompt_tokens'])}",
                 f"{r['std_tok_s']:,.0f}", f"{r['fast_tok_s']:,.0f}",
                 f"{r['speedup']:.2f}x [{r['ci_low']:.2f}, {r['ci_high']:.2f}]",
                 "–" if r.get("mbu") is None else f"{100 * r['mbu']:.0f} %", experts,
                 f"{100 * r['token_agreement']:.0f} %" + ("" if r.get("fired") else " (fast path did not fire)")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
