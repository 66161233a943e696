"""The consumer loop on the real stack: exactly-once effects, dead letters, loop and
workflow guards, crash and SIGTERM safety."""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient
from flotilla_ops.samples import SERVICE_LATENCY_INCREASED, latency_fact, sample_value

from flotilla import deadletter
from flotilla.consumer import ConsumerLoop
from flotilla.contracts import load_contracts
from flotilla.envelope import Envelope
from flotilla.retention import Retention, dedupe_window, prune, topic_retention_ms
from flotilla.serde import AvroSerde
from flotilla.settings import StackSettings
from flotilla.tailing import header
from flotilla.workflow import Budgets
from tests.support.databases import migrated_database
from tests.support.producing import ordered_producer

from .kafka_wait import fresh_topic, wait_for
from .loop_worker import DIAGNOSIS_REQUESTED, build_loop

REPO_ROOT = Path(__file__).resolve().parents[2]
DB = "flotilla_it_loop"

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def database(stack: StackSettings) -> str:
    return migrated_database(stack, DB)


@pytest.fixture()
def topic(stack: StackSettings) -> Iterator[str]:
    """A fresh input topic (3 partitions) and its DLQ, deleted afterwards."""
    with fresh_topic(stack.kafka_bootstrap, "it-loop", partitions=3) as name:
        yield name


def produce(stack: StackSettings, topic: str, records: list[tuple[str, bytes | None, list[tuple[str, bytes]]]]) -> None:
    producer = ordered_producer(stack.kafka_bootstrap)
    for key, value, headers in records:
        producer.produce(topic, key=key, value=value, headers=headers)
    assert producer.flush(15) == 0


def fact(serde: AvroSerde, incident: str, **overrides: Any) -> tuple[bytes, Envelope]:
    value, env = latency_fact(incident)
    value.update(overrides)
    return serde.serialize("incidents", SERVICE_LATENCY_INCREASED, value), env


def drain(loop: ConsumerLoop, expected: int, timeout: float = 60) -> None:
    """Poll until ``expected`` records were consumed (in however many batches)."""
    seen = 0
    deadline = time.monotonic() + timeout
    while seen < expected:
        assert time.monotonic() < deadline, f"consumed {seen} of {expected} records"
        seen += loop.poll_once()


def effects(stack: StackSettings, incident: str | None = None) -> list[str]:
    with psycopg.connect(stack.pg_dsn(DB)) as conn:
        if incident is None:
            rows = conn.execute("SELECT event_id FROM effects").fetchall()
        else:
            rows = conn.execute("SELECT event_id FROM effects WHERE incident_id = %s", (incident,)).fetchall()
    return [r[0] for r in rows]


def outbox_types(stack: StackSettings, incident: str) -> list[str]:
    with psycopg.connect(stack.pg_dsn(DB)) as conn:
        rows = conn.execute("SELECT type FROM outbox WHERE aggregateid = %s", (incident,)).fetchall()
    return sorted(r[0] for r in rows)  # rows of one transaction share created_at: no order to read


