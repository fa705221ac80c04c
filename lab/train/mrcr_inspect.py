"""Inside one MRCR document of the evals suite, on the standard path on the CPU (fp32): what a
weights file's layers do with the same-heading messages (the needles) it must choose between.

    python3 -m lab.train.mrcr_inspect W --bucket 8192 --doc 2 --what attention
    python3 -m lab.train.mrcr_inspect W --bucket 8192 --doc 2 --what heads
    python3 -m lab.train.mrcr_inspect W --bucket 16384 --doc 2 --what decay

``attention``: the prompt and the answer up to its heading line (the random string, then e.g.
"Short story about bees:"), teacher-forced; at that last position, where the next token is the
first that tells the needles apart, each MLA head's attention mass on each needle, and on its
first content token. ``heads``: at that position, the log-probability of each needle's first
content token with each MLA head silenced in turn, and each head's output gate. ``decay``: each
KDA layer's channels by half-life in tokens (ln 2 / the mean of -g over the document's
positions): how long a channel keeps half its state.
"""

from __future__ import annotations

import argparse
import contextlib
import math

import torch
import torch.nn.functional as F

from fastpath.engine import GenerationRequest
from fastpath.evals import mrcr
from lab.train import eval_tasks, probe


def half_lives(g: torch.Tensor) -> torch.Tensor:
    """Per-channel half-lives in tokens of log-decays g [positions, channels] (mean over positions)."""
    return math.log(2) / (-g.float().mean(0)).clamp_min(1e-9)


def document(tok, tier: str, bucket: int, doc: int) -> dict:
    rows = [r for r in eval_tasks.eval_documents(tier)["mrcr"]
            if mrcr.bucket_of(len(eval_tasks.render_mrcr(tok, r)[0])) == bucket]
    if not 0 <= doc < len(rows):
        raise SystemExit(f"mrcr_inspect: the {tier} tier has {len(rows)} MRCR documents in bucket {bucket}; "
                         f"--doc {doc} is not one of them")
    return rows[doc]


def find(ids: list[int], sub: list[int]) -> int:
    for s in range(len(ids) - len(sub) + 1):
        if ids[s:s + len(sub)] == sub:
            return s
    raise ValueError("mrcr_inspect: a needle's tokens are not in the prompt")


@contextlib.contextmanager
def wrapped(k3, method: str, wrap):
    """``k3.<method>`` replaced by ``wrap(inner)`` inside the block (inner: the model's own)."""
    setattr(k3, method, wrap(getattr(k3, method)))
    try:
        yield
    finally:
        delattr(k3, method)  # the instance attribute goes; the class's method is seen again


def prefill_results(loaded, ids: list[int], method: str) -> dict:
    """Each layer's result of ``K3Model.<method>(i, x)`` in the prefill of ``ids`` (its first call
    per layer), detached; the method is restored after."""
    seen: dict = {}

    def recording(inner):
        def record(i, x):
            out = inner(i, x)
            seen.setdefault(i, tuple(t.detach() for t in out))
            return out
        return record

    with wrapped(loaded.model, method, recording):
        loaded.generate([GenerationRequest(prompt_ids=ids, max_tokens=1)])
    return seen


def choice_prefix(tok, row: dict) -> tuple[list[int], list[str], int, str]:
    """(the prompt and the answer up to its heading line, teacher-forced; the needles' texts; the
    asked one's place; the heading line): after these ids the next token tells the needles apart."""
    prompt, target = eval_tasks.render_mrcr(tok, row)
    texts, asked = eval_tasks.mrcr_needles(row)
    heading = texts[0].split("\n", 1)[0] + "\n"
    forced = tok.encode(row["random_string_to_prepend"] + heading, bos=False)
    assert target[:len(forced)] == forced, "mrcr_inspect: the answer does not start with its heading"
    return list(prompt) + forced, texts, asked, heading


