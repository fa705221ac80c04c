"""Parity's task-document sequences (fastpath/evals/sequences.py): exact lengths, seeded, made
of the documents the evals render, and apart from the evals' own documents."""

from __future__ import annotations

import pytest

from fastpath.evals import sequences
from optimized_model.k3.tokenizer import K3Tokenizer

TOK = K3Tokenizer()


@pytest.mark.parametrize("n", [1, 16, 64, 1024, 8192])
def test_exact_length_and_seeded(n):
    a = sequences.task_documents(TOK, 7, n)
    assert len(a) == n
    assert a == sequences.task_documents(TOK, 7, n)
    if n >= 16:  # rows of one batch differ (the seeded offset), however short
        assert len({tuple(sequences.task_documents(TOK, s, n)) for s in range(8)}) == 8


def test_documents_start_from_bos_and_hold_worked_answers():
    ids = sequences.task_documents(TOK, 3, 8192)
    text = TOK.decode(ids)
    assert ids[0] == TOK.bos_id and ids.count(TOK.bos_id) >= 2  # packed, each document from its own bos
    assert "\\boxed{" in text or "Prepend" in text


def test_seeds_lie_between_the_evals_and_training():
    from lab.train.eval_tasks import TRAIN_SEED_BASE

    top = sequences.SEED_BASE + (40_000_000 + 1) * sequences.DOCS_PER_SEED  # parity seeds reach ~3.3e7
    assert (1 << 31) < sequences.SEED_BASE and top < TRAIN_SEED_BASE


def test_bad_length_is_one_line():
    with pytest.raises(ValueError, match="n_tokens 0"):
        sequences.task_documents(TOK, 1, 0)
