"""What the pages show, worked out from the services' answers. Pure functions.

Kept apart from the routes so the rules (which records are evidence, which are the
outcome, how a refusal reads to a person) are easy to test and to read.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from flotilla_ops.fleetapi import FleetApiError, FleetEndpoints

from flotilla.digest import command_digest
from flotilla.provenance import PRODUCERS

# Records that say how an incident ended up (or is ending up), in the order people ask.
OUTCOME_TYPES = (
    "RecoveryApproved",
    "RecoveryRejected",
    "ApprovalExpired",
    "CommandDenied",
    "RecoveryExecuted",
    "CommandFailed",
    "RecoveryCompleted",
    "RecoveryFailed",
    "CompensationCompleted",
    "IncidentEscalated",
    "BudgetExceeded",
)
GOOD = frozenset({"RecoveryApproved", "RecoveryExecuted", "RecoveryCompleted", "CompensationCompleted"})
BAD = frozenset(
    {
        "RecoveryRejected",
        "ApprovalExpired",
        "CommandDenied",
        "CommandFailed",
        "RecoveryFailed",
        "IncidentEscalated",
        "BudgetExceeded",
        "LoopTerminated",
    }
)
WAITING = frozenset({"HumanApprovalRequired"})
# Incident statuses (flotilla.workflow) after which nothing more is expected.
TERMINAL = frozenset({"RESOLVED", "REJECTED", "EXPIRED", "DENIED", "COMPENSATED", "ESCALATED"})


def short(record_type: str | None) -> str:
    """``dev.flotilla.incidents.RecoveryExecuted`` -> ``RecoveryExecuted`` (the audit
    timeline names records by their full name)."""
    return (record_type or "?").rsplit(".", 1)[-1]


def tone(record_type: str | None) -> str:
    """A CSS class for a record type: good, bad, waiting or plain."""
    record_type = short(record_type)
    if record_type in GOOD:
        return "good"
    if record_type in BAD:
        return "bad"
    if record_type in WAITING:
        return "waiting"
    return "plain"


def believed(entry: Mapping[str, Any]) -> bool:
    """Whether an audit timeline entry is what its producer signed: the audit verified the
    signature (``verifiedBy``: the member whose key did), and that member may state this type.

    Anyone who can write a topic can write a record that names any source; the audit keeps
    those too, marked. Only believed records are shown as what an agent concluded, decided
    or did; the others appear in the timeline, marked unverified, and nowhere else."""
    producer = entry.get("verifiedBy")
    return (
        entry.get("verified") is True
        and isinstance(producer, str)
        and producer in PRODUCERS.get(str(entry.get("type")), frozenset())
    )


def unverified_note(entry: Mapping[str, Any]) -> str | None:
    """Why an entry is not believed, for the page (None: it is)."""
    if believed(entry):
        return None
    return str(entry.get("unverified") or "not verified: its producer's signature was not checked or did not hold")


def is_terminal(status: str | None) -> bool:
    return (status or "").upper() in TERMINAL


def _looks_like_epoch_ms(name: str, value: Any) -> bool:
    return (
        isinstance(value, int)
        and not isinstance(value, bool)
        and 1_000_000_000_000 <= value < 10_000_000_000_000
        and (name.endswith("At") or name in ("deadline", "expiresAt", "time"))
    )


def show_value(name: str, value: Any) -> str:
    """One decoded field as text: timestamps also as UTC time, structures as JSON."""
    if _looks_like_epoch_ms(name, value):
        at = datetime.fromtimestamp(value / 1000, tz=UTC).isoformat(timespec="milliseconds")
        return f"{at.replace('+00:00', 'Z')} ({value})"
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=False)


def field_rows(value: Any) -> list[tuple[str, str]]:
    """A decoded record as (field, text) rows; a non-object value as one row."""
    if isinstance(value, Mapping):
        return [(str(k), show_value(str(k), v)) for k, v in value.items()]
    if value is None:
        return []
    return [("value", show_value("value", value))]


def pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False)


@dataclass(frozen=True)
class Diagnosis:
    """A record in the timeline that carries reasoning: what the agent concluded and why."""

    seq: int
    record_type: str
    source: str  # the member whose signature the audit verified
    summary: str
    confidence: float | None
    reasoner: str | None
    model: str | None
    evidence: list[dict[str, Any]]
    headline: list[tuple[str, str]] = field(default_factory=list)


_HEADLINE_FIELDS = ("suspectedDependency", "failureMode", "causeCategory", "service", "summary")


def diagnoses(timeline: Iterable[Mapping[str, Any]], proposal_id: str | None = None) -> list[Diagnosis]:
    """The diagnosis records of a timeline (every believed record whose decoded value holds
    a ``reasoning``) with their evidence, in timeline order. Proposals carry the same
    evidence again: only the one named by ``proposal_id`` is kept (its own reasoning, e.g.
    why this many replicas), and dead-lettered copies never are. A record its producer did
    not sign is never a diagnosis, whatever source it names (:func:`believed`)."""
    found = []
    for entry in timeline:
        value = entry.get("value")
        if not isinstance(value, Mapping) or str(entry.get("topic", "")).endswith(".dlq") or not believed(entry):
            continue
        if short(entry.get("type")) == "RecoveryProposed" and (
            proposal_id is None or str(value.get("proposalId")) != proposal_id
        ):
            continue
        reasoning = value.get("reasoning")
        if not isinstance(reasoning, Mapping):
            continue
        evidence = reasoning.get("evidence")
        confidence = reasoning.get("confidence")
        found.append(
            Diagnosis(
                seq=int(entry.get("seq", 0)),
                record_type=short(entry.get("type")),
                source=str(entry["verifiedBy"]),
                summary=str(reasoning.get("summary", "")),
                confidence=float(confidence) if isinstance(confidence, int | float) else None,
                reasoner=None if reasoning.get("reasoner") is None else str(reasoning.get("reasoner")),
                model=None if reasoning.get("model") is None else str(reasoning.get("model")),
                evidence=[dict(e) for e in evidence if isinstance(e, Mapping)] if isinstance(evidence, list) else [],
                headline=[(k, show_value(k, value[k])) for k in _HEADLINE_FIELDS if value.get(k) is not None],
            )
        )
    return found


def outcomes(timeline: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The timeline's believed decision and execution records (approval, execution,
    verification); an unsigned RecoveryCompleted is no outcome."""
    return [e for e in timeline if short(e.get("type")) in OUTCOME_TYPES and believed(e)]