def dlq_reader(stack: StackSettings, topic: str) -> Consumer:
    consumer = Consumer(
        {"bootstrap.servers": stack.kafka_bootstrap, "group.id": f"dlq-{uuid.uuid4()}", "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([deadletter.dlq_topic(topic)])
    return consumer


def test_a_record_delivered_twice_has_one_effect(
    stack: StackSettings, serde: AvroSerde, database: str, topic: str
) -> None:
    incident = f"incident-{uuid.uuid4().hex[:8]}"
    payload, env = fact(serde, incident)
    produce(stack, topic, [(incident, payload, env.headers()), (incident, payload, env.headers())])
    loop, pool = build_loop(stack, topic=topic, database=database, group=f"g-{topic}")
    try:
        drain(loop, 2)
    finally:
        pool.close()
    assert effects(stack, incident) == [env.id]
    # and the caused record went to the outbox, one hop fewer, causation = the fact
    with psycopg.connect(stack.pg_dsn(DB)) as conn:
        row = conn.execute(
            "SELECT type, ce_causationid, ce_hops, ce_correlationid FROM outbox WHERE ce_causationid = %s", (env.id,)
        ).fetchall()
    assert row == [("dev.flotilla.incidents.DiagnosisRequested", env.id, str(env.hops - 1), incident)]


def test_crash_between_db_commit_and_offset_commit_still_one_effect(
    stack: StackSettings, serde: AvroSerde, database: str, topic: str
) -> None:
    incident = f"incident-{uuid.uuid4().hex[:8]}"
    payload, env = fact(serde, incident)
    produce(stack, topic, [(incident, payload, env.headers())])
    group = f"g-{topic}"
    cmd = [sys.executable, "-m", "tests.integration.loop_worker", "--topic", topic, "--database", database]
    crashed = subprocess.run([*cmd, "--group", group, "--crash-after-commit"], cwd=REPO_ROOT, timeout=90)
    assert crashed.returncode == 17  # died after the database commit, before the offsets
    assert effects(stack, incident) == [env.id]

    # The restarted consumer gets the record again (offsets were never committed) ...
    loop, pool = build_loop(stack, topic=topic, database=database, group=group)
    try:
        drain(loop, 1)
    finally:
        pool.close()
    # ... and the dedupe table absorbs it.
    assert effects(stack, incident) == [env.id]


def test_poison_goes_to_the_dlq_with_context_and_the_partition_moves_on(
    stack: StackSettings, serde: AvroSerde, database: str, topic: str
) -> None:
    incident = f"incident-{uuid.uuid4().hex[:8]}"  # one key: every record on one partition
    good, good_env = fact(serde, incident)
    invalid, invalid_env = fact(serde, incident, p95LatencyMs=-5.0)
    failing, failing_env = fact(serde, incident, service="always-fails")
    unknown_id = struct.pack(">bI", 0, 2_000_000_000) + b"\x02\x04"
    noise_env = Envelope(type=SERVICE_LATENCY_INCREASED, source="/tests", correlationid=incident)
    unknown_env = Envelope(type=SERVICE_LATENCY_INCREASED, source="/tests", correlationid=incident)
    produce(
        stack,
        topic,
        [
            (incident, os.urandom(64), noise_env.headers()),
            (incident, unknown_id, unknown_env.headers()),
            (incident, invalid, invalid_env.headers()),
            (incident, failing, failing_env.headers()),
            (incident, good, good_env.headers()),
        ],
    )
    group = f"g-{topic}"
    loop, pool = build_loop(stack, topic=topic, database=database, group=group)
    try:
        drain(loop, 5)
    finally:
        pool.close()
    assert effects(stack, incident) == [good_env.id]  # the record after the poison was handled

    reader = dlq_reader(stack, topic)
    letters = {}
    try:
        for _ in range(4):
            msg = wait_for(reader, lambda m: True, timeout=30)
            letters[(header(msg.headers(), "ce_id") or b"").decode()] = msg
    finally:
        reader.close()
    expected = {
        noise_env.id: ("undecodable", "UndecodableRecordError"),
        unknown_env.id: ("unknown-schema", "UnknownSchemaIdError"),
        invalid_env.id: ("invalid-record", "BusinessRuleViolation"),
        failing_env.id: ("retries-exhausted", "RuntimeError"),
    }
    assert set(letters) == set(expected)
    offsets = set()
    for event_id, (reason, error_class) in expected.items():
        msg = letters[event_id]
        h = {k: (v or b"").decode() for k, v in msg.headers() or []}
        assert h[deadletter.REASON] == reason
        assert h[deadletter.ERROR_CLASS] == error_class
        assert h[deadletter.ORIGIN_TOPIC] == topic
        assert h[deadletter.CONSUMER] == group
        assert h[deadletter.ERROR_MESSAGE]
        assert h[deadletter.FIRST_FAILURE_TIME].startswith("20")
        offsets.add(int(h[deadletter.ORIGIN_OFFSET]))
        assert msg.key() == incident.encode()
    assert len(offsets) == 4
    failing_headers = {k: (v or b"").decode() for k, v in letters[failing_env.id].headers() or []}
    assert failing_headers[deadletter.ATTEMPTS] == "4"  # first try + 3 retries
    assert "metrics backend is down" in failing_headers[deadletter.ERROR_MESSAGE]
    assert letters[invalid_env.id].value() == invalid  # original bytes kept for re-queueing


def test_poison_read_again_by_a_rewound_group_is_not_dead_lettered_again(
    stack: StackSettings, serde: AvroSerde, database: str, topic: str
) -> None:
    """A group rewound to the start (the chaos soak's duplicate-delivery pass) re-reads
    its poison too: each record was claimed by position with its letter, so the DLQ gets
    one letter per poison record, however often it is read."""
    incident = f"incident-{uuid.uuid4().hex[:8]}"
    noise_env = Envelope(type=SERVICE_LATENCY_INCREASED, source="/tests", correlationid=incident)
    invalid, invalid_env = fact(serde, incident, p95LatencyMs=-5.0)
    produce(stack, topic, [(incident, os.urandom(64), noise_env.headers()), (incident, invalid, invalid_env.headers())])
    group = f"g-{topic}"
    for _ in range(2):
        loop, pool = build_loop(stack, topic=topic, database=database, group=group)
        try:
            drain(loop, 2)
        finally:
            loop.stop()
            loop.run()  # stopped: returns at once, closing the consumer (it leaves the group)
            pool.close()
        # the group, now without members, back to the start of every partition
        admin = AdminClient({"bootstrap.servers": stack.kafka_bootstrap})
        start = [TopicPartition(topic, p, 0) for p in range(3)]
        admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(group, start)])[group].result(30)
    reader = dlq_reader(stack, topic)
    try:
        first = [wait_for(reader, lambda m: True, timeout=30) for _ in range(2)]
        assert reader.poll(5) is None  # no second letter
    finally:
        reader.close()
    assert {(header(m.headers(), "ce_id") or b"").decode() for m in first} == {noise_env.id, invalid_env.id}


