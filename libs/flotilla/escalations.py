"""Handing an incident to people: the one way every service builds ``IncidentEscalated``."""

from __future__ import annotations

from datetime import UTC, datetime

from flotilla.envelope import Envelope
from flotilla.records import IncidentEscalated

__all__ = ["ON_CALL", "escalation"]

ON_CALL = "on-call"  # the rota an escalated incident is routed to


def escalation(incident_id: str, reason: str, *, cause: Envelope, at: datetime | None = None) -> IncidentEscalated:
    """``IncidentEscalated`` for ``incident_id``, naming the record that made it necessary."""
    return IncidentEscalated(
        incident_id=incident_id,
        reason=reason,
        cause_event_id=cause.id,
        cause_type=cause.type,
        escalated_to=ON_CALL,
        escalated_at=at or datetime.now(UTC),
    )