def unverified(timeline: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The timeline's records nobody verified: listed, marked, never taken for a fact."""
    return [e for e in timeline if not believed(e)]


def digest_matches(steps: Any, digest: str | None) -> bool | None:
    """Whether ``digest`` is the digest of ``steps`` as shown (None: cannot tell)."""
    if not digest or not isinstance(steps, list) or not steps:
        return None
    try:
        return command_digest(steps) == digest
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class Problem:
    """A refusal or failure, as a person should read it."""

    status: int
    title: str
    message: str
    service: str
    problems: list[str] = field(default_factory=list)

    @property
    def http_status(self) -> int:
        """The console's own answer: 503 when the service is unreachable, 502 when it failed."""
        if self.status == 0:
            return 503
        if self.status >= 500:
            return 502
        return self.status


def _problems_of(detail: Any) -> list[str]:
    inner = detail.get("detail") if isinstance(detail, Mapping) else None
    listed = inner.get("problems") if isinstance(inner, Mapping) else None
    if isinstance(listed, Sequence) and not isinstance(listed, str):
        return [str(p) for p in listed]
    return []


def problem(exc: FleetApiError, endpoints: FleetEndpoints) -> Problem:
    service = endpoints.service_of(exc.url)
    message = exc.message
    if exc.status == 0:
        return Problem(0, f"{service} unreachable", f"{service} unreachable at {exc.url}: {message}", service)
    titles = {
        400: "Bad request",
        401: "Not signed in",
        403: "Refused: not allowed",
        404: "Not found",
        409: "Refused: conflict",
        422: "Refused: invalid",
    }
    title = titles.get(exc.status, f"{service} failed" if exc.status >= 500 else "Refused")
    return Problem(exc.status, title, message, service, _problems_of(exc.detail))


def decision_refusal(exc: FleetApiError, action: str) -> str:
    """Why an approve/reject was refused, in words (status first, then the service's own)."""
    detail = exc.message
    lowered = detail.lower()
    if exc.status == 403:
        hint = (
            "you may not decide on this proposal: it needs the approver role, "
            "and whoever proposed a plan cannot approve it"
        )
        return f"Refused (403): {hint}. The policy service said: {detail}"
    if exc.status == 409 and "digest mismatch" in lowered:
        return (
            "Refused (409 digest mismatch): the commands are not the ones shown on this page. "
            f"Nothing was {action}d; review the proposal again. The policy service said: {detail}"
        )
    if exc.status == 409 and "another change" in lowered:
        return (
            "Refused (409 another change): the changes the targets' dry runs show are not the ones on this "
            f"page. Nothing was {action}d; review the proposal again. The policy service said: {detail}"
        )
    if exc.status == 409 and ("deadline" in lowered or "expired" in lowered):
        return (
            "Refused (409 expired): the approval deadline has passed, the proposal expired and the "
            f"incident is escalated. The policy service said: {detail}"
        )
    if exc.status == 409 and "withdrawn" in lowered:
        return (
            "Refused (409 withdrawn): a target of this plan no longer exists in the estate, so the proposal "
            f"was withdrawn and the incident escalated. The policy service said: {detail}"
        )
    if exc.status == 409:
        return f"Refused (409): this proposal can no longer be {action}d. The policy service said: {detail}"
    if exc.status == 404:
        return f"Refused (404): the policy service does not know this proposal. {detail}"
    return f"Refused ({exc.status}): {detail}"
