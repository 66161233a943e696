"""Who may cause an action: the policy service's signed command authorizations, and the
remediation agent's signed proposals.

Kafka tells a consumer nothing about who wrote a record: anyone who can produce to a
topic (a person with the CLI, a service whose outbox routes there, an operator re-queuing
a dead letter) can write a schema-valid one. So the two records that lead to action carry
a signature over what they claim, by a key only their rightful author holds:

- a command on ``commands`` carries an ``authorization`` signed by the policy service:
  command id, idempotency key, incident, proposal, the step's digest (which covers every
  field of the command), target, parameters, expiry, the proposal's digest, the decision
  (``auto`` by policy, or ``approved`` by a named person), the key id and when it was
  signed, and, when a person approved a change a dry run showed them, that change's
  digest (``expectedChange``: the executor dry-runs again and refuses another result).
  The executor verifies it before it takes a lease and refuses anything unsigned, signed
  by a key it does not trust, or changed after signing (the expiry is signed, so no one
  can extend it either);
- a RecoveryProposed carries an ``attestation`` signed by the remediation agent over the
  proposal's identity, proposer, digest (so every step), confidence and diagnosis, so the
  policy service believes ``proposedBy`` and ``confidence`` only from the agent.

Each signature covers ``<domain>\\n<canonical JSON of the claims>`` (flotilla.digest's
canonical form): the domain line keeps a signature made for one purpose from ever
verifying for another. Verification is pure (claims, keyring, clock in; a verdict out).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from flotilla import commands
from flotilla.digest import AUTHORIZATION_FIELD, canonical_json, step_digest
from flotilla.keys import Keyring, key_id, load_private_key

__all__ = [
    "ATTESTATION_FIELD",
    "AUTHORIZATION_FIELD",
    "Grant",
    "Refusal",
    "Signer",
    "Unauthorized",
    "attest_proposal",
    "authorize_command",
    "required_keyring",
    "required_signer",
    "verify_command",
    "verify_proposal",
    "verify_signature",
]

COMMAND_DOMAIN = b"flotilla/command-authorization/v1"
PROPOSAL_DOMAIN = b"flotilla/proposal-attestation/v1"
ATTESTATION_FIELD = "attestation"


class Grant(enum.StrEnum):
    """How the authority over a command was granted (the signed ``decision``)."""

    AUTO = "auto"  # the policies allowed it without a person
    APPROVED = "approved"  # a person approved its proposal's exact digest


class Refusal(enum.StrEnum):
    """Why a signed record is not believed; the code travels in facts and dead letters."""

    UNSIGNED = "unsigned"
    UNKNOWN_KEY = "unknown-key"
    BAD_SIGNATURE = "bad-signature"  # changed after signing, or signed by someone else
    MALFORMED = "malformed"  # the signature block itself is unreadable
    WRONG_PRODUCER = "wrong-producer"  # a fact from a member that may not state it (flotilla.provenance)


class Unauthorized(Exception):
    """A record whose signature does not hold; ``refusal`` says which check failed."""

    def __init__(self, refusal: Refusal, message: str, key_id: str | None = None) -> None:
        super().__init__(message)
        self.refusal = refusal
        self.key_id = key_id


class Signer:
    """One service's signing key."""

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        self._key = private_key
        self.public_key = private_key.public_key()
        self.key_id = key_id(self.public_key)

    def sign(self, domain: bytes, claims: Mapping[str, Any]) -> bytes:
        return self._key.sign(_message(domain, claims))


def required_signer(path: Path | None, *, setting: str, why: str) -> Signer:
    """The signing key a service cannot work without; refuses to go on without it
    (fail closed), naming the setting and why."""
    if path is None:
        raise ValueError(f"{setting} is not set: {why} (python -m flotilla.keys generate <file>)")
    return Signer(load_private_key(path))


def required_keyring(entries: Iterable[str], *, setting: str, why: str) -> Keyring:
    """The trusted public keys a verifier cannot work without; refuses an empty keyring."""
    keyring = Keyring.parse(entries)
    if not keyring:
        raise ValueError(f"{setting} is empty: {why} (python -m flotilla.keys public <key file>)")
    return keyring


def _message(domain: bytes, claims: Mapping[str, Any]) -> bytes:
    return domain + b"\n" + canonical_json(claims)