def test_a_record_with_no_hops_left_is_dropped_and_reported(
    stack: StackSettings, serde: AvroSerde, database: str, topic: str
) -> None:
    incident = f"incident-{uuid.uuid4().hex[:8]}"
    value, env = latency_fact(incident)
    spent = Envelope(type=env.type, source=env.source, correlationid=incident, id=env.id, hops=0)
    payload = serde.serialize("incidents", SERVICE_LATENCY_INCREASED, value)
    produce(stack, topic, [(incident, payload, spent.headers()), (incident, payload, spent.headers())])
    loop, pool = build_loop(stack, topic=topic, database=database, group=f"g-{topic}")
    try:
        drain(loop, 2)
    finally:
        pool.close()
    assert effects(stack, incident) == []
    assert outbox_types(stack, incident) == ["dev.flotilla.incidents.LoopTerminated"]  # reported once


def test_a_spent_record_the_loop_does_not_handle_is_not_reported(
    stack: StackSettings, serde: AvroSerde, database: str, topic: str
) -> None:
    """Every service reads `incidents`: only one that would have handled the record reports it."""
    incident = f"incident-{uuid.uuid4().hex[:8]}"
    value, env = latency_fact(incident)
    spent = Envelope(type="dev.flotilla.incidents.RecoveryCompleted", source=env.source, correlationid=incident, hops=0)
    produce(stack, topic, [(incident, serde.serialize("incidents", SERVICE_LATENCY_INCREASED, value), spent.headers())])
    loop, pool = build_loop(stack, topic=topic, database=database, group=f"g-{topic}")
    try:
        drain(loop, 1)
    finally:
        pool.close()
    assert outbox_types(stack, incident) == []


def test_a_stale_transition_is_recorded_and_skipped(
    stack: StackSettings, serde: AvroSerde, database: str, topic: str
) -> None:
    incident = f"incident-{uuid.uuid4().hex[:8]}"
    first, first_env = fact(serde, incident)
    again, again_env = fact(serde, incident)  # a second "opening" fact under a new id
    produce(stack, topic, [(incident, first, first_env.headers()), (incident, again, again_env.headers())])
    loop, pool = build_loop(stack, topic=topic, database=database, group=f"g-{topic}")
    try:
        drain(loop, 2)
    finally:
        pool.close()
    assert effects(stack, incident) == [first_env.id]
    with psycopg.connect(stack.pg_dsn(DB)) as conn:
        stale = conn.execute(
            "SELECT event_id, status, version FROM stale_transitions WHERE incident_id = %s", (incident,)
        ).fetchall()
        state = conn.execute(
            "SELECT status, version FROM incident_workflow WHERE incident_id = %s", (incident,)
        ).fetchone()
    assert stale == [(again_env.id, "DETECTED", 1)]
    assert state == ("DETECTED", 1)


