"""Producer keys for tests that run fleet members in process (``flotilla.provenance``).

Every member signs what it emits and checks what it consumes. In process, one test key
stands for every producer, and a test that plays a producer (a health agent opening an
incident, say) signs its records with it through :func:`signed_headers`.
"""

from __future__ import annotations

import tempfile
from functools import cache
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from flotilla.authority import Signer
from flotilla.envelope import Envelope
from flotilla.fleet import AGENTS
from flotilla.keys import public_key_text
from flotilla.provenance import SIGNATURE_HEADER, sign_fact


@cache
def _key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def fact_signer() -> Signer:
    return Signer(_key())


def producer_keys() -> dict[str, list[str]]:
    """Every member's key, as FLOTILLA_PRODUCER_KEYS holds it."""
    return {m.name: [public_key_text(_key().public_key())] for m in AGENTS}


@cache
def _scratch() -> Path:
    return Path(tempfile.mkdtemp(prefix="flotilla-test-keys-"))


def fact_settings(directory: Path | None = None) -> dict[str, Any]:
    """``signing_key_file`` and ``producer_keys`` for a member's settings; the key file is
    written into ``directory`` (0600; a scratch directory of this process by default)."""
    directory = directory or _scratch()
    path = directory / "fact-signing-key.pem"
    if not path.exists():
        directory.mkdir(parents=True, exist_ok=True)
        path.write_bytes(_key().private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
        path.chmod(0o600)
    return {"signing_key_file": path, "producer_keys": producer_keys()}


def signed_headers(envelope: Envelope, payload: bytes, signer: Signer | None = None) -> list[tuple[str, bytes]]:
    """The record's CloudEvents headers and its producer's signature over ``payload``."""
    signature = sign_fact(signer or fact_signer(), envelope, payload)
    return [*envelope.headers(), (SIGNATURE_HEADER, signature.encode())]


def assert_each_signs_and_all_believe(signers: dict[str, Signer], trust: dict[str, Any]) -> None:
    """Each member signs a record of a type it may state, and every member's provenance
    (``flotilla.provenance.Provenance``) believes it as that member's: the keys a deployment
    mounts and the keyrings it configures fit together."""
    from flotilla.provenance import PRODUCERS

    for producer, signer in signers.items():
        record_type = next(t for t, who in PRODUCERS.items() if producer in who)
        fact = Envelope(type=record_type, source=f"/flotilla/{producer}", correlationid="incident-1")
        payload = b"\x00\x00\x00\x00\x01payload"
        signature = sign_fact(signer, fact, payload)
        for member, provenance in trust.items():
            verified = provenance.verify(fact, payload, signature)
            assert (verified.producer, verified.key_id) == (producer, signer.key_id), member
