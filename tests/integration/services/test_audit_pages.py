"""The audit service's bounded reads on a real PostgreSQL: the timeline in pages (each
record once, causes linked across pages, a dead letter's copy never taken for its
original) and /verify shared between concurrent callers without a stale "ok".

Only PostgreSQL is used: a sealed chain is written straight into a database of its own
(the recorder's SQL), then the routes are called in process.
"""

from __future__ import annotations

import threading
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
from flotilla.settings import StackSettings
from services.audit.api import make_routes
from services.audit.chain import GENESIS, Entry, Sealed, Signer, seal
from services.audit.recorder import _INSERT, _project, _row

MIGRATIONS = Path(__file__).resolve().parents[3] / "services" / "audit" / "migrations.sql"
INCIDENT = "incident-pages"
T0 = datetime(2026, 1, 1, 10, tzinfo=UTC)
RECORDS = 23


def _chain(signer: Signer) -> list[Sealed]:
    """One incident: each record caused by the one before; every 5th is a dead letter that
    repeats its original's id; record 8 is caused by record 4 (and so by an id its dead
    letter at 5 repeats); record 3 happened first."""
    sealed, previous = [], GENESIS
    for seq in range(1, RECORDS + 1):
        dead = seq % 5 == 0
        cause = None if seq == 1 else "e4" if seq == 8 else f"e{seq - 2 if dead else seq - 1}"
        entry = Entry(
            seq=seq,
            topic="incidents.dlq" if dead else "incidents",
            partition=0,
            offset=seq,
            key=None,
            # times are Kafka's (ce_time is outside the producer's signature)
            kafka_timestamp_ms=int((T0 + timedelta(milliseconds=1 if seq == 3 else 10 * seq)).timestamp() * 1000),
            headers="[]",
            ce_id=f"e{seq - 1}" if dead else f"e{seq}",
            ce_type="dev.flotilla.incidents.X",
            ce_source="/flotilla/test",
            ce_time="2099-01-01T00:00:00Z",
            ce_correlationid=INCIDENT,
            ce_causationid=cause,
            record_type="dev.flotilla.incidents.X",
            value=b"v",
            value_json=f'{{"n":{seq}}}',
            decode_error=None,
            recorded_at=T0 + timedelta(seconds=1),
            verified_by=None if dead else "test",  # the producer's signature held
            unverified="wrong-producer: a dead letter's copy" if dead else None,
        )
        item = seal(previous, entry, signer)
        sealed.append(item)
        previous = item.entry_hash
    return sealed


@pytest.fixture(scope="module")
def audit_api(stack: StackSettings) -> Iterator[tuple[TestClient, str]]:
    database = f"it_audit_pages_{uuid.uuid4().hex[:8]}"
    ensure_database(stack, database)
    signer = Signer(Ed25519PrivateKey.generate())
    sealed = _chain(signer)
    with psycopg.connect(stack.pg_dsn(database)) as conn:
        conn.execute(MIGRATIONS.read_text())
        with conn.cursor() as cur:
            cur.executemany(_INSERT, [_row(s) for s in sealed])
        _project(conn, sealed)
        conn.execute("UPDATE audit_chain_head SET seq = %s, hash = %s WHERE id = 1", (RECORDS, sealed[-1].entry_hash))
    pool: ConnectionPool[Any] = ConnectionPool(
        stack.pg_dsn(database), min_size=1, max_size=10, kwargs={"autocommit": True}, open=True
    )
    app = create_app("it-audit-pages", lambda: True)
    # trusting the signer, no anchors published (the pages are the subject here, not anchoring)
    routes = make_routes(signer, Keyring([signer.public_key]), list)
    routes(app, SimpleNamespace(pool=pool))  # type: ignore[arg-type]  # the routes use .pool only
    try:
        yield TestClient(app), database
    finally:
        pool.close()
        with psycopg.connect(stack.pg_dsn("postgres"), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def _timeline(client: TestClient, **params: int) -> dict[str, Any]:
    answer = client.get(f"/incidents/{INCIDENT}/timeline", params=params)
    assert answer.status_code == 200, answer.text
    found: dict[str, Any] = answer.json()
    return found


def test_the_timeline_comes_in_pages_that_add_up_to_the_whole(audit_api: tuple[TestClient, str]) -> None:
    client, _ = audit_api
    whole = _timeline(client)
    assert whole["page"] == {"after": 0, "limit": 500, "nextAfter": None}
    # every record is listed; the incident counts its verified records (not the dead letters)
    assert len(whole["timeline"]) == RECORDS and whole["entries"] == RECORDS - RECORDS // 5
    expected = {e["seq"]: (e["elapsedMs"], e["causedBy"]) for e in whole["timeline"]}
    assert expected[3][0] == 0 and expected[1][0] == 9  # times count from the incident's first record
    assert expected[8][1]["seq"] == 4  # the original, not its dead letter at 5
    for limit in (1, 2, 4, 7):
        paged: list[dict[str, Any]] = []
        after: int | None = 0
        while after is not None:
            page = _timeline(client, limit=limit, after=after)
            assert len(page["timeline"]) <= limit and page["page"]["limit"] == limit
            paged += page["timeline"]
            after = page["page"]["nextAfter"]
        assert sorted(e["seq"] for e in paged) == list(range(1, RECORDS + 1)), limit
        got = {e["seq"]: (e["elapsedMs"], e["causedBy"]) for e in paged}
        assert got == expected, {k: (got[k], v) for k, v in expected.items() if got[k] != v}


def test_a_page_is_bounded_and_bad_bounds_are_refused(audit_api: tuple[TestClient, str]) -> None:
    client, _ = audit_api
    page = _timeline(client, limit=4, after=4)
    assert [e["seq"] for e in page["timeline"]] == [5, 6, 7, 8] and page["page"]["nextAfter"] == 8
    assert page["timeline"][0]["deadLetter"] == {} and page["timeline"][0]["causedBy"]["seq"] == 3
    assert _timeline(client, after=RECORDS)["timeline"] == []
    assert client.get("/incidents/no-such-incident/timeline").status_code == 404
    for bad in ({"limit": 0}, {"limit": 5001}, {"after": -1}, {"limit": "x"}):
        assert client.get(f"/incidents/{INCIDENT}/timeline", params=bad).status_code == 422, bad


def test_concurrent_verifies_share_walks_and_a_change_is_seen_by_the_next(
    audit_api: tuple[TestClient, str], stack: StackSettings
) -> None:
    client, database = audit_api
    assert client.get("/verify").json()["ok"] is True
    answers: list[Any] = []
    threads = [threading.Thread(target=lambda: answers.append(client.get("/verify"))) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(answers) == 12
    assert {a.status_code for a in answers} <= {200, 429}
    assert all(a.json()["ok"] is True for a in answers if a.status_code == 200)
    busy = [a for a in answers if a.status_code == 429]
    assert all(a.headers["retry-after"] == "1" for a in busy)
    # someone with the database's keys edits a record: the very next call says so
    with psycopg.connect(stack.pg_dsn(database), autocommit=True) as conn:
        conn.execute("ALTER TABLE audit_log DISABLE TRIGGER audit_log_no_update_or_delete")
        conn.execute("""UPDATE audit_log SET value_json = '{"n":999}' WHERE seq = 9""")
    verdict = client.get("/verify").json()
    assert verdict["ok"] is False and verdict["firstBroken"]["seq"] == 9
