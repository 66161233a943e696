"""Appending a batch of records to the chain: one writer at a time, one transaction.

The batch's transaction first locks the chain head row, so appends from any thread or
replica serialize and the chain stays linear; the lock is held until the batch commits
(a batch is a few hundred rows and one round of pipelined INSERTs). A record already in
the log (same topic/partition/offset: a redelivery after a crash between the commit and
the offset commit) is skipped, not appended twice.

A record *published* twice (at-least-once outbox delivery, flotilla.delivery: Connect
re-publishes the rows of its last second after a crash) sits at two positions, so both are
entries, but the later one is an exact copy of the earlier (topic, key, headers and value,
event id included) and is marked ``redelivery_of`` that entry's seq: the log stays a log of
every record, and every view by event (the incident projection, timelines) counts each
event once. The mark is derived from the log (recomputable from it), so it is not sealed.

A value is decoded through the registry when it can be; when it cannot (poison, foreign
bytes, a schema id of the wrong kind) the entry keeps the raw bytes and says why, so no
record can stop the audit. Decoding failures caused by the registry being unreachable
are *not* recorded as undecodable: they fail the batch, which is retried.

Each record's producer signature is checked as every fleet consumer checks it
(:class:`flotilla.provenance.Provenance`, over the envelope :meth:`flotilla.Envelope.from_headers`
reads: a repeated ``ce_*`` header is no envelope) and the verdict is sealed with the entry: the
member that signed it, or why it is not believed. Anyone who can write a topic can write a
record; only verified records move the incident projection (status, times, count), so what
people are shown of an incident is what its producers signed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import psycopg
from confluent_kafka import Message
from prometheus_client import Counter

from flotilla import AfterCommit, AvroSerde, Envelope, RegistryUnavailableError, Status
from flotilla.authority import Unauthorized
from flotilla.provenance import Provenance, signature_header
from flotilla.rawrecords import first_header, headers_of, jsonable
from services.audit.chain import Entry, Sealed, Signer, headers_json, seal
from services.audit.timeline import event_time, folds, next_status

APPENDED = Counter("flotilla_audit_entries_total", "Records appended to the audit chain.", ["topic"])
REDELIVERED = Counter(
    "flotilla_audit_redeliveries_total",
    "Entries that are an exact copy of an earlier record (a re-published outbox row).",
    ["topic"],
)

_INSERT = """
INSERT INTO audit_log (seq, topic, partition, "offset", record_key, kafka_timestamp_ms, headers, ce_id, ce_type,
    ce_source, ce_time, ce_correlationid, ce_causationid, record_type, record_value, value_json, decode_error,
    recorded_at, prev_hash, entry_hash, signature, key_id, redelivery_of, verified_by, unverified)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
