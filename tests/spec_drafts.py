"""The K3 spec's speculative-decoding switch, applied to its text: what the spec declares once
the full-tier reference bundle is re-made on the H200 with drafts (the comment at its [scope]
draft_lengths says why the switch is not on yet). Tests of the draft machinery load this."""

from __future__ import annotations

from pathlib import Path

REAL_SPEC = Path(__file__).resolve().parent.parent / "optimized_model" / "k3" / "fastpath.toml"

EDITS = (
    ("draft_lengths = [0]\n", "draft_lengths = [0, 3, 7]\nmax_verify_rows = 64\n"),
    ('context_out_of_scope = "context_out_of_scope" }',
     'context_out_of_scope = "context_out_of_scope", verify_rows = "verify_rows_out_of_scope" }'),
    ("speculative_decoding = false", "speculative_decoding = true"),
    ("context_lengths = [16, 64]\n", "context_lengths = [16, 64]\ndraft_lengths = [0, 3]\n"),
    # declared before measuring: AL 6 at draft 7 as in the K3 benchmark; 3.5 at draft 3 from the
    # same per-token acceptance (0.916, each draft accepted independently: (1 - a^(K+1)) / (1 - a))
    ("[perf]\n", "[perf]\nsynthetic_acceptance_length = { 3 = 3.5, 7 = 6.0 }\n"),
)
GATE = """
[gates.features_speculative]
suite = "features"
description = "speculative decoding keeps the outputs: greedy ids identical with and without n-gram drafts on both paths, or parted at a near-tie (drafts verified; the fast verify kernels at K + 1 tokens), sampled second tokens keep normal decoding's distribution (G-test), acceptance lengths reported (n-gram; synthetic, labelled)"
alpha = 0.001
"""


def with_drafts(text: str) -> str:
    for old, new in EDITS:
        assert text.count(old) == 1, f"the spec changed: {old!r} no longer occurs exactly once"
        text = text.replace(old, new)
    return text + GATE


def draft_spec(directory: Path) -> Path:
    """The real spec with drafts on, written as ``directory``/fastpath.toml."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "fastpath.toml"
    path.write_text(with_drafts(REAL_SPEC.read_text()))
    return path
