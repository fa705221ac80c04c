"""Signing: Ed25519 keys, in-toto Statement v1 and DSSE envelopes.

The statement's subjects bind the bundle: the sha256 of manifest.json (which lists every other
file's digest) and the four attested tree digests of attested.json, named ``fastpath:<part>``
(fast_path, validation, subject, spec). The predicate restates what the bundle's files say
(summary.json, environment.json, attested.json, spec.toml); `fastpath check` compares each claim. The envelope signs the canonical statement bytes
with PAE, exactly per the DSSE protocol:

    PAE(type, body) = "DSSEv1" SP LEN(type) SP type SP LEN(body) SP body   (LEN = ASCII decimal bytes)

keyid = sha256 of the raw 32-byte Ed25519 public key, in hex.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from pathlib import Path
from typing import Iterable, Mapping

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from fastpath.bundle import ATTESTED, ENVELOPE, MANIFEST, STATEMENT, build_manifest, write_json
from fastpath.digest import PARTS, canonical_json, sha256_bytes, sha256_file

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://fastpath.dev/verify/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
SUBJECT_PREFIX = "fastpath:"  # + a part of fastpath.digest.PARTS


class SigningError(Exception):
    """Signing refused (incomplete run, inconsistent bundle, key problems); ``fix`` says what to do."""

    def __init__(self, cause: str, fix: str = ""):
        super().__init__(cause)
        self.cause, self.fix = cause, fix


class SignatureError(Exception):
    """An envelope did not verify; the message says why."""


# --- keys ------------------------------------------------------------------------------------

def default_key_dir() -> Path:
    """~/.config/fastpath/keys (XDG_CONFIG_HOME honoured): outside any repository."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "fastpath" / "keys"


def default_private_key_path() -> Path:
    return default_key_dir() / "fastpath-ed25519.key"


def raw_public_bytes(public_key: Ed25519PublicKey) -> bytes:
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def keyid(public_key: Ed25519PublicKey) -> str:
    return sha256_bytes(raw_public_bytes(public_key))


def public_key_hex(public_key: Ed25519PublicKey) -> str:
    return raw_public_bytes(public_key).hex()


def generate_keypair(private_path: Path | None = None, public_path: Path | None = None) -> tuple[Path, Path, str]:
    """Create an Ed25519 key pair: private key PEM (mode 0600, never overwritten) + public PEM.

    Returns (private_path, public_path, keyid).
    """
    private_path = Path(private_path) if private_path else default_private_key_path()
    public_path = Path(public_path) if public_path else private_path.with_suffix(".pub")
    for p in (private_path, public_path):
        if p.exists():
            raise SigningError(f"{p} already exists; refusing to overwrite a key",
                               "keep signing with the existing key, or pass --out NEW_PATH for a second one")
    private_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    public_path.parent.mkdir(parents=True, exist_ok=True)
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    # O_EXCL + 0600 at creation: the key is never readable by others, not even briefly.
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    public_path.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return private_path, public_path, keyid(key.public_key())


def load_private_key(path: Path) -> Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as e:
        raise SigningError(f"cannot load private key {path}: {e}") from e
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningError(f"{path} is not an Ed25519 private key")
    return key


def parse_public_key(text: str | bytes) -> Ed25519PublicKey:
    """An Ed25519 public key from PEM or 64 hex digits (the trust policy accepts both)."""
    data = text.encode() if isinstance(text, str) else text
    stripped = data.strip()
    if stripped.startswith(b"-----BEGIN"):
        key = serialization.load_pem_public_key(stripped)
        if not isinstance(key, Ed25519PublicKey):
            raise ValueError("PEM key is not Ed25519")
        return key
    raw = bytes.fromhex(stripped.decode("ascii"))
    if len(raw) != 32:
        raise ValueError(f"Ed25519 public key must be 32 bytes, got {len(raw)}")
    return Ed25519PublicKey.from_public_bytes(raw)


def load_public_key(path: Path) -> Ed25519PublicKey:
    return parse_public_key(Path(path).read_bytes())


# --- DSSE ------------------------------------------------------------------------------------

def pae(payload_type: str, payload: bytes) -> bytes:
    t = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


def sign_envelope(payload: bytes, private_key: Ed25519PrivateKey, payload_type: str = PAYLOAD_TYPE) -> dict:
    sig = private_key.sign(pae(payload_type, payload))
    return {
        "payload": base64.b64encode(payload).decode("ascii"),
        "payloadType": payload_type,
        "signatures": [{"keyid": keyid(private_key.public_key()), "sig": base64.b64encode(sig).decode("ascii")}],
    }


def _b64(text, what: str) -> bytes:
    if not isinstance(text, str):
        raise SignatureError(f"{what} is not a base64 string")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as e:
        raise SignatureError(f"{what} is not valid base64: {e}") from e