"""

_UPSERT_INCIDENT = """
INSERT INTO audit_incidents (incident_id, status, first_at, last_at, entries, first_seq, last_seq)
VALUES (%s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (incident_id) DO UPDATE SET status = EXCLUDED.status, first_at = EXCLUDED.first_at,
    last_at = EXCLUDED.last_at, entries = EXCLUDED.entries, first_seq = EXCLUDED.first_seq,
    last_seq = EXCLUDED.last_seq
"""


def canonical_json(value: Any) -> str:
    return json.dumps(jsonable(value), sort_keys=True, separators=(",", ":"), ensure_ascii=True)


class Recorder:
    """The raw loop's batch handler: records → sealed entries → the log."""

    def __init__(
        self,
        serde: AvroSerde,
        signer: Signer,
        provenance: Provenance,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self._serde = serde
        self._signer = signer
        self._provenance = provenance
        self._clock = clock or (lambda: datetime.now(UTC))

    def verdict(self, headers: list[tuple[str, bytes | None]], value: bytes | None) -> tuple[str | None, str | None]:
        """(the member that signed the record, None) or (None, why it is not believed)."""
        try:
            envelope = Envelope.from_headers(headers)
        except ValueError as exc:
            return None, f"no envelope: {exc}"[:2000]
        try:
            verified = self._provenance.verify(envelope, value or b"", signature_header(headers))
        except Unauthorized as exc:
            return None, f"{exc.refusal.value}: {exc}"[:2000]
        return verified.producer, None

    def entry(self, msg: Message, seq: int, recorded_at: datetime) -> Entry:
        headers = headers_of(msg.headers())
        raw_value = msg.value()
        value = raw_value.encode() if isinstance(raw_value, str) else raw_value
        raw_key = msg.key()
        key = raw_key.encode() if isinstance(raw_key, str) else raw_key
        ce_type = first_header(headers, "ce_type")
        record_type = value_json = decode_error = None
        if value is None:
            decode_error = "the record has no value"
        else:
            try:
                # A dead letter's value was written for its origin topic's subjects.
                decoded = self._serde.deserialize(value, topic=(msg.topic() or "").removesuffix(".dlq"))
            except RegistryUnavailableError:
                raise  # the registry is unwell: retry the batch rather than record a wrong verdict
            except Exception as exc:  # UndecodableRecordError or any surprise: the raw bytes are kept
                decode_error = f"{exc.__class__.__name__}: {exc}"[:2000]
            else:
                record_type = decoded.record_name
                value_json = canonical_json(decoded.value)
                if ce_type is not None and ce_type != record_type:
                    decode_error = f"the value is a {record_type} but ce_type says {ce_type}"
        kind, ts = msg.timestamp()
        verified_by, unverified = self.verdict(headers, value)
        return Entry(
            seq=seq,
            topic=msg.topic() or "",
            partition=msg.partition() or 0,
            offset=msg.offset() or 0,
            key=key,
            kafka_timestamp_ms=ts if kind != 0 and ts >= 0 else None,  # 0: TIMESTAMP_NOT_AVAILABLE
            headers=headers_json(headers),
            ce_id=first_header(headers, "ce_id"),
            ce_type=ce_type,
            ce_source=first_header(headers, "ce_source"),
            ce_time=first_header(headers, "ce_time"),
            ce_correlationid=first_header(headers, "ce_correlationid"),
            ce_causationid=first_header(headers, "ce_causationid"),
            record_type=record_type,
            value=value,
            value_json=value_json,
            decode_error=decode_error,
            recorded_at=recorded_at,
            verified_by=verified_by,
            unverified=unverified,
        )

    def __call__(self, conn: psycopg.Connection[Any], msgs: list[Message]) -> AfterCommit:
        head = conn.execute("SELECT seq, hash FROM audit_chain_head WHERE id = 1 FOR UPDATE").fetchone()
        if head is None:
            raise RuntimeError("audit_chain_head has no row: the migrations did not run")
        seq, previous = int(head[0]), bytes(head[1])
        present = _present(conn, msgs)
        sealed: list[Sealed] = []
        copies: dict[int, int] = {}
        now = self._clock()
        for msg in msgs:
            coordinates = (msg.topic() or "", msg.partition() or 0, msg.offset() or 0)
            if coordinates in present:
                continue
            present.add(coordinates)
            seq += 1
            item = seal(previous, self.entry(msg, seq, now), self._signer)
            sealed.append(item)
            previous = item.entry_hash
        if sealed:
            copies = redeliveries(conn, [s.entry for s in sealed])
            with conn.cursor() as cur:
                cur.executemany(_INSERT, [_row(s, copies.get(s.entry.seq)) for s in sealed])
            _project(conn, [s for s in sealed if s.entry.seq not in copies])
            conn.execute(
                "UPDATE audit_chain_head SET seq = %s, hash = %s, updated_at = now() WHERE id = 1", (seq, previous)
            )

        def after() -> None:
            for item in sealed:
                APPENDED.labels(item.entry.topic).inc()
                if item.entry.seq in copies:
                    REDELIVERED.labels(item.entry.topic).inc()

        return after


Copy = tuple[str, str | None, bytes | None, str, bytes | None]  # topic, event id, key, headers, value


def redeliveries(conn: psycopg.Connection[Any], entries: Sequence[Entry]) -> dict[int, int]:
    """seq -> the seq of the first entry it is an exact copy of, for each of ``entries`` (in
    seq order) that repeats an earlier entry of the log or of the batch; one indexed read."""
    wanted = [e for e in entries if e.ce_id is not None]
    if not wanted:
        return {}
    first: dict[Copy, int] = {}
    for seq, topic, ce_id, key, headers, value in conn.execute(
        "SELECT min(seq), topic, ce_id, record_key, headers, record_value FROM audit_log "
        "WHERE (topic, ce_id) IN (SELECT * FROM unnest(%s::text[], %s::text[])) AND redelivery_of IS NULL "
        "GROUP BY topic, ce_id, record_key, headers, record_value",
        ([e.topic for e in wanted], [e.ce_id for e in wanted]),
    ).fetchall():
        first[(topic, ce_id, _bytes(key), headers, _bytes(value))] = int(seq)
    copies: dict[int, int] = {}
    for e in wanted:
        key = (e.topic, e.ce_id, e.key, e.headers, e.value)
        if key in first:
            copies[e.seq] = first[key]
        else:
            first[key] = e.seq
    return copies


def _bytes(value: Any) -> bytes | None:
    return None if value is None else bytes(value)


def _present(conn: psycopg.Connection[Any], msgs: Sequence[Message]) -> set[tuple[str, int, int]]:
    rows = conn.execute(
        'SELECT topic, partition, "offset" FROM audit_log WHERE (topic, partition, "offset") IN '
        "(SELECT * FROM unnest(%s::text[], %s::int[], %s::bigint[]))",
        (
            [m.topic() or "" for m in msgs],
            [m.partition() or 0 for m in msgs],
            [m.offset() or 0 for m in msgs],
        ),
    ).fetchall()
    return {(str(t), int(p), int(o)) for t, p, o in rows}


def _row(item: Sealed, redelivery_of: int | None = None) -> tuple[Any, ...]:
    e = item.entry
    return (
        e.seq,
        e.topic,
        e.partition,
        e.offset,
        e.key,
        e.kafka_timestamp_ms,
        e.headers,
        e.ce_id,
        e.ce_type,
        e.ce_source,
        e.ce_time,
        e.ce_correlationid,
        e.ce_causationid,
        e.record_type,
        e.value,
        e.value_json,
        e.decode_error,
        e.recorded_at,
        item.prev_hash,
        item.entry_hash,
        item.signature,
        item.key_id,
        redelivery_of,
        e.verified_by,
        e.unverified,
    )


def _project(conn: psycopg.Connection[Any], sealed: Sequence[Sealed]) -> None:
    """Fold the new verified entries into the per-incident projection (status, first/last
    time, count). An event counts once: a verified record whose (topic, event id) an earlier
    verified entry already has (a copy re-sent with other unsigned headers) is left out."""
    folded = [
        s
        for s in sealed
        if s.entry.ce_correlationid
        and folds(
            topic=s.entry.topic,
            record_type=s.entry.record_type,
            decode_error=s.entry.decode_error,
            verified_by=s.entry.verified_by,
        )
    ]
    folded = _first_of_each_event(conn, folded)
    incidents = sorted({s.entry.ce_correlationid for s in folded if s.entry.ce_correlationid})
    if not incidents:
        return
    rows = conn.execute(
        "SELECT incident_id, status, first_at, last_at, entries, first_seq, last_seq FROM audit_incidents "
        "WHERE incident_id = ANY(%s) ORDER BY incident_id FOR UPDATE",
        (incidents,),
    ).fetchall()
    known: dict[str, list[Any]] = {str(r[0]): [Status(r[1]), *r[2:]] for r in rows}
    for item in folded:
        e = item.entry
        assert e.ce_correlationid is not None
        at = event_time(e.kafka_timestamp_ms, e.recorded_at)
        current = known.get(e.ce_correlationid)
        if current is None:
            known[e.ce_correlationid] = [next_status(Status.NEW, e.record_type, e.topic), at, at, 1, e.seq, e.seq]
            continue
        status, first_at, last_at, entries, first_seq, _ = current
        known[e.ce_correlationid] = [
            next_status(status, e.record_type, e.topic),
            min(first_at, at),
            max(last_at, at),
            entries + 1,
            first_seq,
            e.seq,
        ]
    with conn.cursor() as cur:
        cur.executemany(
            _UPSERT_INCIDENT,
            [(incident, v[0].value, *v[1:]) for incident, v in sorted(known.items()) if incident in incidents],
        )


def _first_of_each_event(conn: psycopg.Connection[Any], folded: Sequence[Sealed]) -> list[Sealed]:
    """``folded`` without the entries whose (topic, event id) a verified entry of lower seq
    has (in the log or earlier in the batch: the batch is already inserted); one indexed read."""
    if not folded:
        return []
    first: dict[tuple[str, str | None], int] = {}
    for topic, ce_id, seq in conn.execute(
        "SELECT topic, ce_id, min(seq) FROM audit_log WHERE (topic, ce_id) IN "
        "(SELECT * FROM unnest(%s::text[], %s::text[])) AND verified_by IS NOT NULL "
        "AND record_type IS NOT NULL AND decode_error IS NULL GROUP BY topic, ce_id",
        ([s.entry.topic for s in folded], [s.entry.ce_id for s in folded]),
    ).fetchall():
        first[(str(topic), ce_id)] = int(seq)
    return [s for s in folded if first.get((s.entry.topic, s.entry.ce_id), s.entry.seq) == s.entry.seq]
