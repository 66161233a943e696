"""The audit service's HTTP surface: incidents, timelines, chain verification, public key."""

from __future__ import annotations

import base64
from collections.abc import Callable
from datetime import datetime
from typing import Any

from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from fastapi import FastAPI, HTTPException, Query
from prometheus_client import Gauge
from psycopg.rows import dict_row

from flotilla.runner import ServiceContext
from services.audit.chain import ChainVerifier, Entry, Sealed, Signer
from services.audit.timeline import TimelineRow, event_time, summary, timeline

CHAIN_OK = Gauge("flotilla_audit_chain_ok", "1 when the last /verify found the chain intact, 0 when broken.")

_COLUMNS = """seq, topic, partition, "offset", record_key, kafka_timestamp_ms, headers, ce_id, ce_type, ce_source,
    ce_time, ce_correlationid, ce_causationid, record_type, record_value, value_json, decode_error, recorded_at,
    prev_hash, entry_hash, signature, key_id"""


def _sealed(row: tuple[Any, ...]) -> Sealed:
    (seq, topic, partition, offset, key, ts, headers, ce_id, ce_type, ce_source, ce_time, corr, cause, record_type) = (
        row[:14]
    )
    value, value_json, decode_error, recorded_at, prev_hash, entry_hash, signature, key_id = row[14:]
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
    )
    return Sealed(entry, bytes(prev_hash), bytes(entry_hash), bytes(signature), key_id)


def verify_chain(ctx: ServiceContext, signer: Signer, batch: int = 1000) -> dict[str, object]:
    """Walk the whole log in one consistent snapshot, checking every link and signature."""
    verifier = ChainVerifier(signer.public_key)
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
    result = verifier.finish(int(head[0]), bytes(head[1]))
    CHAIN_OK.set(1 if result.ok else 0)
    return {**result.as_json(), "keyId": signer.key_id}


def make_routes(signer: Signer) -> Callable[[FastAPI, ServiceContext], None]:
    def routes(app: FastAPI, ctx: ServiceContext) -> None:
        @app.get("/incidents")
        def incidents(limit: int = Query(200, ge=1, le=5000)) -> dict[str, Any]:
            with ctx.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
                rows = cur.execute(
                    "SELECT incident_id, status, first_at, last_at, entries FROM audit_incidents "
                    "ORDER BY last_at DESC, incident_id LIMIT %s",
                    (limit,),
                ).fetchall()
            return {"incidents": [summary(r) for r in rows]}

        @app.get("/incidents/{incident_id}/timeline")
        def incident_timeline(incident_id: str) -> dict[str, Any]:
            with ctx.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
                head = cur.execute(
                    "SELECT incident_id, status, first_at, last_at, entries FROM audit_incidents "
                    "WHERE incident_id = %s",
                    (incident_id,),
                ).fetchone()
                rows = cur.execute(
                    'SELECT seq, topic, partition, "offset", ce_id, ce_type, ce_source, ce_causationid, ce_time, '
                    "kafka_timestamp_ms, recorded_at, record_type, value_json, record_value, decode_error, headers "
                    "FROM audit_log WHERE ce_correlationid = %s ORDER BY seq",
                    (incident_id,),
                ).fetchall()
            if head is None or not rows:
                raise HTTPException(404, {"error": f"no audited records for incident {incident_id}"})
            entries = [
                TimelineRow(
                    seq=r["seq"],
                    topic=r["topic"],
                    partition=r["partition"],
                    offset=r["offset"],
                    ce_id=r["ce_id"],
                    ce_type=r["ce_type"],
                    ce_source=r["ce_source"],
                    ce_causationid=r["ce_causationid"],
                    record_type=r["record_type"],
                    at=event_time(r["ce_time"], r["kafka_timestamp_ms"], r["recorded_at"]),
                    value_json=r["value_json"],
                    value=None if r["record_value"] is None else bytes(r["record_value"]),
                    decode_error=r["decode_error"],
                    headers=r["headers"],
                )
                for r in rows
            ]
            return {**summary(head), "timeline": timeline(entries)}

        @app.get("/verify")
        def verify() -> dict[str, object]:
            return verify_chain(ctx, signer)

        @app.get("/public-key")
        def public_key() -> dict[str, str]:
            raw = signer.public_key.public_bytes(Encoding.Raw, PublicFormat.Raw)
            return {
                "algorithm": "Ed25519",
                "keyId": signer.key_id,
                "publicKeyPem": signer.public_pem(),
                "publicKeyBase64": base64.b64encode(raw).decode("ascii"),
                "signs": "each entry's hash: SHA-256(previous entry hash || canonical entry JSON)",
            }

    return routes
