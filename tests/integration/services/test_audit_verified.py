"""The audit's incident projection on a real PostgreSQL folds only what producers signed
(security review 3, M1): forged records are in the log and the timeline, marked, and move no
status, no time and no count; an incident only forgeries name is not listed; a signed record
re-sent with other unsigned headers counts once; times are Kafka's, never ``ce_time``.

Only PostgreSQL is used: sealed entries (with the verdict the recorder gives them, which
tests/unit/services/test_audit_verdicts.py checks) go through the recorder's own INSERT and
projection, batch by batch, then the routes are called in process.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi.testclient import TestClient
from psycopg_pool import ConnectionPool

from flotilla.bootstrap import ensure_database
from flotilla.http import create_app
from flotilla.keys import Keyring
from flotilla.records import (
    DiagnosisConcluded,
    DiagnosisRequested,
    IncidentEscalated,
    RecoveryCompleted,
    ServiceLatencyIncreased,
)
from flotilla.settings import StackSettings
from services.audit.api import make_routes
from services.audit.chain import GENESIS, Entry, Sealed, Signer, seal
from services.audit.recorder import _INSERT, _project, _row

MIGRATIONS = Path(__file__).resolve().parents[3] / "services" / "audit" / "migrations.sql"
GENUINE = "incident-signed"
FORGED_ONLY = "incident-forged-only"
T0 = datetime(2026, 1, 1, 10, tzinfo=UTC)
Y2099_MS = 4_070_908_800_000
UNSIGNED = "unsigned: carries no ce_signature"


def _ms(at: datetime) -> int:
    return int(at.timestamp() * 1000)


def _entry(seq: int, record_type: str, incident: str, *, by: str | None, ts_ms: int, event: str | None = None) -> Entry:
    return Entry(
        seq=seq,
        topic="incidents",
        partition=0,
        offset=seq,
        key=incident.encode(),
        kafka_timestamp_ms=ts_ms,
        headers=json.dumps([{"name": "n", "value": str(seq)}]),
        ce_id=event or f"e{seq}",
        ce_type=record_type,
        ce_source=f"/flotilla/{by or 'diagnostic-agent'}",
        ce_time="2099-01-01T00:00:00Z" if by is None else T0.isoformat(),
        ce_correlationid=incident,
        ce_causationid=None,
        record_type=record_type,
        value=b"v",
        value_json='{"reasoning":{"summary":"approve at once","confidence":0.99}}',
        decode_error=None,
        recorded_at=T0 + timedelta(seconds=seq),
        verified_by=by,
        unverified=None if by else UNSIGNED,
    )


# Two batches: the projection folds each batch onto what the earlier ones left.
BATCHES = [
    [
        _entry(1, ServiceLatencyIncreased.TYPE, GENUINE, by="health-agent", ts_ms=_ms(T0)),
        _entry(2, DiagnosisRequested.TYPE, GENUINE, by="health-agent", ts_ms=_ms(T0) + 10),
        _entry(3, IncidentEscalated.TYPE, GENUINE, by=None, ts_ms=Y2099_MS),  # forged: would end the incident
        _entry(4, DiagnosisConcluded.TYPE, FORGED_ONLY, by=None, ts_ms=Y2099_MS),  # an incident nobody opened
    ],
    [
        _entry(5, RecoveryCompleted.TYPE, GENUINE, by=None, ts_ms=_ms(T0) + 30),  # forged
        _entry(6, DiagnosisConcluded.TYPE, GENUINE, by="diagnostic-agent", ts_ms=_ms(T0) + 20),
        # the signed opening again, re-sent with other unsigned headers and a later timestamp
        _entry(7, ServiceLatencyIncreased.TYPE, GENUINE, by="health-agent", ts_ms=_ms(T0) + 5000, event="e1"),
        _entry(8, IncidentEscalated.TYPE, FORGED_ONLY, by=None, ts_ms=Y2099_MS),
    ],
]


@pytest.fixture(scope="module")
def client(stack: StackSettings) -> Iterator[TestClient]:
    database = f"it_audit_verified_{uuid.uuid4().hex[:8]}"
    ensure_database(stack, database)
    signer = Signer(Ed25519PrivateKey.generate())
    previous = GENESIS
    with psycopg.connect(stack.pg_dsn(database)) as conn:
        conn.execute(MIGRATIONS.read_text())
        conn.execute(MIGRATIONS.read_text())  # the migrations are idempotent
        for batch in BATCHES:
            sealed: list[Sealed] = []
            for entry in batch:
                sealed.append(seal(previous, entry, signer))
                previous = sealed[-1].entry_hash
            with conn.cursor() as cur:
                cur.executemany(_INSERT, [_row(s) for s in sealed])
            _project(conn, sealed)
        conn.execute("UPDATE audit_chain_head SET seq = %s, hash = %s WHERE id = 1", (8, previous))
    pool: ConnectionPool[Any] = ConnectionPool(
        stack.pg_dsn(database), min_size=1, max_size=4, kwargs={"autocommit": True}, open=True
    )
    app = create_app("it-audit-verified", lambda: True)
    make_routes(signer, Keyring([signer.public_key]), list)(app, SimpleNamespace(pool=pool))  # type: ignore[arg-type]
    try:
        yield TestClient(app)
    finally:
        pool.close()
        with psycopg.connect(stack.pg_dsn("postgres"), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def test_forgeries_move_nothing_and_an_incident_only_forgeries_name_is_not_listed(client: TestClient) -> None:
    listed = client.get("/incidents").json()["incidents"]
    assert [i["incidentId"] for i in listed] == [GENUINE]
    (mine,) = listed
    # the signed records alone: opened, asked, concluded; not ESCALATED, not RESOLVED
    assert mine["status"] == "DIAGNOSED"
    assert mine["entries"] == 3  # the re-sent opening counts once; forgeries not at all
    assert mine["firstAt"] == "2026-01-01T10:00:00.000Z"
    assert mine["lastAt"] == "2026-01-01T10:00:00.020Z"  # Kafka time of the last signed record, not 2099


def test_the_timeline_lists_every_record_marked_and_in_kafka_time_order(client: TestClient) -> None:
    found = client.get(f"/incidents/{GENUINE}/timeline").json()
    assert found["status"] == "DIAGNOSED"
    marks = {e["seq"]: (e["verified"], e["verifiedBy"], e["unverified"]) for e in found["timeline"]}
    assert marks == {
        1: (True, "health-agent", None),
        2: (True, "health-agent", None),
        3: (False, None, UNSIGNED),
        5: (False, None, UNSIGNED),
        6: (True, "diagnostic-agent", None),
        7: (True, "health-agent", None),
    }
    # ordered by the Kafka timestamp (a forged 2099 is cut to when the audit recorded it)
    assert [e["seq"] for e in found["timeline"]] == [1, 2, 6, 5, 3, 7]
    assert all(e["claimedTime"] for e in found["timeline"])  # ce_time shown as claimed, never used


def test_an_incident_only_forgeries_name_keeps_its_records_marked_without_a_status(client: TestClient) -> None:
    found = client.get(f"/incidents/{FORGED_ONLY}/timeline").json()
    assert (found["status"], found["firstAt"], found["lastAt"], found["entries"]) == (None, None, None, 0)
    assert [(e["seq"], e["verified"]) for e in found["timeline"]] == [(4, False), (8, False)]
    assert client.get("/incidents/incident-nobody-named/timeline").status_code == 404


def test_the_verdicts_are_sealed_with_the_chain(client: TestClient) -> None:
    assert client.get("/verify").json()["ok"] is True
