"""The audit service's HTTP surface: incidents, timelines (in pages), chain verification
(shared between concurrent callers, :mod:`services.audit.sharedrun`), public key."""

from __future__ import annotations

import base64
from collections.abc import Callable
from datetime import datetime
from typing import Any

from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from fastapi import FastAPI, HTTPException, Query
from prometheus_client import Gauge
from psycopg.rows import dict_row

from flotilla import ServiceContext
from flotilla.keys import Keyring
from services.audit.anchors import AnchorsUnavailable
from services.audit.chain import (
    Anchor,
    ChainVerifier,
    Entry,
    Sealed,
    Signer,
    hold_anchors,
    sort_anchors,
)
from services.audit.sharedrun import Busy, SharedRun
from services.audit.timeline import (
    TimelineRow,
    event_time,
    is_dead_letter_topic,
    summary,
    timeline,
    unverified_summary,
)

CHAIN_OK = Gauge("flotilla_audit_chain_ok", "1 when the last /verify found the chain intact, 0 when broken.")

_COLUMNS = """seq, topic, partition, "offset", record_key, kafka_timestamp_ms, headers, ce_id, ce_type, ce_source,
    ce_time, ce_correlationid, ce_causationid, record_type, record_value, value_json, decode_error, recorded_at,
    prev_hash, entry_hash, signature, key_id, verified_by, unverified"""


# A timeline is served in pages of log order (an incident's records are whatever anyone
# produced with its correlation id: no bound but this one).
TIMELINE_PAGE = 500
MAX_TIMELINE_PAGE = 5000
_TIMELINE_COLUMNS = """seq, topic, partition, "offset", ce_id, ce_type, ce_source, ce_causationid, ce_time,
    kafka_timestamp_ms, recorded_at, record_type, value_json, record_value, decode_error, headers, verified_by,
    unverified"""


def _timeline_row(r: dict[str, Any]) -> TimelineRow:
    return TimelineRow(
        seq=r["seq"],
        topic=r["topic"],
        partition=r["partition"],
        offset=r["offset"],
        ce_id=r["ce_id"],
        ce_type=r["ce_type"],
        ce_source=r["ce_source"],
        ce_causationid=r["ce_causationid"],
        record_type=r["record_type"],
        at=event_time(r["kafka_timestamp_ms"], r["recorded_at"]),
        value_json=r["value_json"],
        value=None if r["record_value"] is None else bytes(r["record_value"]),
        decode_error=r["decode_error"],
        headers=r["headers"],
        ce_time=r["ce_time"],
        verified_by=r["verified_by"],
        unverified=r["unverified"],
    )


def _sealed(row: tuple[Any, ...]) -> Sealed:
    (seq, topic, partition, offset, key, ts, headers, ce_id, ce_type, ce_source, ce_time, corr, cause, record_type) = (
        row[:14]
    )
    value, value_json, decode_error, recorded_at, prev_hash, entry_hash, signature, key_id, verified_by, unverified = (
        row[14:]
    )
    recorded: datetime = recorded_at
    entry = Entry(
        seq=int(seq),
        topic=topic,
        partition=int(partition),
        offset=int(offset),
        key=None if key is None else bytes(key),
        kafka_timestamp_ms=None if ts is None else int(ts),
        headers=headers,
        ce_id=ce_id,
        ce_type=ce_type,
        ce_source=ce_source,
        ce_time=ce_time,
        ce_correlationid=corr,
        ce_causationid=cause,
        record_type=record_type,
        value=None if value is None else bytes(value),
        value_json=value_json,
        decode_error=decode_error,
        recorded_at=recorded,
        verified_by=verified_by,
        unverified=unverified,
    )
    return Sealed(entry, bytes(prev_hash), bytes(entry_hash), bytes(signature), key_id)


def verify_chain(
    ctx: ServiceContext,
    trusted: Keyring,
    anchors: Callable[[], list[Anchor]],
    batch: int = 1000,
) -> dict[str, object]:
    """Walk the whole log in one consistent snapshot, checking every link and signature
    against the trusted keys, then hold it against every published anchor.

    The anchors are read first: each names a head the log had before the snapshot, so an
    honest log contains every one of them. Only anchors signed by a trusted key are
    evidence (all of them are checked); the rest are listed as ``untrustedAnchors`` and
    never make the verdict broken: whoever can write the topic can publish them."""
    try:
        published = sort_anchors(anchors(), trusted)
    except AnchorsUnavailable as exc:
        raise HTTPException(503, {"error": f"no verdict without the anchors: {exc}"}) from None
    verifier = ChainVerifier(trusted)
    with ctx.pool.connection() as conn, conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        head = conn.execute("SELECT seq, hash FROM audit_chain_head WHERE id = 1").fetchone()
        if head is None:
            raise HTTPException(500, {"error": "the chain head row is missing"})
        with conn.cursor(name="audit_verify") as cur:
            cur.itersize = batch
            cur.execute(f"SELECT {_COLUMNS} FROM audit_log ORDER BY seq")
            while True:
                rows = cur.fetchmany(batch)
                if not rows or not verifier.feed(_sealed(r) for r in rows):
                    break
        anchored = conn.execute(
            "SELECT seq, entry_hash FROM audit_log WHERE seq = ANY(%s)", (published.seqs(),)
        ).fetchall()
    result = verifier.finish(int(head[0]), bytes(head[1]))
    against = hold_anchors(published, result.last_seq, {int(q): bytes(h) for q, h in anchored})
    broken = result.broken or against.broken
    ok = broken is None
    CHAIN_OK.set(1 if ok else 0)
    verdict = result.as_json()
    verdict.update(
        ok=ok,
        firstBroken=None if broken is None else {"seq": broken.seq, "problem": broken.problem},
        anchors=against.as_json(),
        untrustedAnchors=against.untrusted_json(),
        trustedKeys=sorted(trusted),
    )
    return verdict


