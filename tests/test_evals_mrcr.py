"""MRCR: openai/mrcr's grader on hand-computed fixtures, the generator's rows (fields, types,
buckets, the needle it asks for), and choosing documents from user data."""

from __future__ import annotations

import difflib
import json

import pytest

from fastpath.evals import documents, mrcr
from fastpath.evals.data import write_jsonl


def count_bytes(msgs: list[dict]) -> int:
    """A byte-level chat template's length (K3-mini's: BOS, role + content + end per turn, assistant)."""
    return 2 + sum(len(m["content"].encode()) + 2 for m in msgs)


def test_grader_is_prefix_then_sequence_matcher_ratio():
    answer = "aB3dE6gH9jPoem about owls:\nsilver hollow"
    # missing or altered prefix: 0, however close the rest
    assert mrcr.grade("Poem about owls:\nsilver hollow", answer, "aB3dE6gH9j") == 0.0
    assert mrcr.grade("aB3dE6gH9Xoem about owls:\nsilver hollow", answer, "aB3dE6gH9j") == 0.0
    assert mrcr.grade("", answer, "aB3dE6gH9j") == 0.0
    # exact: 1; partial: SequenceMatcher.ratio of the stripped texts, 2 * matches / total length
    assert mrcr.grade(answer, answer, "aB3dE6gH9j") == 1.0
    got = mrcr.grade("aB3dE6gH9jPoem about cats", answer, "aB3dE6gH9j")
    a, b = "Poem about cats", "Poem about owls:\nsilver hollow"
    blocks = difflib.SequenceMatcher(None, a, b).get_matching_blocks()
    assert got == pytest.approx(2 * sum(m.size for m in blocks) / (len(a) + len(b)))
    # by hand: "Poem about" (10 chars) is all of the response and 10 of the answer's 15
    assert mrcr.grade("aB3dE6gH9jPoem about", "aB3dE6gH9jPoem about owls", "aB3dE6gH9j") == pytest.approx(2 * 10 / 25)
    assert mrcr.process_results({"answer": answer, "random_string_to_prepend": "aB3dE6gH9j"}, [answer]) == \
        {"mrcr_score": 1.0}


def test_generated_rows_have_exactly_the_openai_mrcr_fields_and_types():
    rows = mrcr.generate(7, [512, 2048], 3, count_bytes, max_gen_toks=3)
    assert len(rows) == 6
    for row in rows:
        assert set(row) == set(mrcr.FIELDS)
        for key, kind in mrcr.FIELDS.items():
            assert type(row[key]) is kind, key
        msgs = json.loads(row["prompt"])
        assert row["total_messages"] == len(msgs)
        assert row["n_chars"] == sum(len(m["content"]) for m in msgs)
        assert row["n_needles"] in (2, 4, 8)
        assert len(row["random_string_to_prepend"]) == 10
        # the final ask names the random string; the desired turn is the needle answer asked for
        assert row["random_string_to_prepend"] in msgs[-1]["content"] and msgs[-1]["role"] == "user"
        desired = msgs[row["desired_msg_index"]]
        assert desired["role"] == "assistant"
        assert row["answer"] == row["random_string_to_prepend"] + desired["content"]
        ask = msgs[row["desired_msg_index"] - 1]["content"]
        assert sum(m["content"] == ask for m in msgs) == row["n_needles"]
        mrcr.check_row(row)
    buckets = [mrcr.bucket_of(count_bytes(mrcr.messages(r))) for r in rows]
    assert buckets == [512] * 3 + [2048] * 3
    assert all(count_bytes(mrcr.messages(r)) <= mrcr.bucket_of(count_bytes(mrcr.messages(r))) - 3 for r in rows)


def test_generator_is_seeded_and_the_ordinal_asked_matches_the_answer():
    assert mrcr.generate(3, [1024], 2, count_bytes) == mrcr.generate(3, [1024], 2, count_bytes)
    assert mrcr.generate(3, [1024], 2, count_bytes) != mrcr.generate(4, [1024], 2, count_bytes)
    for row in mrcr.generate(11, [4096], 4, count_bytes):
        msgs = mrcr.messages(row)
        ask = msgs[row["desired_msg_index"] - 1]["content"]
        occurrences = [i + 1 for i, m in enumerate(msgs[:-1]) if m["content"] == ask]
        nth = occurrences.index(row["desired_msg_index"]) + 1
        assert f"the {mrcr.ordinal(nth)} (1 indexed)" in msgs[-1]["content"]


