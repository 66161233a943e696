"""Sample records for tests, the demo and benchmarks: valid by construction."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from flotilla.envelope import Envelope

SERVICE_LATENCY_INCREASED = "dev.flotilla.incidents.ServiceLatencyIncreased"


def latency_fact(
    incident: str, *, source: str = "/flotilla/tests", service: str = "checkout-api", p95_ms: float = 1840.0
) -> tuple[dict[str, Any], Envelope]:
    """A ServiceLatencyIncreased value and its envelope (same event id in both)."""
    event_id = str(uuid.uuid4())
    value: dict[str, Any] = {
        "eventId": event_id,
        "incidentId": incident,
        "service": service,
        "environment": "production",
        "p95LatencyMs": p95_ms,
        "thresholdMs": 500.0,
        "windowSeconds": 60,
        # timestamp-millis: keep the value exactly representable so round trips compare equal
        "observedAt": datetime.now(UTC).replace(microsecond=0),
    }
    envelope = Envelope(type=SERVICE_LATENCY_INCREASED, source=source, correlationid=incident, id=event_id)
    return value, envelope
