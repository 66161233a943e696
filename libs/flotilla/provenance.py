"""Who may state each fact: every record is signed by its one producer, and checked before
anything acts on it.

Kafka says nothing about who wrote a record, and anyone who can produce to ``incidents``
could otherwise open an incident, conclude its diagnosis with confidence 0.99, report a
recovery that never ran or close a saga. So each record type has its producers (the
table below: the health agent states detections and verifications, the diagnostic agent
diagnoses, the executor outcomes, …), each producer signs what it emits with its own key,
and every consumer loop verifies the signature against that producer's keys before a
handler, a workflow transition or a dedupe claim sees the record. What fails is
dead-lettered as ``unauthorized`` and moves nothing.

The signature travels as the ``ce_signature`` header (an outbox column placed as a
header, like the other CloudEvents attributes) and covers, in the canonical form the
command authorizations use (``flotilla.authority``), the record's identity (id, type,
source, incident, cause) and the SHA-256 of its exact payload bytes, Avro frame and
schema id included. So nothing of the value can change, and a signed payload cannot be
moved to another record. Verifying needs only the headers and the raw bytes: no decode.

A fact's signature says *who* stated it; what it may cause is still each handler's and the
workflow's to judge. The runtime's own reports (an escalation, a spent budget, a cut
loop) may come from any member that runs a consumer loop, each with its own key.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flotilla import fleet, metrics
from flotilla.authority import Refusal, Signer, Unauthorized, verify_signature
from flotilla.commands import COMMANDS_TOPIC
from flotilla.envelope import Envelope, RawHeaders, header_value
from flotilla.keys import Keyring
from flotilla.records import (
    BY_TYPE,
    AlertObserved,
    ApprovalExpired,
    BudgetExceeded,
    ChainAnchored,
    CommandDenied,
    CommandFailed,
    CommandRejected,
    CompensationCompleted,
    DeadLetterQuarantined,
    DependencyFailureSuspected,
    DiagnosisConcluded,
    DiagnosisRequested,
    DiagnosticJobStarted,
    HumanApprovalRequired,
    IncidentEscalated,
    LoopTerminated,
    RecoveryApproved,
    RecoveryCompleted,
    RecoveryExecuted,
    RecoveryFailed,
    RecoveryProposed,
    RecoveryRejected,
    ServiceDegraded,
    ServiceLatencyIncreased,
)

__all__ = [
    "FACT_DOMAIN",
    "PRODUCERS",
    "SIGNATURE_HEADER",
    "Provenance",
    "payload_digest",
    "producer_of",
    "sign_fact",
    "signature_header",
]

FACT_DOMAIN = b"flotilla/fact-signature/v1"
SIGNATURE_HEADER = "ce_signature"
_VERSION = "v1"

# Members whose consumer loop reports for the runtime (budgets, loops, escalations).
_LOOP_MEMBERS = frozenset(
    m.name for m in (fleet.HEALTH, fleet.DIAGNOSTIC, fleet.REMEDIATION, fleet.POLICY, fleet.EXECUTOR)
)


def _only(member: fleet.Member, *types: str) -> dict[str, frozenset[str]]:
    return {t: frozenset({member.name}) for t in types}


# Which producers may state each record type: the one table every consumer checks.
PRODUCERS: Mapping[str, frozenset[str]] = {
    **_only(
        fleet.HEALTH,
        ServiceLatencyIncreased.TYPE,
        ServiceDegraded.TYPE,
        AlertObserved.TYPE,
        DiagnosisRequested.TYPE,
        RecoveryCompleted.TYPE,  # a verification: the breach is over after the action
        RecoveryFailed.TYPE,
    ),
    **_only(fleet.DIAGNOSTIC, DiagnosisConcluded.TYPE, DependencyFailureSuspected.TYPE, DiagnosticJobStarted.TYPE),
    **_only(fleet.REMEDIATION, RecoveryProposed.TYPE),
    **_only(
        fleet.POLICY,
        HumanApprovalRequired.TYPE,
        RecoveryApproved.TYPE,
        RecoveryRejected.TYPE,
        CommandDenied.TYPE,
        ApprovalExpired.TYPE,
        *(t for t, cls in BY_TYPE.items() if cls.TOPIC == COMMANDS_TOPIC),
    ),
    **_only(
        fleet.EXECUTOR, RecoveryExecuted.TYPE, CommandFailed.TYPE, CommandRejected.TYPE, CompensationCompleted.TYPE
    ),
    **_only(fleet.DLQ_RECONCILER, DeadLetterQuarantined.TYPE),
    **_only(fleet.AUDIT, ChainAnchored.TYPE),
    **{t: _LOOP_MEMBERS for t in (IncidentEscalated.TYPE, BudgetExceeded.TYPE, LoopTerminated.TYPE)},
}

_SOURCE_PREFIX = "/flotilla/"


def producer_of(source: str) -> str | None:
    """The member a ``ce_source`` names (``/flotilla/<name>``), or None."""
    return source[len(_SOURCE_PREFIX) :] if source.startswith(_SOURCE_PREFIX) else None


def payload_digest(payload: bytes) -> str:
    return "sha256:" + hashlib.sha256(payload).hexdigest()


def _claims(envelope: Envelope, payload: bytes, kid: str) -> dict[str, Any]:
    return {
        "id": envelope.id,
        "type": envelope.type,
        "source": envelope.source,
        "correlationid": envelope.correlationid,
        "causationid": envelope.causationid,
        "payload": payload_digest(payload),
        "keyId": kid,
    }


def sign_fact(signer: Signer, envelope: Envelope, payload: bytes) -> str:
    """The ``ce_signature`` value of a record: ``v1:<key id>:<base64 signature>``."""
    signature = signer.sign(FACT_DOMAIN, _claims(envelope, payload, signer.key_id))
    return f"{_VERSION}:{signer.key_id}:{base64.b64encode(signature).decode('ascii')}"


def signature_header(headers: RawHeaders) -> str | None:
    """The ``ce_signature`` a record carries; None when it carries none or several (a
    repeated attribute is believed by no reader: :func:`flotilla.envelope.header_value`)."""
    raw = header_value(headers, SIGNATURE_HEADER)
    return None if raw is None else raw.decode("ascii", errors="replace")


@dataclass(frozen=True)
class Verified:
    producer: str
    key_id: str


class Provenance:
    """Each producer's trusted keys, and the check every consumer loop makes.

    ``keys`` maps a member's name to its keyring (several keys while one rotates). A
    producer absent from it is trusted for nothing, so a consumer that was never told a
    producer's key refuses its records rather than believing them.
    """

    def __init__(self, keys: Mapping[str, Keyring]) -> None:
        self._keys = dict(keys)

    @classmethod
    def parse(cls, entries: Mapping[str, list[str]]) -> Provenance:
        return cls({name: Keyring.parse(texts) for name, texts in entries.items()})

    def __bool__(self) -> bool:
        return any(self._keys.values())

    def producers(self) -> list[str]:
        return sorted(name for name, ring in self._keys.items() if ring)

    def verify(self, envelope: Envelope, payload: bytes, signature: str | None) -> Verified:
        """Who stated the record, checked; raises Unauthorized saying why it is not believed."""
        what = f"{envelope.type.rsplit('.', 1)[-1]} {envelope.id}"
        allowed = PRODUCERS.get(envelope.type)
        if allowed is None:
            raise Unauthorized(Refusal.WRONG_PRODUCER, f"{what}: no producer may state a {envelope.type}")
        producer = producer_of(envelope.source)
        if producer not in allowed:
            raise Unauthorized(
                Refusal.WRONG_PRODUCER,
                f"{what} comes from {envelope.source!r}; only {', '.join(sorted(allowed))} may state it",
            )
        if signature is None:
            raise Unauthorized(Refusal.UNSIGNED, f"{what} from {producer} carries no {SIGNATURE_HEADER}")
        try:
            version, kid, encoded = signature.split(":", 2)
            raw = base64.b64decode(encoded, validate=True)
        except (ValueError, binascii.Error):
            raise Unauthorized(Refusal.MALFORMED, f"{what}: {SIGNATURE_HEADER} is not v1:<key id>:<base64>") from None
        if version != _VERSION:
            raise Unauthorized(Refusal.MALFORMED, f"{what}: signature version {version!r} is not {_VERSION}", kid)
        keyring = self._keys.get(producer) or Keyring(())
        verify_signature(keyring, FACT_DOMAIN, _claims(envelope, payload, kid), raw, kid, f"{what} from {producer}")
        return Verified(producer, kid)


# Refused facts, by the consumer that refused them, the record type and why (the type
# comes from a header anyone can set: bounded to the known types).
_TYPES = metrics.BoundedLabel(PRODUCERS, overflow="other")


def count_refused(consumer: str, record_type: str, refusal: Refusal) -> None:
    metrics.RECORDS_UNAUTHORIZED.labels(consumer, _TYPES(record_type), refusal.value).inc()
