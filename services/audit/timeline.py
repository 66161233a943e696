"""Incident views derived from the log: status, event times, timelines. Pure functions.

An incident's status is the incident workflow (:mod:`flotilla.workflow`) folded over its
records in log order, skipping what the workflow would not accept (duplicates, stale
records) and dead letters, exactly as a consumer following the workflow would see it.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from flotilla import IncidentState, Status, accepts, transition


def is_dead_letter_topic(topic: str) -> bool:
    return topic.endswith(".dlq")


def next_status(status: Status, record_type: str | None, topic: str) -> Status:
    """The incident's status after this record (unchanged if the workflow ignores it)."""
    if record_type is None or is_dead_letter_topic(topic):
        return status
    state = IncidentState(incident_id="-", status=status)
    if not accepts(state, record_type):
        return status
    return transition(state, record_type, event_id="-", at=datetime.now(UTC)).status


def event_time(ce_time: str | None, kafka_timestamp_ms: int | None, recorded_at: datetime) -> datetime:
    """When the record's fact happened: its ce_time, else its Kafka timestamp, else when
    the audit recorded it."""
    if ce_time:
        try:
            parsed = datetime.fromisoformat(ce_time)
            return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)
        except ValueError:
            pass
    if kafka_timestamp_ms is not None and kafka_timestamp_ms > 0:
        return datetime.fromtimestamp(kafka_timestamp_ms / 1000, tz=UTC)
    return recorded_at


@dataclass(frozen=True)
class TimelineRow:
    seq: int
    topic: str
    partition: int
    offset: int
    ce_id: str | None
    ce_type: str | None
    ce_source: str | None
    ce_causationid: str | None
    record_type: str | None
    at: datetime
    value_json: str | None
    value: bytes | None
    decode_error: str | None
    headers: str


def _iso(at: datetime) -> str:
    return at.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _context(headers_json: str) -> dict[str, str]:
    """A dead letter's dlq_* context headers, for showing why it died."""
    found: dict[str, str] = {}
    for item in json.loads(headers_json):
        name = str(item.get("name", ""))
        if name.startswith("dlq_") and isinstance(item.get("value"), str) and name not in found:
            found[name.removeprefix("dlq_")] = item["value"]
    return found


def timeline(
    rows: Sequence[TimelineRow], *, start: datetime | None = None, causes: Sequence[TimelineRow] = ()
) -> list[dict[str, Any]]:
    """Entries in the order things happened (event time, then log order), each with the
    time since ``start`` (the incident's first record; default: the earliest of ``rows``)
    and a link to the entry that caused it, among ``rows`` and ``causes`` (entries of the
    same incident on an earlier page)."""
    ordered = sorted(rows, key=lambda r: (r.at, r.seq))
    if not ordered:
        return []
    # A dead letter repeats its original's ce_id: causes point at the original.
    by_id: dict[str, TimelineRow] = {}
    for row in sorted((*rows, *causes), key=lambda r: (is_dead_letter_topic(r.topic), r.seq)):
        if row.ce_id and row.ce_id not in by_id:
            by_id[row.ce_id] = row
    start = ordered[0].at if start is None else start
    result = []
    for row in ordered:
        cause = by_id.get(row.ce_causationid or "")
        entry: dict[str, Any] = {
            "seq": row.seq,
            "topic": row.topic,
            "partition": row.partition,
            "offset": row.offset,
            "type": row.record_type or row.ce_type,
            "eventId": row.ce_id,
            "source": row.ce_source,
            "time": _iso(row.at),
            "elapsedMs": int((row.at - start).total_seconds() * 1000),
            "causationId": row.ce_causationid,
            "causedBy": None
            if cause is None
            else {"seq": cause.seq, "type": cause.record_type or cause.ce_type, "eventId": cause.ce_id},
            "value": None if row.value_json is None else json.loads(row.value_json),
        }
        if row.value_json is None and row.value is not None:
            entry["valueBase64"] = base64.b64encode(row.value).decode("ascii")
        if row.decode_error:
            entry["decodeError"] = row.decode_error
        if is_dead_letter_topic(row.topic):
            entry["deadLetter"] = _context(row.headers)
        result.append(entry)
    return result


def summary(row: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "incidentId": row["incident_id"],
        "status": row["status"],
        "firstAt": _iso(row["first_at"]),
        "lastAt": _iso(row["last_at"]),
        "entries": row["entries"],
    }
