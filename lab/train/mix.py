"""Training batches from seeds: every batch is a pure function of (seed, step), so a resumed run
sees exactly the batches the lost one would have, and nothing but seeds travels to the GPU.

A step has one row length T (drawn by their token shares from ``Mix.short_lengths`` for the
first ``Mix.short_steps`` steps, then from ``Mix.lengths``) and ``tokens_per_step // T`` rows;
the first ``Mix.copy_steps`` steps hold copy tasks alone. A row is one MRCR conversation of
60-95 % of T, or as many AIME / JSON / copy documents as fit (each starts with its own bos, as
an eval prompt does; an AIME problem takes as many operations as the room left holds); the rest
is padding. The MRCR and AIME documents are the evals suite's own, on training seeds, rendered as
its adapter renders them (eval_tasks). The short steps are a curriculum for MRCR: training run 2
held MRCR's loss flat at 0.52-0.54 for 2,300 steps on rows of 2k-16k tokens, so retrieval is
first learnt from conversations of a few hundred tokens and two to four needles
(``MRCR_MIN_PROMPT_TOKENS``: the smallest the suite's generator makes is ~280 tokens of prompt,
~60 of answer).
Loss weights per target token: ``context_weight`` on the prompts (a small language-model signal
that keeps the next-token distributions over prompts confident, which parity measures), 0 on
padding, and on what the evals grade (the MRCR answer, the AIME solution, the JSON answer, the
copied text) weights that give each kind its ``loss_shares`` of the graded loss. Weighted 1 a
token (runs 1 and 2), AIME's long solutions carried 66 % of a long-row step's loss weight and
MRCR's answers 5 %: the retrieval those runs never learnt had the least of the gradient.
Documents whose content hash is held out for the evals are skipped (eval_tasks).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

from lab.train import copy_tasks, eval_tasks, json_tasks

KINDS = ("mrcr", "aime", "json", "copy")
MRCR_ANSWER_TOKENS = 320  # an upper bound of an MRCR answer (40 words, the random string, the turn end)
MRCR_MIN_PROMPT_TOKENS = 250  # the target below which the generator makes its smallest conversation
# the answer's tokens after its random string that pick which message of the heading it copies
MRCR_CHOICE_TOKENS = 16


@dataclass(frozen=True)
class Mix:
    tokens_per_step: int = 65536  # ~8000 steps in 15 minutes at the estimated 0.6 M tokens/s
    # row lengths and their shares of the tokens
    lengths: tuple[tuple[int, float], ...] = ((2048, 0.25), (4096, 0.3), (8192, 0.3), (16384, 0.15))
    # the first short_steps steps draw their row lengths from short_lengths (the curriculum)
    short_steps: int = 1500
    # and the first copy_steps of them hold copy tasks alone: on the tiny config copying appeared
    # after ~4-5 M tokens of copy rows alone, and not within 7-8 M tokens of a mix, whatever copy's
    # loss share (docs/k3-mini.md, the CPU trials), so the circuit is formed before the mix
    copy_steps: int = 200
    # the share of copy tasks that ask for a text by its place among texts of one heading
    # (copy_tasks.ordinal_pair), as MRCR does; runs 1-3 had none
    copy_ordinal: float = 0.0
    short_lengths: tuple[tuple[int, float], ...] = ((512, 0.3), (1024, 0.4), (2048, 0.3))
    # row kinds and their probabilities
    # copy rows (copy_tasks.py) teach the copying MRCR grades, which MRCR rows alone did not
    kinds: tuple[tuple[str, float], ...] = (("mrcr", 0.4), ("aime", 0.35), ("json", 0.1), ("copy", 0.15))
    context_weight: float = 0.1
    # the worked solutions' style (eval_tasks.STYLES): the first checkpoint, trained on "lines",
    # got whole products wrong; "columns" works them digit by digit; run 3 lost its place in the
    # problem's list until "numbered" named each step's operation as the problem labels it
    aime_style: str = "numbered"
    # each kind's share of the graded tokens' loss weight in a step (renormalised over the kinds
    # the step holds); None weighs every graded token 1, as runs 1 and 2 did
    loss_shares: tuple[tuple[str, float], ...] | None = (("mrcr", 0.3), ("aime", 0.4), ("json", 0.1), ("copy", 0.2))
    # the weight of an MRCR answer's first MRCR_CHOICE_TOKENS after its random string, relative to
    # its other tokens (inside MRCR's loss share): run 3's misses copy the wrong message of the
    # requested heading while the answers' per-token loss is ~0.005 (docs/k3-mini.md, session 28)
    mrcr_choice_weight: float = 1.0
    # the probability of each needle count of MRCR rows (None: the spec's counts alike, as the evals
    # draw them); run 3's weights miss every 8-needle document of the full tier (docs/k3-mini.md)
    mrcr_needles: tuple[tuple[int, float], ...] | None = None
    seed: int = 0


@dataclass
class Batch:
    tokens: torch.Tensor  # [B, T] int64, right-padded with pad ids
    lengths: torch.Tensor  # [B] int64
    weights: torch.Tensor  # [B, T] fp32: weight of predicting tokens[:, t] from position t - 1
    graded: torch.Tensor  # [B, T] bool: tokens[:, t] is one the evals grade (an answer, not a prompt)
    kind_ids: torch.Tensor  # [B, T] int8: index into KINDS of the document each token belongs to
    hashes: list[str] = field(default_factory=list)  # content hashes of the documents used
    kinds: dict[str, int] = field(default_factory=dict)  # tokens per row kind

    @property
    def target_tokens(self) -> float:
        return float(self.weights.sum())


def _choice(rng: random.Random, table) -> object:
    names, weights = zip(*table)
    return rng.choices(names, weights=weights)[0]


class _Row:
    def __init__(self, T: int, kind: str):
        self.T, self.kind, self.ids, self.w, self.graded = T, KINDS.index(kind), [], [], []

    def fits(self, n: int) -> bool:
        return len(self.ids) + n <= self.T

    def add(self, prompt: list[int], target: list[int], context_weight: float,
            target_weights: list[float] | None = None) -> None:
        # the first token of a document has no context inside it: weight 0
        self.ids += prompt + target
        self.w += [0.0] + [context_weight] * (len(prompt) - 1) + (target_weights or [1.0] * len(target))
        self.graded += [False] * len(prompt) + [True] * len(target)


def _seed(mix: Mix, step: int, row: int, attempt: int) -> int:
    return eval_tasks.TRAIN_SEED_BASE + ((mix.seed * 1_000_003 + step) * 4096 + row) * 64 + attempt


def _document(kind: str, tok, seed: int, room: int, aime_style: str, copy_ordinal: float = 0.0,
              mrcr_choice_weight: float = 1.0, mrcr_needles: tuple[tuple[int, float], ...] | None = None):
    """(prompt ids, target ids, content hash, target weights or None) of one document of ``kind``,
    or None if it is held out or does not fit ``room`` tokens."""
    weights = None
    if kind == "aime":
        steps = eval_tasks.aime_steps(seed, room, aime_style)
        if steps is None:
            return None
        doc = eval_tasks.aime_row(seed, steps)
        p, t = eval_tasks.render_aime(tok, doc, aime_style)
        h = eval_tasks.document_hash("aime25", doc)
    elif kind == "json":
        rng = random.Random(seed)
        if rng.random() < 0.5:
            i = rng.randrange(10000)
            p, t = eval_tasks.render_plain(tok, *json_tasks.features_pair(i, rng.choice(("json_schema", "regex"))))
        else:
            p, t = eval_tasks.render_chat(tok, *json_tasks.record_pair(seed))
        h = eval_tasks.content_hash(tok.decode(p))
    elif kind == "copy":
        ordinal = copy_ordinal and random.Random(f"copy-kind/{seed}").random() < copy_ordinal
        p, t = eval_tasks.render_chat(tok, *(copy_tasks.ordinal_pair if ordinal else copy_tasks.copy_pair)(seed))
        h = eval_tasks.content_hash(tok.decode(p))
    else:
        # the prompt fills 60-95 % of the row, less the longest answer
        target = int(room * random.Random(f"mrcr-length/{seed}").uniform(0.6, 0.95)) - MRCR_ANSWER_TOKENS
        row = eval_tasks.mrcr_row(seed, max(target, MRCR_MIN_PROMPT_TOKENS), tok, mrcr_needles)
        p, t = eval_tasks.render_mrcr(tok, row)
        h = eval_tasks.document_hash("mrcr", row)
    if h in eval_tasks.heldout_hashes() or len(p) + len(t) > room:
        return None
    if kind == "mrcr" and mrcr_choice_weight != 1.0:
        weights = mrcr_target_weights(tok, row, len(t), mrcr_choice_weight)
    return p, t, h, weights


def mrcr_target_weights(tok, row: dict, n: int, choice_weight: float) -> list[float]:
    """An MRCR answer's ``n`` token weights: ``choice_weight`` on the MRCR_CHOICE_TOKENS after the
    random string (where the answer shows which message it copies), 1 elsewhere."""
    start = len(tok.encode(row["random_string_to_prepend"], bos=False))
    return [choice_weight if start <= i < start + MRCR_CHOICE_TOKENS else 1.0 for i in range(n)]


def parse_kinds(text: str, flag: str = "--kinds") -> tuple[tuple[str, float], ...]:
    """``"copy=1"`` or ``"mrcr=0.4,aime=0.35,json=0.1,copy=0.15"`` as Mix.kinds (or loss_shares:
    ``flag`` names the option in the error)."""
    kinds = []
    for part in text.split(","):
        name, _, weight = part.partition("=")
        try:
            w = float(weight)
        except ValueError:
            w = -1.0
        if name not in KINDS or w < 0:
            raise SystemExit(f"{flag} {text!r}: each part is KIND=WEIGHT, KIND one of "
                             f"{', '.join(KINDS)} and WEIGHT a number >= 0")
        kinds.append((name, w))
    return tuple(kinds)


def _int_number_pairs(text: str) -> tuple[tuple[int, float], ...]:
    """``"1024=0.5,16384=0.5"`` as ((1024, 0.5), (16384, 0.5)); () if a part is not INTEGER=NUMBER."""
    try:
        return tuple((int(k), float(v)) for k, _, v in (part.partition("=") for part in text.split(",")))
    except ValueError:
        return ()


def parse_lengths(text: str) -> tuple[tuple[int, float], ...]:
    """``"1024=0.5,16384=0.5"`` as Mix.lengths (row tokens and their shares of the tokens)."""
    lengths = _int_number_pairs(text)
    if not lengths or any(T < 64 or w < 0 for T, w in lengths):
        raise SystemExit(f"--lengths {text!r}: each part is TOKENS=SHARE, TOKENS an integer >= 64 and "
                         "SHARE a number >= 0")
    return lengths


def parse_needles(text: str) -> tuple[tuple[int, float], ...]:
    """``"8=0.5,4=0.3,2=0.2"`` as Mix.mrcr_needles (needle counts of the spec and their probabilities)."""
    counts = eval_tasks.mrcr_needle_counts()
    needles = _int_number_pairs(text)
    if not needles or any(n not in counts or w < 0 for n, w in needles) or sum(w for _, w in needles) <= 0:
        raise SystemExit(f"--mrcr-needles {text!r}: each part is NEEDLES=WEIGHT, NEEDLES one of "
                         f"{', '.join(map(str, counts))} and WEIGHT a number >= 0, not all 0")
    return needles


def lengths_at(mix: Mix, step: int) -> tuple[tuple[int, float], ...]:
    """The row-length table of ``step``: the curriculum's short rows first."""
    return mix.short_lengths if step < mix.short_steps else mix.lengths