def make_routes(
    signer: Signer, trusted: Keyring, anchors: Callable[[], list[Anchor]]
) -> Callable[[FastAPI, ServiceContext], None]:
    def routes(app: FastAPI, ctx: ServiceContext) -> None:
        @app.get("/incidents")
        def incidents(limit: int = Query(200, ge=1, le=5000)) -> dict[str, Any]:
            """Incidents with at least one verified record, latest (Kafka time) first."""
            with ctx.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
                rows = cur.execute(
                    "SELECT incident_id, status, first_at, last_at, entries FROM audit_incidents "
                    "ORDER BY last_at DESC, incident_id LIMIT %s",
                    (limit,),
                ).fetchall()
            return {"incidents": [summary(r) for r in rows]}

        @app.get("/incidents/{incident_id}/timeline")
        def incident_timeline(
            incident_id: str,
            limit: int = Query(TIMELINE_PAGE, ge=1, le=MAX_TIMELINE_PAGE),
            after: int = Query(0, ge=0),
        ) -> dict[str, Any]:
            """One page of the incident's records: those after log position ``after``, at most
            ``limit``; ``page.nextAfter`` is the ``after`` of the next page (None: the last).
            Every record is listed, each marked ``verified`` or why not; the status, times and
            count are its verified records' (null when only unverified records name it)."""
            with ctx.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
                head = cur.execute(
                    "SELECT incident_id, status, first_at, last_at, entries FROM audit_incidents "
                    "WHERE incident_id = %s",
                    (incident_id,),
                ).fetchone()
                # Exact copies of earlier records (re-published outbox rows) are in the log,
                # not in the timeline: an event happened once however often it was delivered.
                rows = cur.execute(
                    f"SELECT {_TIMELINE_COLUMNS} FROM audit_log WHERE ce_correlationid = %s AND seq > %s "
                    "AND redelivery_of IS NULL ORDER BY seq LIMIT %s",
                    (incident_id, after, limit + 1),  # one more: is there a next page?
                ).fetchall()
                more = len(rows) > limit
                rows = rows[:limit]
                if not rows and (head is None or after == 0):
                    raise HTTPException(404, {"error": f"no audited records for incident {incident_id}"})
                entries = [_timeline_row(r) for r in rows]
                # Causes on another page: one row per id (the original before its dead letters,
                # then the first), so the page still bounds what is read, however many records
                # repeat an id.
                own = {e.ce_id for e in entries if not is_dead_letter_topic(e.topic)}  # a copy is not the cause
                wanted = sorted({e.ce_causationid for e in entries if e.ce_causationid} - own)
                causes = []
                if wanted:
                    causes = cur.execute(
                        f"SELECT DISTINCT ON (ce_id) {_TIMELINE_COLUMNS} FROM audit_log "
                        "WHERE ce_correlationid = %s AND ce_id = ANY(%s) AND redelivery_of IS NULL "
                        "ORDER BY ce_id, topic LIKE '%%.dlq', seq",
                        (incident_id, wanted),
                    ).fetchall()
            start = None if head is None else head["first_at"]
            return {
                **(summary(head) if head is not None else unverified_summary(incident_id)),
                "timeline": timeline(entries, start=start, causes=[_timeline_row(r) for r in causes]),
                "page": {"after": after, "limit": limit, "nextAfter": entries[-1].seq if more else None},
            }

        # Anyone may ask, and a walk checks every signature: concurrent callers share walks
        # (never one that started before they asked), one at a time, with a pause between.
        shared_verify = SharedRun(lambda: verify_chain(ctx, trusted, anchors))

        @app.get("/verify")
        def verify() -> dict[str, object]:
            try:
                return shared_verify()
            except Busy as busy:
                busy_answer = {"error": f"verification busy: {busy}"}
                raise HTTPException(429, busy_answer, headers={"Retry-After": "1"}) from None

        @app.get("/public-key")
        def public_key() -> dict[str, str]:
            raw = signer.public_key.public_bytes(Encoding.Raw, PublicFormat.Raw)
            return {
                "algorithm": "Ed25519",
                "keyId": signer.key_id,
                "publicKeyPem": signer.public_pem(),
                "publicKeyBase64": base64.b64encode(raw).decode("ascii"),
                "signs": "each entry's hash: SHA-256(previous entry hash || canonical entry JSON)",
                "trustedKeyIds": ",".join(sorted(trusted)),
            }

    return routes
