"""No poison row wedges an outbox, on the real stack (security review 3, H2; issue 44, item 2).

A row Kafka refuses for its size used to fail the outbox connector's task, and since the
task resumes at the last committed position, every restart failed on the same row: the
member never published again. Here such a row is forced into a real outbox with plain SQL
(past ``Outbox.row``'s own size check, as a row written by an older release or by hand
would be), and the real connector has to set it aside, with a notice on ``<topic>.dlq``,
and publish the row after it. And a task that keeps failing at one position is restarted
with back-off and reported, not restarted every tick for ever.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any, cast

import psycopg
import pytest
from flotilla_ops.samples import latency_fact
from prometheus_client import REGISTRY
from psycopg_pool import ConnectionPool

from flotilla import connectors
from flotilla.bootstrap import bootstrap_outbox, drop_outbox
from flotilla.outbox import Outbox
from flotilla.records import ServiceLatencyIncreased
from flotilla.runner import ServiceContext, count_set_aside_rows, keep_outbox_connector, outbox_keeper
from flotilla.serde import AvroSerde
from flotilla.settings import StackSettings

from .kafka_wait import by_event_id, fresh_topic, header, tail_consumer, wait_for
from .test_connector_healing import restart_until_failed, startup_cut_off, states

DB = "flotilla_it_aside"

pytestmark = pytest.mark.timeout(300)


@pytest.fixture()
def topic(stack: StackSettings) -> Iterator[str]:
    """A topic of its own and its ``.dlq``: a megabyte of junk never lands on ``incidents``."""
    with fresh_topic(stack.kafka_bootstrap, "it-aside") as name:
        yield name


@pytest.fixture()
def outbox_db(stack: StackSettings, topic: str) -> Iterator[str]:
    """An outbox whose connector publishes to ``topic`` only, as a member's does (allowlist)."""
    yield bootstrap_outbox(stack, DB, topics=(topic,))
    drop_outbox(stack, DB)


def force_row(stack: StackSettings, topic: str, payload_bytes: int) -> str:
    """A row inserted with plain SQL, whatever its size; its id."""
    row_id = str(uuid.uuid4())
    with psycopg.connect(stack.pg_dsn(DB)) as conn:
        conn.execute(
            f"""INSERT INTO outbox ({COLUMNS})
               VALUES (%s, %s, 'incident-aside', 'dev.flotilla.incidents.ServiceDegraded', %s, '1.0',
                   '/flotilla/health-agent', %s, 'incident-aside', NULL, '16',
                   '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01', 'application/avro', NULL)""",
            (row_id, topic, os.urandom(payload_bytes), datetime.now(UTC).isoformat()),
        )
    return row_id


COLUMNS = (
    "id, aggregatetype, aggregateid, type, payload, ce_specversion, ce_source, ce_time, ce_correlationid, "
    "ce_causationid, ce_hops, ce_traceparent, content_type, ce_signature"
)


def append_fact(stack: StackSettings, serde: AvroSerde, topic: str) -> str:
    """A genuine record made the one way in (serialized for ``incidents``, whose contracts the
    registry holds), routed to ``topic``: the row after the poison one."""
    value, envelope = latency_fact("incident-aside")
    row = Outbox(serde).row(ServiceLatencyIncreased.from_value(value), envelope)
    with psycopg.connect(stack.pg_dsn(DB)) as conn:
        conn.execute(
            f"INSERT INTO outbox ({COLUMNS}) VALUES ({', '.join(['%s'] * len(row))})", (row[0], topic, *row[2:])
        )
    return str(envelope.id)


def sql_size(stack: StackSettings, row_id: str) -> int:
    with psycopg.connect(stack.pg_dsn(DB)) as conn:
        row = conn.execute(f"SELECT {connectors.set_aside_size_sql()} FROM outbox WHERE id = %s", (row_id,)).fetchone()
    assert row is not None
    return int(row[0])


def text(msg: Any, name: str) -> str:
    value = header(msg, name)
    assert value is not None, f"no {name} header"
    return value.decode()


