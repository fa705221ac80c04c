"""The trust policy (bundles/trusted_keys.toml): which keys may attest which tiers."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastpath.check_context import TIERS, Fail
from fastpath.signing import keyid, parse_public_key


@dataclass(frozen=True)
class TrustedKey:
    keyid: str
    public_key: Any
    owner: str
    tiers: frozenset[str]


def load_trust(path: Path) -> dict[str, TrustedKey]:
    """keyid -> TrustedKey from bundles/trusted_keys.toml; a malformed or repeated entry is an error."""
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise Fail(f"cannot read trust policy {path}: {e}") from e
    keys = data.get("keys", [])
    if not isinstance(keys, list):
        raise Fail(f"{path}: keys must be an array of [[keys]] tables")
    out = {}
    for i, entry in enumerate(keys):
        where = f"{path}: keys[{i}]"
        if not isinstance(entry, dict):
            raise Fail(f"{where}: not a table")
        try:
            pub = parse_public_key(entry["public_key"])
        except (KeyError, ValueError, TypeError) as e:
            raise Fail(f"{where}: bad or missing public_key ({e})") from e
        kid = keyid(pub)
        if entry.get("keyid") != kid:
            raise Fail(f"{where}: keyid {entry.get('keyid')!r} does not match its public_key (expected {kid})")
        if kid in out:  # two entries for one key: which tiers would apply is ambiguous
            raise Fail(f"{where}: duplicate keyid {kid} (already listed for {out[kid].owner or 'another entry'}); "
                       "list each key once with all its tiers")
        tiers = entry.get("tiers", [])
        if not isinstance(tiers, list) or not tiers or not set(tiers) <= set(TIERS):
            raise Fail(f"{where}: tiers must be a non-empty subset of {list(TIERS)}, got {tiers!r}")
        out[kid] = TrustedKey(kid, pub, str(entry.get("owner", "")), frozenset(tiers))
    return out
