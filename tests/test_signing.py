import base64
import copy
import json
import stat

import pytest
from securesystemslib.dsse import Envelope
from securesystemslib.exceptions import VerificationError
from securesystemslib.signer import CryptoSigner, SSlibKey

from bundle_factory import build
from fastpath import signing
from fastpath.bundle import MANIFEST, write_json
from fastpath.digest import sha256_file
from fastpath.signing import (PAYLOAD_TYPE, SignatureError, SigningError, build_statement, generate_keypair,
                              load_private_key, pae, sign_bundle, sign_envelope, verify_envelope)


def test_pae_reproduces_the_dsse_spec_vector():
    assert pae("http://example.com/HelloWorld", b"hello world") == b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
    assert pae("t", "é".encode()) == b"DSSEv1 1 t 2 \xc3\xa9"  # lengths in bytes


def test_keygen_private_0600_refuses_overwrite_and_default_outside_repo(tmp_path, monkeypatch):
    priv, pub, kid = generate_keypair(tmp_path / "k" / "a.key", tmp_path / "k" / "a.pub")
    assert stat.S_IMODE(priv.stat().st_mode) == 0o600
    assert kid == signing.keyid(load_private_key(priv).public_key()) and len(kid) == 64
    with pytest.raises(SigningError, match="refusing to overwrite"):
        generate_keypair(priv, tmp_path / "other.pub")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    dpriv, dpub, _ = generate_keypair()
    assert dpriv == tmp_path / "cfg/fastpath/keys/fastpath-ed25519.key" and dpub.suffix == ".pub"


def test_statement_binds_manifest_and_source(tmp_path):
    b = build(tmp_path, sign=False)
    st = build_statement(b.bundle, {"note": "x"})
    assert st["_type"] == "https://in-toto.io/Statement/v1"
    assert st["predicateType"] == signing.PREDICATE_TYPE
    subjects = {s["name"]: s["digest"]["sha256"] for s in st["subject"]}
    assert subjects["manifest.json"] == sha256_file(b.bundle / MANIFEST)[0]
    parts = json.loads((b.bundle / "attested.json").read_bytes())["parts"]
    assert sorted(subjects) == ["fastpath:fast_path", "fastpath:spec", "fastpath:subject", "fastpath:validation",
                                "manifest.json"]
    for part in ("fast_path", "validation", "subject", "spec"):
        assert subjects[f"fastpath:{part}"] == parts[part]["digest"]
    pred = st["predicate"]
    assert pred["tier"] == "full" and pred["hardware"] == "sm_90" and pred["note"] == "x"
    assert pred["spec"]["sha256"] == sha256_file(b.spec)[0]
    assert pred["gates"]["coverage_fast_path_fired"] == "pass"
    with pytest.raises(SigningError, match="cannot be overridden"):
        build_statement(b.bundle, {"tier": "full"})


def test_incomplete_run_is_never_signed(tmp_path):
    b = build(tmp_path, sign=False)
    summary = json.loads((b.bundle / "summary.json").read_bytes())
    write_json(b.bundle / "summary.json", {**summary, "complete": False, "verdict": "incomplete"})
    with pytest.raises(SigningError, match="incomplete"):
        sign_bundle(b.bundle, b.private_key)
    assert not (b.bundle / "statement.dsse.json").exists()


def test_bundle_edited_after_manifest_is_not_signed(tmp_path):
    b = build(tmp_path, sign=False)
    (b.bundle / "report.html").write_text("edited")
    with pytest.raises(SigningError, match="differ from manifest"):
        sign_bundle(b.bundle, b.private_key)


def _ssl_key(private_path):
    priv = load_private_key(private_path)
    return SSlibKey.from_crypto(priv.public_key(), keyid=signing.keyid(priv.public_key())), priv


def test_our_envelope_verifies_with_securesystemslib(tmp_path):
    b = build(tmp_path)
    env = json.loads((b.bundle / "statement.dsse.json").read_bytes())
    key, priv = _ssl_key(b.private_key)
    # Envelope.from_dict rewrites the signature dicts it is given, hence the copies.
    accepted = Envelope.from_dict(copy.deepcopy(env)).verify([key], 1)
    assert list(accepted) == [b.keyid]
    ours = verify_envelope(env, [priv.public_key()])
    assert ours == json.loads((b.bundle / "statement.json").read_bytes())


def test_securesystemslib_envelope_verifies_with_ours(tmp_path):
    priv_path, _, kid = generate_keypair(tmp_path / "a.key", tmp_path / "a.pub")
    key, priv = _ssl_key(priv_path)
    payload = json.dumps({"_type": signing.STATEMENT_TYPE, "subject": []}).encode()
    env = Envelope(payload, PAYLOAD_TYPE, {})
    env.sign(CryptoSigner(priv, key))
    assert verify_envelope(env.to_dict(), {kid: priv.public_key()})["_type"] == signing.STATEMENT_TYPE


def _tamper_payload(env):
    statement = json.loads(base64.b64decode(env["payload"]))
    statement["predicate"]["tier"] = "full-but-forged"
    return {**env, "payload": base64.b64encode(json.dumps(statement).encode()).decode()}


def _tamper_signature(env):
    sig = bytearray(base64.b64decode(env["signatures"][0]["sig"]))
    sig[0] ^= 1
    return {**env, "signatures": [{**env["signatures"][0], "sig": base64.b64encode(bytes(sig)).decode()}]}


@pytest.mark.parametrize("tamper", [_tamper_payload, _tamper_signature])
def test_tampering_is_rejected_by_both_implementations(tmp_path, tamper):
    b = build(tmp_path)
    env = tamper(json.loads((b.bundle / "statement.dsse.json").read_bytes()))
    key, priv = _ssl_key(b.private_key)
    with pytest.raises(VerificationError):
        Envelope.from_dict(copy.deepcopy(env)).verify([key], 1)
    with pytest.raises(SignatureError, match="does not verify"):
        verify_envelope(env, [priv.public_key()])


def test_untrusted_key_and_bad_envelopes(tmp_path):
    a, _, _ = generate_keypair(tmp_path / "a.key", tmp_path / "a.pub")
    other, _, _ = generate_keypair(tmp_path / "b.key", tmp_path / "b.pub")
    env = sign_envelope(b'{"_type": "https://in-toto.io/Statement/v1"}', load_private_key(a))
    with pytest.raises(SignatureError, match="untrusted"):
        verify_envelope(env, [load_private_key(other).public_key()])
    good = [load_private_key(a).public_key()]
    with pytest.raises(SignatureError, match="payloadType"):
        verify_envelope({**env, "payloadType": "text/plain"}, good)
    with pytest.raises(SignatureError, match="no signatures"):
        verify_envelope({**env, "signatures": []}, good)
    with pytest.raises(SignatureError, match="base64"):
        verify_envelope({**env, "payload": "!!!"}, good)
    not_statement = sign_envelope(b'{"x": 1}', load_private_key(a))
    with pytest.raises(SignatureError, match="Statement"):
        verify_envelope(not_statement, good)
