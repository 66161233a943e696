"""Signing keys for tests that act as the policy service or the remediation agent.

Services verify what those two sign; a test that produces a command or a proposal itself
signs it with these keys, and gives the services under test their public keys (the
settings below). End-to-end tests use the running fleet's own keys instead
(``tests/e2e/fleet.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from flotilla import commands
from flotilla.authority import Grant, Signer, attest_proposal, authorize_command
from flotilla.keys import public_key_text

POLICY_KEY = Ed25519PrivateKey.generate()
AGENT_KEY = Ed25519PrivateKey.generate()
POLICY_SIGNER = Signer(POLICY_KEY)
AGENT_SIGNER = Signer(AGENT_KEY)


def public(signer: Signer) -> str:
    return public_key_text(signer.public_key)


def write_key(key: Ed25519PrivateKey, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    path.chmod(0o600)
    return path


def sign_command(
    value: Mapping[str, Any],
    record_type: str | None = None,
    *,
    signer: Signer = POLICY_SIGNER,
    grant: Grant = Grant.AUTO,
    approved_by: str = "policy-service",
    proposal_digest: str = "sha256:" + "0" * 64,
) -> dict[str, Any]:
    """``value`` as the policy service would issue it (``record_type`` guessed from the fields)."""
    kind = record_type or next(
        commands.record_type(k) for k, (_, own) in commands.KINDS.items() if set(own) <= set(value)
    )
    return authorize_command(
        signer,
        kind,
        value,
        decision=grant,
        approved_by=approved_by,
        proposal_digest=proposal_digest,
        now=datetime.now(UTC),
    )


def attest(value: Mapping[str, Any], signer: Signer = AGENT_SIGNER) -> dict[str, Any]:
    """A RecoveryProposed value as the remediation agent would emit it."""
    return attest_proposal(signer, value, now=datetime.now(UTC))
