"""Sample records for tests, the demo and benchmarks: valid by construction."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from flotilla import Envelope
from flotilla.records import ServiceLatencyIncreased

SERVICE_LATENCY_INCREASED = ServiceLatencyIncreased.TYPE


def latency_fact(
    incident: str, *, source: str = "/flotilla/health-agent", service: str = "checkout-api", p95_ms: float = 1840.0
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


def _remember(named: dict[str, Any], definition: dict[str, Any], enclosing: str | None) -> str | None:
    """Register a named type under its full and short names; return its namespace.

    A name without a namespace takes the enclosing one, as Avro specifies.
    """
    name = str(definition["name"])
    if "." in name:
        namespace: str | None = name.rsplit(".", 1)[0]
    else:
        namespace = definition.get("namespace", enclosing) or None
    short = name.rsplit(".", 1)[-1]
    named[short] = definition
    named[f"{namespace}.{short}" if namespace else short] = definition
    return namespace


_PRIMITIVES: dict[str, Any] = {
    "int": 1,
    "long": 1,
    "float": 0.5,
    "double": 0.5,
    "boolean": True,
    "bytes": b"x",
    "null": None,
}


def _sample_for(avro_type: Any, named: dict[str, Any], name: str, namespace: str | None) -> Any:
    """A plausible valid value for one Avro type (first non-null branch of a union)."""
    if isinstance(avro_type, list):
        non_null = [t for t in avro_type if t != "null"]
        return _sample_for(non_null[0], named, name, namespace) if non_null else None
    if isinstance(avro_type, str):
        for candidate in (avro_type, f"{namespace}.{avro_type}" if namespace else avro_type):
            if candidate in named:
                return _sample_for(named[candidate], named, name, namespace)
        return f"sample-{name}" if avro_type == "string" else _PRIMITIVES[avro_type]
    logical = avro_type.get("logicalType")
    kind = avro_type["type"]
    if logical == "uuid":
        return str(uuid.uuid4())
    if logical in ("timestamp-millis", "timestamp-micros"):
        return datetime.now(UTC).replace(microsecond=0)
    if kind == "record":
        inner = _remember(named, avro_type, namespace)
        return {f["name"]: _sample_for(f["type"], named, f["name"], inner) for f in avro_type["fields"]}
    if kind == "enum":
        _remember(named, avro_type, namespace)
        return avro_type["symbols"][0]
    if kind == "fixed":
        _remember(named, avro_type, namespace)
        return b"\0" * int(avro_type["size"])
    if kind == "array":
        return [_sample_for(avro_type["items"], named, name, namespace)]
    if kind == "map":
        return {"key": _sample_for(avro_type["values"], named, name, namespace)}
    return _sample_for(kind, named, name, namespace)


def sample_value(schema: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    """A valid value for a record schema, fields filled by type, then ``overrides``."""
    value = _sample_for(schema, {}, str(schema.get("name", "record")), None)
    assert isinstance(value, dict)
    return {**value, **overrides}