def attention(loaded, row: dict) -> None:
    tok, k3, cfg = loaded.tokenizer, loaded.model, loaded.model.cfg
    ids, texts, asked, heading = choice_prefix(tok, row)
    spans = [(s, s + n) for s, n in ((find(ids, t), len(t)) for t in (tok.encode(x, bos=False) for x in texts))]
    seen = prefill_results(loaded, ids, "_mla_q_c")  # q [1, T, H, nope], c [1, T, C]
    print(f"{len(ids)} tokens, {len(texts)} needles, the {mrcr.ordinal(asked)} asked; "
          "attention of the position after the answer's heading:")
    print("| layer | head | mass on needles 1.. | on their first content token |")
    print("|---:|---:|---|---|")
    last = len(ids) - 1
    for i, (q, c) in sorted(seen.items()):
        k = F.linear(c, k3.W(i, "kv_b")).unflatten(-1, (cfg.mla_heads, -1))[..., :cfg.qk_nope]
        p = (torch.einsum("hd,thd->ht", q[0, last], k[0, :last + 1]) * cfg.qk_nope ** -0.5).softmax(-1)
        for h in range(cfg.mla_heads):
            mass = " ".join(f"{p[h, s:e].sum():.2f}" for s, e in spans)
            first = " ".join(f"{p[h, s + len(heading)]:.2f}" for s, _ in spans)
            print(f"| {i} | {h} | {mass} | {first} |")


def heads(loaded, row: dict) -> None:
    """At the position after the answer's heading (as ``attention``): the log-probability of each
    needle's first content token, with every MLA head as it is and with each one silenced there in
    turn (its output zeroed at that position only), beside each head's output gate (mean over its
    values): which head's output the choice follows."""
    tok, k3, cfg = loaded.tokenizer, loaded.model, loaded.model.cfg
    ids, texts, asked, heading = choice_prefix(tok, row)
    skip = len(tok.encode(heading, bos=False))
    firsts = [tok.encode(t, bos=False)[skip] for t in texts]
    gates: dict[int, torch.Tensor] = {}

    def last_logprobs(silence: tuple[int, int] | None) -> torch.Tensor:
        def silencing(inner):
            def out(i, o, x):
                gate = torch.sigmoid(F.linear(x[0, -1], k3.W(i, "gate_proj")))
                gates.setdefault(i, gate.view(cfg.mla_heads, -1).mean(-1))
                if silence is not None and silence[0] == i:
                    o = o.clone()
                    o[:, -1, silence[1]] = 0
                return inner(i, o, x)
            return out

        with wrapped(k3, "_mla_out", silencing):
            logits = k3.prefill(torch.tensor([ids]), torch.tensor([len(ids)]), k3.new_state(1, len(ids) + 1))
        return logits[0].float().log_softmax(-1)

    def line(name: str, lp: torch.Tensor) -> str:
        per = [float(lp[t]) for t in firsts]
        best = max(range(len(per)), key=per.__getitem__)
        return f"| {name} | {' '.join(f'{v:.1f}' for v in per)} | {best + 1} |"

    print(f"{len(ids)} tokens, {len(texts)} needles, the {mrcr.ordinal(asked)} asked "
          f"(first content tokens {firsts}); log-probability of each needle's first content token:")
    print("| MLA head silenced | needles 1.. | the likeliest |")
    print("|---|---|---:|")
    print(line("none", last_logprobs(None)))
    mla = [i for i, kind in enumerate(cfg.layer_kinds) if kind == "mla"]
    for i in mla:
        for h in range(cfg.mla_heads):
            print(line(f"layer {i} head {h} (gate {float(gates[i][h]):.2f})", last_logprobs((i, h))))


def decay(loaded, row: dict) -> None:
    prompt, _ = eval_tasks.render_mrcr(loaded.tokenizer, row)
    seen = prefill_results(loaded, prompt, "_kda_gates")  # g [1, positions, H, K], beta
    print(f"{len(prompt)} tokens, {row['n_needles']} needles; KDA channels by half-life (tokens):")
    print("| layer | channels | max | 5th | 20th | median | > 2k | > 8k |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for i, (g, _) in sorted(seen.items()):
        hl = half_lives(g.flatten(0, -3).flatten(1))
        top = hl.sort(descending=True).values
        print(f"| {i} | {hl.numel()} | {top[0]:.0f} | {top[4]:.0f} | {top[19]:.0f} | {top[len(top) // 2]:.1f} | "
              f"{int((hl > 2048).sum())} | {int((hl > 8192).sum())} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("weights")
    ap.add_argument("--what", choices=("attention", "heads", "decay"), default="attention")
    ap.add_argument("--tier", default="full", choices=eval_tasks.TIERS)
    ap.add_argument("--bucket", type=int, default=8192, help="the MRCR bucket of the document")
    ap.add_argument("--doc", type=int, default=0, help="which of the bucket's documents")
    args = ap.parse_args(argv)
    loaded = probe.load_standard(args.weights)[0]
    row = document(loaded.tokenizer, args.tier, args.bucket, args.doc)
    print(f"{args.tier} MRCR document {args.doc} of bucket {args.bucket}: ", end="")
    {"attention": attention, "heads": heads, "decay": decay}[args.what](loaded, row)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
