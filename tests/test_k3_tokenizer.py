"""K3-mini byte-level tokenizer: round trip, specials, padding, chat template."""

from __future__ import annotations

import pytest

from fastpath.engine import Tokenizer
from optimized_model.k3.tokenizer import N_BYTES, SPECIALS, K3Tokenizer


@pytest.fixture(scope="module")
def tok() -> K3Tokenizer:
    return K3Tokenizer()


def test_protocol_and_sizes(tok):
    assert isinstance(tok, Tokenizer)
    assert tok.n_real_tokens == N_BYTES + len(SPECIALS)
    assert tok.vocab_size % 64 == 0 and tok.vocab_size >= tok.n_real_tokens
    assert tok.vocab_size - tok.n_real_tokens < 64
    ids = {tok.bos_id, tok.eos_id, tok.pad_id, tok.end_turn_id, *tok.role_ids.values()}
    assert len(ids) == 7 and all(N_BYTES <= i < tok.n_real_tokens for i in ids)


@pytest.mark.parametrize(
    "text",
    ["", "hello world", "naïve café — 東京 🚀", "tabs\tand\nnewlines\r\n", "\x00\x7f end", "ß" * 50],
)
def test_round_trip_utf8(tok, text):
    ids = tok.encode(text)
    assert ids[0] == tok.bos_id
    assert ids[1:] == list(text.encode("utf-8"))
    assert tok.decode(ids) == text
    assert tok.encode(text, bos=False) == ids[1:]


def test_specials_never_from_text(tok):
    text = "".join(SPECIALS) + " <|eos|> <|padding_0|>"
    ids = tok.encode(text, bos=False)
    assert all(0 <= i < N_BYTES for i in ids)
    assert tok.decode(ids) == text


def test_specials_and_padding_never_decode(tok):
    body = tok.encode("ab", bos=False)
    noisy = [tok.bos_id, body[0], tok.eos_id, *range(tok.n_real_tokens, tok.vocab_size), body[1], tok.pad_id]
    assert tok.decode(noisy) == "ab"
    for i in range(N_BYTES, tok.vocab_size):
        assert tok.decode([i]) == "" and tok.token_bytes(i) == b""
    assert tok.is_padding(tok.vocab_size - 1) and not tok.is_padding(tok.eos_id)
    assert tok.is_special(tok.eos_id) and not tok.is_special(65)


def test_invalid_utf8_is_replaced_not_raised(tok):
    euro = "€".encode("utf-8")
    assert tok.decode(list(euro[:2])) == "\ufffd"
    assert tok.decode(list(euro)) == "€"


def test_chat_template_multi_turn(tok):
    turns = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "again?"},
    ]
    ids = tok.apply_chat_template(turns)
    r = tok.role_ids
    expected = (
        [tok.bos_id, r["system"], *b"be brief", tok.end_turn_id, r["user"], *b"hi", tok.end_turn_id,
         r["assistant"], *b"hello", tok.end_turn_id, r["user"], *b"again?", tok.end_turn_id, r["assistant"]]
    )
    assert ids == expected
    no_prompt = tok.apply_chat_template(turns, add_generation_prompt=False)
    assert no_prompt == expected[:-1]
    assert tok.decode(ids) == "be briefhihelloagain?"
    assert ids.count(tok.end_turn_id) == 4


def test_chat_template_rejects_unknown_role(tok):
    with pytest.raises(ValueError, match="role"):
        tok.apply_chat_template([{"role": "tool", "content": "x"}])