def test_an_exceeded_budget_escalates_instead_of_handling(
    stack: StackSettings, serde: AvroSerde, database: str, topic: str
) -> None:
    incident = f"incident-{uuid.uuid4().hex[:8]}"
    schema = next(c.schema for c in load_contracts() if c.full_name == DIAGNOSIS_REQUESTED)
    request = sample_value(schema, incidentId=incident)
    env = Envelope(type=DIAGNOSIS_REQUESTED, source="/tests", correlationid=incident, id=request["eventId"])
    produce(stack, topic, [(incident, serde.serialize("incidents", DIAGNOSIS_REQUESTED, request), env.headers())])
    with psycopg.connect(stack.pg_dsn(DB), autocommit=True) as conn:
        # the incident is open and has already taken more steps than its budget allows
        conn.execute(
            "INSERT INTO incident_workflow (incident_id, status, version, opened_at, steps) "
            "VALUES (%s, 'DETECTED', 5, now(), 5)",
            (incident,),
        )
    loop, pool = build_loop(stack, topic=topic, database=database, group=f"g-{topic}", budgets=Budgets(steps=3))
    try:
        drain(loop, 1)
    finally:
        pool.close()
    assert outbox_types(stack, incident) == [
        "dev.flotilla.incidents.BudgetExceeded",
        "dev.flotilla.incidents.IncidentEscalated",
    ]
    with psycopg.connect(stack.pg_dsn(DB)) as conn:
        state = conn.execute("SELECT status FROM incident_workflow WHERE incident_id = %s", (incident,)).fetchone()
    assert state == ("ESCALATED",)