def test_an_oversized_row_is_set_aside_with_a_notice_and_the_next_row_is_published(
    stack: StackSettings, serde: AvroSerde, topic: str, outbox_db: str
) -> None:
    published = tail_consumer(stack.kafka_bootstrap, topic)
    dead = tail_consumer(stack.kafka_bootstrap, f"{topic}.dlq")
    try:
        poison = force_row(stack, topic, 1_100_000)  # the size the review saw refused live
        after = append_fact(stack, serde, topic)

        notice = wait_for(dead, by_event_id(poison), timeout=90)
        wait_for(published, by_event_id(after), timeout=60)
        assert states(stack, outbox_db) == ["RUNNING", "RUNNING"]

        # The notice: the row's identity and the fleet's dead-letter context, no megabyte.
        assert notice.value() is None
        assert notice.key() == b"incident-aside"
        assert text(notice, "ce_type") == "dev.flotilla.incidents.ServiceDegraded"
        assert text(notice, "ce_correlationid") == "incident-aside"
        assert text(notice, "dlq_reason") == "unpublishable"
        assert text(notice, "dlq_error_class") == "RecordTooLargeException"
        assert text(notice, "dlq_origin_topic") == topic
        assert text(notice, "dlq_consumer") == outbox_db
        assert "lsn=" in text(notice, "dlq_source_position")
        assert poison in text(notice, "dlq_error_message")
        # What Connect measured is what the member counts in SQL.
        assert int(text(notice, "dlq_record_bytes")) == sql_size(stack, poison) > connectors.MAX_RECORD_BYTES

        # The poison row was never published to its topic.
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            msg = published.poll(0.2)
            assert msg is None or msg.error() or header(msg, "ce_id") != poison.encode()
    finally:
        published.close()
        dead.close()

    # The member sees it too: the row is still in its outbox, counted and logged.
    with ConnectionPool(stack.pg_dsn(DB), min_size=1, max_size=1, open=True) as pool:
        with pool.connection() as conn:
            assert [row[0] for row in connectors.set_aside_rows(conn)] == [poison]
        ctx = cast(ServiceContext, SimpleNamespace(spec=SimpleNamespace(name="it-aside"), pool=pool))
        count_set_aside_rows(ctx)
    assert REGISTRY.get_sample_value("flotilla_outbox_rows_set_aside", {"service": "it-aside"}) == 1.0


def test_a_row_exactly_at_the_limit_is_published_and_one_byte_more_is_set_aside(
    stack: StackSettings, topic: str, outbox_db: str
) -> None:
    """The bound is Kafka's own: a record SetAside lets through at the limit, Kafka accepts
    (its size is an upper bound of the producer's), and SQL and Java agree at the byte."""
    probe = force_row(stack, topic, 1000)
    overhead = sql_size(stack, probe) - 1000
    published = tail_consumer(stack.kafka_bootstrap, topic)
    dead = tail_consumer(stack.kafka_bootstrap, f"{topic}.dlq")
    try:
        at_limit = force_row(stack, topic, connectors.MAX_RECORD_BYTES - overhead)
        over = force_row(stack, topic, connectors.MAX_RECORD_BYTES - overhead + 1)
        assert sql_size(stack, at_limit) == connectors.MAX_RECORD_BYTES
        assert len(wait_for(published, by_event_id(at_limit), timeout=90).value() or b"") > 1_000_000
        assert int(text(wait_for(dead, by_event_id(over), timeout=60), "dlq_record_bytes")) == (
            connectors.MAX_RECORD_BYTES + 1
        )
        assert states(stack, outbox_db) == ["RUNNING", "RUNNING"]
    finally:
        published.close()
        dead.close()


def test_a_task_failing_again_at_the_same_position_is_backed_off_and_reported(
    stack: StackSettings, topic: str, outbox_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = SimpleNamespace(name="it-aside-keeper", database=DB, publishes=True)
    ctx = cast(ServiceContext, SimpleNamespace(spec=spec, settings=stack))
    keeper = outbox_keeper(ctx)
    force_row(stack, topic, 10)  # published, so Connect has a position to report
    deadline = time.monotonic() + 60
    while connectors.committed_position(stack.connect_url, outbox_db) is None:
        assert time.monotonic() < deadline, "Connect committed no position"
        time.sleep(0.5)

    def failures() -> float | None:
        return REGISTRY.get_sample_value("flotilla_outbox_connector_failures", {"service": "it-aside-keeper"})

    with startup_cut_off(stack, DB):  # every start of the task fails, at the same position
        restart_until_failed(stack, outbox_db)
        keep_outbox_connector(ctx)  # the first failure at a position: restarted at once
        assert keeper.failures == 1 and keeper.stuck is None
        # Failed again at the same position: counted, not restarted yet. Connect may still
        # flush the offsets of what it published before the cut-off after the first look
        # (the committed position then moves once): that failure counts as a first again.
        for _ in range(3):
            deadline = time.monotonic() + 60
            while connectors.failure(connectors._request(f"{stack.connect_url}/connectors/{outbox_db}/status")) is None:
                assert time.monotonic() < deadline, "the restarted task did not fail again"
                time.sleep(0.5)
            keep_outbox_connector(ctx)
            if keeper.failures != 1:
                break
        assert keeper.failures == 2 and failures() == 2
        assert keeper.position is not None and keeper.position.startswith("lsn ")
        stuck = keeper.stuck
        assert stuck is not None and keeper.position in stuck and "TypeRegistry" in stuck
        restarts = []
        monkeypatch.setattr(connectors, "restart_failed", lambda url, name: restarts.append(name))
        for _ in range(3):
            keep_outbox_connector(ctx)
        assert restarts == [], "restarted inside its back-off"
    monkeypatch.undo()
    # Back-off over (the clock moved on): restarted, runs, and the report is cleared.
    keeper._next_restart = 0.0
    keep_outbox_connector(ctx)
    connectors.wait_running(stack.connect_url, outbox_db, timeout=90)
    keep_outbox_connector(ctx)
    assert keeper.failures == 0 and keeper.stuck is None and failures() == 0
