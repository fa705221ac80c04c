"""K3-mini byte-level tokenizer.

Ids 0..255 are the raw bytes; then the special tokens (``SPECIALS``); then padding ids up to
``vocab_size``, a multiple of 64 (a realistic LM-head row count). Rules that every path relies on:

* ``encode`` maps text to its UTF-8 bytes only: text never produces a special or padding id
  (the literal text "<|eos|>" encodes as its 7 bytes).
* ``decode`` emits only byte ids: specials and padding ids are skipped, invalid UTF-8 becomes
  U+FFFD (``errors="replace"``).
* ``n_real_tokens`` = 256 + len(SPECIALS): ids at or above it are padding (the model / sampler
  mask them; they never decode to text).

Chat template (multi-turn, for MRCR)::

    <|bos|> (<|system|>|<|user|>|<|assistant|>) content-bytes <|end_turn|> ... [<|assistant|>]
"""

from __future__ import annotations

from typing import Sequence

N_BYTES = 256
SPECIALS = (
    "<|bos|>",
    "<|eos|>",
    "<|pad|>",
    "<|user|>",
    "<|assistant|>",
    "<|system|>",
    "<|end_turn|>",
    "<|reserved_0|>",
    "<|reserved_1|>",
)
VOCAB_MULTIPLE = 64
ROLES = ("system", "user", "assistant")


class K3Tokenizer:
    """Byte-level tokenizer implementing ``fastpath.engine.Tokenizer``."""

    def __init__(self, vocab_multiple: int = VOCAB_MULTIPLE):
        self.special_ids: dict[str, int] = {s: N_BYTES + i for i, s in enumerate(SPECIALS)}
        self.n_real_tokens = N_BYTES + len(SPECIALS)
        self.vocab_size = -(-self.n_real_tokens // vocab_multiple) * vocab_multiple
        self.bos_id = self.special_ids["<|bos|>"]
        self.eos_id = self.special_ids["<|eos|>"]
        self.pad_id = self.special_ids["<|pad|>"]
        self.end_turn_id = self.special_ids["<|end_turn|>"]
        self.role_ids = {r: self.special_ids[f"<|{r}|>"] for r in ROLES}

    # -- core ---------------------------------------------------------------------------
    def encode(self, text: str, *, bos: bool = True) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [self.bos_id] + ids if bos else ids

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        return bytes(int(i) for i in ids if 0 <= int(i) < N_BYTES)

    def decode(self, ids: Sequence[int]) -> str:
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    # -- vocabulary views -----------------------------------------------------------------
    def is_special(self, token_id: int) -> bool:
        return N_BYTES <= token_id < self.n_real_tokens

    def is_padding(self, token_id: int) -> bool:
        return self.n_real_tokens <= token_id < self.vocab_size

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a token contributes to text (b"" for specials and padding)."""
        return bytes([token_id]) if 0 <= token_id < N_BYTES else b""

    def id_to_piece(self, token_id: int) -> str:
        """Human-readable name of an id (for debugging / reports)."""
        if 0 <= token_id < N_BYTES:
            return repr(bytes([token_id]))
        if token_id < self.n_real_tokens:
            return SPECIALS[token_id - N_BYTES]
        return f"<|padding_{token_id - self.n_real_tokens}|>"

    # -- chat -----------------------------------------------------------------------------
    def apply_chat_template(
        self, turns: list[dict[str, str]], *, add_generation_prompt: bool = True
    ) -> list[int]:
        ids = [self.bos_id]
        for turn in turns:
            role = turn.get("role")
            if role not in self.role_ids:
                raise ValueError(f"unknown chat role {role!r}; allowed: {', '.join(ROLES)}")
            ids.append(self.role_ids[role])
            ids.extend(self.encode(str(turn.get("content", "")), bos=False))
            ids.append(self.end_turn_id)
        if add_generation_prompt:
            ids.append(self.role_ids["assistant"])
        return ids

    def __repr__(self) -> str:
        return f"K3Tokenizer(vocab_size={self.vocab_size}, n_real_tokens={self.n_real_tokens})"