def verify_envelope_keys(envelope: Mapping, public_keys: Mapping[str, Ed25519PublicKey] | Iterable[Ed25519PublicKey]
                         ) -> tuple[dict, list[str]]:
    """Verify a DSSE envelope; return (statement, keyids whose signature verified).

    ``public_keys``: keyid -> key, or an iterable of keys. Raises SignatureError with the reason.
    """
    keys = dict(public_keys) if isinstance(public_keys, Mapping) else {keyid(k): k for k in public_keys}
    if not isinstance(envelope, Mapping):
        raise SignatureError("envelope is not a JSON object")
    if envelope.get("payloadType") != PAYLOAD_TYPE:
        raise SignatureError(f"payloadType {envelope.get('payloadType')!r} is not {PAYLOAD_TYPE!r}")
    payload = _b64(envelope.get("payload"), "payload")
    sigs = envelope.get("signatures")
    if not isinstance(sigs, list) or not sigs:
        raise SignatureError("envelope has no signatures")
    message = pae(PAYLOAD_TYPE, payload)
    verified, unknown, bad = [], [], []
    for s in sigs:
        if not isinstance(s, Mapping):
            raise SignatureError("a signature entry is not a JSON object")
        kid = s.get("keyid")
        candidates = [(kid, keys[kid])] if kid in keys else list(keys.items()) if not kid else []
        if not candidates:
            unknown.append(str(kid))
            continue
        sig = _b64(s.get("sig"), "signature")
        for k_id, key in candidates:
            try:
                key.verify(sig, message)
                verified.append(k_id)
                break
            except InvalidSignature:
                bad.append(str(k_id))
    if not verified:
        if bad:
            raise SignatureError(f"signature by key {', '.join(bad)} does not verify (payload or signature tampered)")
        raise SignatureError(f"signed by untrusted key(s) {', '.join(unknown)}")
    try:
        statement = json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SignatureError(f"signed payload is not JSON: {e}") from e
    if not isinstance(statement, dict) or statement.get("_type") != STATEMENT_TYPE:
        raise SignatureError(f"signed payload is not an in-toto Statement v1 ({STATEMENT_TYPE})")
    return statement, sorted(set(verified))


def verify_envelope(envelope: Mapping, public_keys) -> dict:
    """The verified statement, or SignatureError."""
    return verify_envelope_keys(envelope, public_keys)[0]


# --- statement -------------------------------------------------------------------------------

def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_bytes())
    except (OSError, json.JSONDecodeError) as e:
        raise SigningError(f"cannot read {path.name} in {path.parent}: {e}",
                           "pass the NAME.fastpath/ directory that `fastpath verify` wrote") from e


def build_statement(bundle_dir: Path, predicate: dict | None = None) -> dict:
    """In-toto Statement v1 over the bundle; the predicate is read from the bundle's files.

    ``predicate`` adds extra keys; it may not override the ones derived from the bundle.
    """
    bundle_dir = Path(bundle_dir)
    summary = _read_json(bundle_dir / "summary.json")
    env = _read_json(bundle_dir / "environment.json")
    attested = _read_json(bundle_dir / ATTESTED)
    parts = attested.get("parts") or {}
    missing = [p for p in PARTS if not isinstance((parts.get(p) or {}).get("digest"), str)]
    if missing:
        raise SigningError(f"{ATTESTED} lacks the digests of {missing}; re-write the bundle with `fastpath verify`")
    derived = {
        "spec": {"path": env.get("spec_path"), "name": summary.get("spec"),
                 "sha256": sha256_file(bundle_dir / "spec.toml")[0]},
        "tier": summary.get("tier"),
        "verdict": summary.get("verdict"),
        "complete": summary.get("complete"),
        "hardware": env.get("hardware"),
        "gates": {name: (g.get("status") if isinstance(g, dict) else g)
                  for name, g in sorted((summary.get("gates") or {}).items())},
        "tool": {"name": "fastpath", "version": attested.get("harness_version")},
        "invocation": {"argv": env.get("argv"), "git": env.get("git"), "seeds": env.get("seeds")},
    }
    extra = dict(predicate or {})
    clash = sorted(set(extra) & set(derived))
    if clash:
        raise SigningError(f"predicate keys {clash} are derived from the bundle and cannot be overridden")
    return {
        "_type": STATEMENT_TYPE,
        "subject": [
            {"name": MANIFEST, "digest": {"sha256": sha256_file(bundle_dir / MANIFEST)[0]}},
            *({"name": SUBJECT_PREFIX + p, "digest": {"sha256": parts[p]["digest"]}} for p in PARTS),
        ],
        "predicateType": PREDICATE_TYPE,
        "predicate": {**derived, **extra},
    }


def sign_bundle(bundle_dir: Path, private_key_path: Path, predicate: dict | None = None) -> Path:
    """Write statement.json + statement.dsse.json. Returns the envelope path.

    Refuses an incomplete run (never signed) and a bundle whose files disagree with its manifest.
    """
    bundle_dir = Path(bundle_dir)
    summary = _read_json(bundle_dir / "summary.json")
    if summary.get("complete") is not True or summary.get("verdict") == "incomplete":
        raise SigningError("refusing to sign an incomplete run (summary.json: complete is not true)",
                           "finish the run with `fastpath verify --resume RUN_DIR` (it signs when given --key)")
    on_disk = build_manifest(bundle_dir)
    if _read_json(bundle_dir / MANIFEST).get("files") != on_disk["files"]:
        raise SigningError("bundle files differ from manifest.json; re-write the bundle before signing")
    key = load_private_key(private_key_path)
    statement = build_statement(bundle_dir, predicate)
    payload = canonical_json(statement)
    envelope = sign_envelope(payload, key)
    write_json(bundle_dir / STATEMENT, statement)
    write_json(bundle_dir / ENVELOPE, envelope)
    return bundle_dir / ENVELOPE
