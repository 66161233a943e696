"""Incident views derived from the log: status, event times, timelines. Pure functions.

An incident's status is the incident workflow (:mod:`flotilla.workflow`) folded over its
*verified* records in log order (signed by their producer, checked as every fleet consumer
checks them), skipping what the workflow would not accept (duplicates, stale records) and
dead letters, exactly as a consumer following the workflow would see it. A record nobody
signed is in the log and in the timeline, marked, and moves nothing.

Times are the Kafka record timestamps, never ``ce_time``: that header is outside the
producer's signature, so anyone could date a record into 2099 and keep it at the top of
every list. A timestamp later than the moment the audit recorded the record is cut to that
moment (no record is from the future).
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


def event_time(kafka_timestamp_ms: int | None, recorded_at: datetime) -> datetime:
    """When the record was written: its Kafka timestamp, no later than when the audit
    recorded it; that moment when it has none."""
    if kafka_timestamp_ms is not None and kafka_timestamp_ms > 0:
        return min(datetime.fromtimestamp(kafka_timestamp_ms / 1000, tz=UTC), recorded_at)
    return recorded_at


NOT_CHECKED = "recorded before the audit checked producer signatures"


def folds(*, topic: str, record_type: str | None, decode_error: str | None, verified_by: str | None) -> bool:
    """Whether a record may move its incident's status and times: decoded, signed by its
    producer, and not a dead letter (a dead letter repeats a record, it states nothing)."""
    return (
        verified_by is not None and record_type is not None and decode_error is None and not is_dead_letter_topic(topic)
    )


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
    ce_time: str | None = None  # as claimed: outside the signature, shown, never ordered by
    verified_by: str | None = None
    unverified: str | None = None


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
            "claimedTime": row.ce_time,
            # Signed by its producer (who), or why not: an unverified record states nothing.
            "verified": row.verified_by is not None,
            "verifiedBy": row.verified_by,
            "unverified": None if row.verified_by is not None else (row.unverified or NOT_CHECKED),
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
    """An incident as its verified records make it (``entries`` counts those)."""
    return {
        "incidentId": row["incident_id"],
        "status": row["status"],
        "firstAt": _iso(row["first_at"]),
        "lastAt": _iso(row["last_at"]),
        "entries": row["entries"],
    }


def unverified_summary(incident_id: str) -> dict[str, Any]:
    """An incident only unverified records name: no status, no times, no verified entries."""
    return {"incidentId": incident_id, "status": None, "firstAt": None, "lastAt": None, "entries": 0}
