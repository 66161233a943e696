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


def _remember(named: dict[str, Any], definition: dict[str, Any]) -> None:
    """Register a named type under its short and full names for later references."""
    name = str(definition["name"])
    short = name.rsplit(".", 1)[-1]
    namespace = definition.get("namespace")
    named[short] = definition
    named[name if "." in name or not namespace else f"{namespace}.{name}"] = definition


def _sample_for(avro_type: Any, named: dict[str, Any], name: str) -> Any:
    """A plausible valid value for one Avro type (first branch of a union)."""
    if isinstance(avro_type, list):
        non_null = [t for t in avro_type if t != "null"]
        return _sample_for(non_null[0], named, name) if non_null else None
    if isinstance(avro_type, str):
        if avro_type in named:
            return _sample_for(named[avro_type], named, name)
        return {
            "string": f"sample-{name}",
            "int": 1,
            "long": 1,
            "float": 0.5,
            "double": 0.5,
            "boolean": True,
            "bytes": b"x",
            "null": None,
        }[avro_type]
    logical = avro_type.get("logicalType")
    kind = avro_type["type"]
    if logical == "uuid":
        return str(uuid.uuid4())
    if logical in ("timestamp-millis", "timestamp-micros"):
        return datetime.now(UTC).replace(microsecond=0)
    if kind == "record":
        full = (
            avro_type["name"] if "." in avro_type["name"] else f"{avro_type.get('namespace', '')}.{avro_type['name']}"
        )
        named[full.lstrip(".")] = avro_type
        return {f["name"]: _sample_for(f["type"], named, f["name"]) for f in avro_type["fields"]}
    if kind == "enum":
        _remember(named, avro_type)
        return avro_type["symbols"][0]
    if kind == "array":
        return [_sample_for(avro_type["items"], named, name)]
    if kind == "map":
        return {"key": _sample_for(avro_type["values"], named, name)}
    if kind == "fixed":
        return b"\0" * int(avro_type["size"])
    return _sample_for(kind, named, name)


def sample_value(schema: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    """A valid value for a record schema, fields filled by type, then ``overrides``."""
    value = _sample_for(schema, {}, str(schema.get("name", "record")))
    assert isinstance(value, dict)
    return {**value, **overrides}