def kinds_at(mix: Mix, step: int) -> tuple[tuple[str, float], ...]:
    """The row-kind table of ``step``: copy tasks alone for the first copy_steps."""
    return (("copy", 1.0),) if step < mix.copy_steps else mix.kinds


def make_batch(mix: Mix, step: int, tok=None) -> Batch:
    if tok is None:  # in a worker process
        from optimized_model.k3.tokenizer import K3Tokenizer

        tok = K3Tokenizer()
    rng = random.Random(_seed(mix, step, 4095, 63))
    T = _choice(rng, lengths_at(mix, step))
    B = max(1, mix.tokens_per_step // T)
    rows, hashes, kinds = [], [], {}
    for r in range(B):
        kind = _choice(rng, kinds_at(mix, step))
        row = _Row(T, kind)
        for attempt in range(64):
            doc = _document(kind, tok, _seed(mix, step, r, attempt), T - len(row.ids), mix.aime_style,
                            mix.copy_ordinal, mix.mrcr_choice_weight, mix.mrcr_needles)
            if doc is None:
                if kind == "mrcr" or not row.ids:
                    continue  # a held-out or oversized document: draw the next seed
                break  # the packed row is full
            row.add(doc[0], doc[1], mix.context_weight, doc[3])
            hashes.append(doc[2])
            kinds[kind] = kinds.get(kind, 0) + len(doc[0]) + len(doc[1])
            if kind == "mrcr":
                break
        rows.append(row)
    tokens = torch.full((B, T), tok.pad_id, dtype=torch.int64)
    weights = torch.zeros(B, T, dtype=torch.float32)
    lengths = torch.zeros(B, dtype=torch.int64)
    kind_ids = torch.zeros(B, T, dtype=torch.int8)
    graded = torch.zeros(B, T, dtype=torch.bool)
    for i, row in enumerate(rows):
        n = len(row.ids)
        tokens[i, :n] = torch.tensor(row.ids)
        weights[i, :n] = torch.tensor(row.w)
        graded[i, :n] = torch.tensor(row.graded, dtype=torch.bool)
        kind_ids[i] = row.kind
        lengths[i] = max(n, 1)
    if mix.loss_shares is not None:
        _share_graded_weight(weights, graded, kind_ids, dict(mix.loss_shares))
    return Batch(tokens, lengths, weights, graded, kind_ids, hashes, kinds)


def _share_graded_weight(weights: torch.Tensor, graded: torch.Tensor, kind_ids: torch.Tensor,
                         shares: dict[str, float]) -> None:
    """Rescale the graded tokens' weights in place so that kind k's sum is its share (renormalised
    over the kinds present) of the graded total, which stays the number of graded tokens: the
    prompts' weight relative to the answers is unchanged, and so are the weights of one kind's
    tokens relative to each other (mrcr_choice_weight)."""
    masks = {k: graded & (kind_ids == i) for i, k in enumerate(KINDS)}
    counts = {k: int(m.sum()) for k, m in masks.items()}
    present = {k: shares.get(k, 0.0) for k, n in counts.items() if n > 0}
    norm, total = sum(present.values()), sum(counts.values())
    if norm <= 0:
        return
    for k, share in present.items():
        weights[masks[k]] *= share / norm * total / float(weights[masks[k]].sum())