def test_buckets_are_powers_of_two_and_a_bad_row_is_named():
    assert [mrcr.bucket_of(n) for n in (1, 2, 3, 512, 513, 32768)] == [1, 2, 4, 512, 1024, 32768]
    with pytest.raises(ValueError, match="power of two"):
        mrcr.generate(0, [1000], 1, count_bytes)
    with pytest.raises(ValueError, match="lacks answer"):
        mrcr.check_row({k: 1 for k in mrcr.FIELDS if k != "answer"})
    with pytest.raises(ValueError, match="n_needles is str"):
        mrcr.check_row({**mrcr.generate(0, [512], 1, count_bytes)[0], "n_needles": "2"})


def test_user_data_is_chosen_per_bucket_and_too_little_is_a_clear_error(tmp_path):
    pool = mrcr.generate(5, [512, 2048], 4, count_bytes, max_gen_toks=8)
    write_jsonl(tmp_path / "mrcr.jsonl", pool)
    settings = {"mrcr": {"needles": [2], "data": "mrcr.jsonl",
                         "smoke": {"buckets": [512, 2048], "docs": 2, "max_gen_toks": 8}}}
    chosen = documents.mrcr_docs(settings, "smoke", 0, count_bytes, tmp_path)
    assert [mrcr.bucket_of(count_bytes(mrcr.messages(r))) for r in chosen] == [512, 512, 2048, 2048]
    assert all(r in pool for r in chosen)
    settings["mrcr"]["smoke"]["docs"] = 5
    with pytest.raises(ValueError, match=r"too few documents for buckets \{512: 4, 2048: 4\}"):
        documents.mrcr_docs(settings, "smoke", 0, count_bytes, tmp_path)


def test_a_draw_that_misses_its_bucket_draws_again_and_fitting_draws_never_change(monkeypatch):
    """The spec's full tier on the K3 byte tokenizer: a long filler popped by the trim left a
    bucket-1024 document below 512 tokens (it raised 'too small'); it now draws again."""
    from optimized_model.k3.tokenizer import K3Tokenizer

    tok = K3Tokenizer()
    count = lambda msgs: len(tok.apply_chat_template(msgs))  # noqa: E731 (the suite's count)
    rows = mrcr.generate(20261203, [1024, 2048], 4, count, max_gen_toks=320)
    assert [mrcr.bucket_of(count(mrcr.messages(r))) for r in rows] == [1024] * 4 + [2048] * 4
    assert all(count(mrcr.messages(r)) <= b - 320 for r, b in zip(rows, [1024] * 4 + [2048] * 4))
    smoke = mrcr.generate(20261203, [512, 2048], 3, count, max_gen_toks=3)
    monkeypatch.setattr(mrcr, "REDRAWS", 1)  # the first draw alone: what every fitting document was
    assert mrcr.generate(20261203, [512, 2048], 3, count, max_gen_toks=3) == smoke
    with pytest.raises(ValueError, match="too small"):
        mrcr.generate(20261203, [1024], 4, count, max_gen_toks=320)


def test_a_chat_template_that_refuses_an_empty_conversation_still_generates_the_same_documents():
    """Hugging Face chat templates (the vllm engine's tokenizer) refuse an empty conversation: a
    filler turn's cost is measured beside the final ask, which for a template rendering turn by
    turn is the same number (the same documents)."""

    def count_hf_like(msgs: list[dict]) -> int:
        if not msgs:
            raise ValueError("Cannot apply chat template to an empty conversation.")
        return count_bytes(msgs)

    assert mrcr.generate(7, [512, 2048], 3, count_hf_like, max_gen_toks=3) == \
        mrcr.generate(7, [512, 2048], 3, count_bytes, max_gen_toks=3)