def _millis(at: datetime) -> datetime:
    """timestamp-millis carries milliseconds: cut the rest so the signed value survives Avro."""
    at = at.astimezone(UTC)
    return at.replace(microsecond=at.microsecond // 1000 * 1000)


def verify_signature(
    keyring: Keyring, domain: bytes, claims: Mapping[str, Any], signature: bytes, kid: str, what: str
) -> None:
    """``signature`` over ``domain`` and ``claims`` by key ``kid`` of ``keyring``, or Unauthorized."""
    public = keyring.get(kid)
    if public is None:
        raise Unauthorized(
            Refusal.UNKNOWN_KEY, f"{what} is signed with key {kid}, which is not trusted ({keyring.describe()})", kid
        )
    try:
        public.verify(signature, _message(domain, claims))
    except InvalidSignature:
        raise Unauthorized(
            Refusal.BAD_SIGNATURE, f"{what}'s signature by key {kid} does not verify: it was changed after signing", kid
        ) from None


def _block(value: Mapping[str, Any], field: str, what: str) -> Mapping[str, Any]:
    block = value.get(field)
    if block is None:
        raise Unauthorized(Refusal.UNSIGNED, f"{what} carries no {field}")
    if not isinstance(block, Mapping) or not isinstance(block.get("signature"), bytes | bytearray):
        raise Unauthorized(Refusal.MALFORMED, f"{what}'s {field} is not a signature block")
    return block


# ---------------------------------------------------------------- commands


@dataclass(frozen=True)
class Authorized:
    """A command whose authorization holds."""

    key_id: str
    decision: Grant
    approved_by: str
    proposal_digest: str
    expected_change: str | None = None  # the Change digest a person approved, if one was shown


def _command_claims(record_type: str, command: Mapping[str, Any], block: Mapping[str, Any]) -> dict[str, Any]:
    kind = commands.kind_of(record_type)
    if kind is None:
        raise Unauthorized(Refusal.MALFORMED, f"{record_type} is not a command")
    claims = {
        "commandType": record_type,
        "commandId": command["commandId"],
        "idempotencyKey": command["idempotencyKey"],
        "incidentId": command["incidentId"],
        "proposalId": command["proposalId"],
        "stepDigest": step_digest(command),
        "target": command["target"],
        "params": commands.params_of(kind, command),
        "expiresAt": command["expiresAt"],
        "proposalDigest": block["proposalDigest"],
        "decision": block["decision"],
        "approvedBy": block["approvedBy"],
        "keyId": block["keyId"],
        "signedAt": block["signedAt"],
    }
    # Claimed only when there is one: a command signed before the field (or without a
    # change shown) signs and verifies over exactly the claims it always had.
    if block.get("expectedChange") is not None:
        claims["expectedChange"] = block["expectedChange"]
    return claims


def authorize_command(
    signer: Signer,
    record_type: str,
    command: Mapping[str, Any],
    *,
    decision: Grant,
    approved_by: str,
    proposal_digest: str,
    now: datetime,
    expected_change: str | None = None,
) -> dict[str, Any]:
    """The command with its ``authorization``: the value the policy service issues.
    ``expected_change``: the digest of the change a person approved after a dry run."""
    block: dict[str, Any] = {
        "keyId": signer.key_id,
        "decision": decision.value,
        "approvedBy": approved_by,
        "proposalDigest": proposal_digest,
        "signedAt": _millis(now),
        "expectedChange": expected_change,
    }
    block["signature"] = signer.sign(COMMAND_DOMAIN, _command_claims(record_type, command, block))
    return {**command, AUTHORIZATION_FIELD: block}


def verify_command(keyring: Keyring, record_type: str, command: Mapping[str, Any]) -> Authorized:
    """The authorization of a decoded command, checked; raises Unauthorized saying why not.

    Expiry is not judged here: ``expiresAt`` is signed, so it cannot be moved, and what an
    expired but authentic command means is the executor's to say (it never runs it, but
    still reconciles one it may already have run before a crash)."""
    what = f"command {command.get('commandId')}"
    block = _block(command, AUTHORIZATION_FIELD, what)
    kid = str(block.get("keyId"))
    try:
        claims = _command_claims(record_type, command, block)
    except (KeyError, TypeError, ValueError) as exc:
        raise Unauthorized(Refusal.MALFORMED, f"{what}: cannot read what it claims: {exc!r}", kid) from None
    verify_signature(keyring, COMMAND_DOMAIN, claims, bytes(block["signature"]), kid, what)
    try:
        decision = Grant(block["decision"])
    except ValueError:
        raise Unauthorized(Refusal.MALFORMED, f"{what}: decision {block['decision']!r} is unknown", kid) from None
    expected = block.get("expectedChange")
    return Authorized(
        kid,
        decision,
        str(block["approvedBy"]),
        str(block["proposalDigest"]),
        None if expected is None else str(expected),
    )


# --------------------------------------------------------------- proposals


def _proposal_claims(proposal: Mapping[str, Any], block: Mapping[str, Any]) -> dict[str, Any]:
    reasoning = proposal["reasoning"]
    return {
        "incidentId": proposal["incidentId"],
        "proposalId": proposal["proposalId"],
        "proposedBy": proposal["proposedBy"],
        "diagnosisEventId": proposal["diagnosisEventId"],
        "digest": proposal["digest"],
        "confidence": reasoning["confidence"],
        "reasoner": reasoning["reasoner"],
        "proposedAt": proposal["proposedAt"],
        "keyId": block["keyId"],
        "signedAt": block["signedAt"],
    }


def attest_proposal(signer: Signer, proposal: Mapping[str, Any], *, now: datetime) -> dict[str, Any]:
    """The RecoveryProposed value with its ``attestation``: what the agent emits."""
    block: dict[str, Any] = {"keyId": signer.key_id, "signedAt": _millis(now)}
    block["signature"] = signer.sign(PROPOSAL_DOMAIN, _proposal_claims(proposal, block))
    return {**proposal, ATTESTATION_FIELD: block}


def verify_proposal(keyring: Keyring, proposal: Mapping[str, Any]) -> str:
    """The key id of a proposal's attestation, checked; raises Unauthorized saying why not.

    The digest it signs covers every step, so nothing of the plan can change either."""
    what = f"proposal {proposal.get('proposalId')}"
    block = _block(proposal, ATTESTATION_FIELD, what)
    kid = str(block.get("keyId"))
    try:
        claims = _proposal_claims(proposal, block)
    except (KeyError, TypeError, ValueError) as exc:
        raise Unauthorized(Refusal.MALFORMED, f"{what}: cannot read what it claims: {exc!r}", kid) from None
    verify_signature(keyring, PROPOSAL_DOMAIN, claims, bytes(block["signature"]), kid, what)
    return kid