def test_sigterm_mid_batch_loses_and_duplicates_nothing(
    stack: StackSettings, serde: AvroSerde, database: str, topic: str
) -> None:
    records = []
    ids = []
    for n in range(60):
        incident = f"incident-{uuid.uuid4().hex[:8]}-{n}"
        payload, env = fact(serde, incident)
        records.append((incident, payload, env.headers()))
        ids.append(env.id)
    produce(stack, topic, records)
    group = f"g-{topic}"
    cmd = [sys.executable, "-m", "tests.integration.loop_worker", "--topic", topic, "--database", database]
    worker = subprocess.Popen(
        # 0.2 s a record: 12 s of work, so SIGTERM lands mid-run even if this test stalls
        [*cmd, "--group", group, "--batch-size", "20", "--handler-sleep", "0.2"],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not set(ids) & set(effects(stack)):
            assert time.monotonic() < deadline, "worker handled nothing"
            time.sleep(0.05)
        worker.send_signal(signal.SIGTERM)  # mid-batch: the first batch takes ~4 s
        assert worker.wait(60) == 0
    finally:
        worker.kill()
    handled_before = [e for e in effects(stack) if e in set(ids)]
    assert 0 < len(handled_before) < len(ids)

    loop, pool = build_loop(stack, topic=topic, database=database, group=group)
    try:
        drain(loop, len(ids) - len(handled_before))
    finally:
        pool.close()
    handled = [e for e in effects(stack) if e in set(ids)]
    assert sorted(handled) == sorted(ids)  # nothing lost, nothing twice


def test_a_duplicate_older_than_the_prune_point_still_has_no_effect(
    stack: StackSettings, serde: AvroSerde, database: str, topic: str
) -> None:
    """The dedupe claim of a handled record is pruned (it aged past the window); the same
    record delivered again is then refused by the incident's state, not the claim."""
    incident = f"incident-{uuid.uuid4().hex[:8]}"
    payload, env = fact(serde, incident)
    produce(stack, topic, [(incident, payload, env.headers())])
    loop, pool = build_loop(stack, topic=topic, database=database, group=f"g-{topic}")
    try:
        drain(loop, 1)
        assert effects(stack, incident) == [env.id]
        with pool.connection() as conn:
            conn.execute(
                "UPDATE processed_events SET processed_at = now() - interval '30 days' WHERE event_id = %s", (env.id,)
            )
            removed = prune(conn, Retention(dedupe=timedelta(days=8), outbox=None), datetime.now(UTC), service="it")
            assert removed["processed_events"] >= 1
            assert conn.execute("SELECT count(*) FROM processed_events WHERE event_id = %s", (env.id,)).fetchone() == (
                0,
            )
        produce(stack, topic, [(incident, payload, env.headers())])  # the same record, again
        drain(loop, 1)
    finally:
        pool.close()
    assert effects(stack, incident) == [env.id]  # no second effect
    with psycopg.connect(stack.pg_dsn(DB)) as conn:
        stale = conn.execute("SELECT status FROM stale_transitions WHERE event_id = %s", (env.id,)).fetchall()
    assert stale == [("DETECTED",)]  # the incident had moved on: the copy was a stale transition
    assert outbox_types(stack, incident) == ["dev.flotilla.incidents.DiagnosisRequested"]  # nothing emitted twice


def test_prune_keeps_what_is_young_and_the_window_follows_the_topics_retention(
    stack: StackSettings, database: str, topic: str
) -> None:
    admin = AdminClient({"bootstrap.servers": stack.kafka_bootstrap})
    kept = topic_retention_ms(admin, [topic, "incidents.dlq"])
    assert kept["incidents.dlq"] == 14 * 24 * 3600 * 1000
    assert dedupe_window(kept.values(), margin=timedelta(days=1)) == timedelta(days=15)
    with psycopg.connect(stack.pg_dsn(database), autocommit=True) as conn:
        young, old = str(uuid.uuid4()), str(uuid.uuid4())
        for event_id, age in ((young, "1 hour"), (old, "10 days")):
            conn.execute(
                "INSERT INTO processed_events (consumer, event_id, record_type, outcome, processed_at) "
                "VALUES ('it-prune', %s, 't', 'handled', now() - %s::interval)",
                (event_id, age),
            )
        prune(conn, Retention(dedupe=timedelta(days=8), outbox=timedelta(days=1)), datetime.now(UTC), service="it")
        ours = "SELECT event_id FROM processed_events WHERE consumer = 'it-prune' AND event_id IN (%s, %s)"
        left = {r[0] for r in conn.execute(ours, (young, old))}  # not a previous run's claims
        assert left == {young}
        prune(conn, Retention(dedupe=None, outbox=None), datetime.now(UTC) + timedelta(days=365), service="it")
        assert {r[0] for r in conn.execute(ours, (young, old))} == {young}  # a window of None never prunes claims


def test_records_the_loop_does_not_need_are_neither_decoded_claimed_nor_dead_lettered(
    stack: StackSettings, serde: AvroSerde, database: str, topic: str
) -> None:
    """A loop declaring what it reads (LoopConfig.needs) passes over the rest by ce_type:
    poison of a skipped type is not dead-lettered here, nothing is claimed for it, and the
    group's offsets move past it with the needed record's."""
    incident = f"incident-{uuid.uuid4().hex[:8]}"
    payload, env = fact(serde, incident)
    skipped = Envelope(type="dev.flotilla.incidents.DiagnosticJobStarted", source="/x", correlationid=incident)
    produce(stack, topic, [(incident, b"\x00not avro", skipped.headers()), (incident, payload, env.headers())])
    group = f"g-{topic}"
    loop, pool = build_loop(
        stack,
        topic=topic,
        database=database,
        group=group,
        needs=frozenset({"dev.flotilla.incidents.ServiceLatencyIncreased"}),
    )
    try:
        drain(loop, 2)  # both taken off the topic, in one batch or two
        loop.consumer.close()  # commits the stored offsets
    finally:
        pool.close()
    assert effects(stack, incident) == [env.id]
    with psycopg.connect(stack.pg_dsn(DB)) as conn:
        claimed = conn.execute("SELECT event_id FROM processed_events WHERE consumer = %s", (group,)).fetchall()
    assert [r[0] for r in claimed] == [env.id]
    dlq = dlq_reader(stack, topic)
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            letter = dlq.poll(0.5)
            assert letter is None or letter.error() is not None, "the skipped poison was dead-lettered"
    finally:
        dlq.close()
    admin = AdminClient({"bootstrap.servers": stack.kafka_bootstrap})
    offsets = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(10)
    assert sum(tp.offset for tp in offsets.topic_partitions if tp.offset > 0) == 2
