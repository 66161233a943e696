"""Offsets are stored after a batch's transaction (and committed by librdkafka); storing them
after the group took our partitions away must not end a loop (either one)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from flotilla.consumer import ConsumerLoop, LoopConfig, store_offsets
from flotilla.rawloop import RawLoop
from flotilla.settings import StackSettings
from tests.support.messages import FakeMessage


class _Consumer:
    def __init__(self, error: int | None, records: list[Any] | None = None) -> None:
        self.error = error
        self.records = list(records or [])
        self.stored: list[list[TopicPartition]] = []

    def subscribe(self, topics: list[str]) -> None:
        pass

    def poll(self, timeout: float) -> Any:
        return self.records.pop(0) if self.records else None

    def consume(self, num_messages: int, timeout: float) -> list[Any]:
        taken, self.records = self.records[:num_messages], self.records[num_messages:]
        return taken

    def store_offsets(self, offsets: list[TopicPartition]) -> None:
        self.stored.append(offsets)
        if self.error is not None:
            raise KafkaException(KafkaError(self.error))


def _loop(error: int | None, **config: Any) -> tuple[ConsumerLoop, _Consumer]:
    # Nothing connects: Consumer/Producer construction is lazy, and no pool is used here.
    loop = ConsumerLoop(
        LoopConfig(name="t", topics=("t",), source="/t", **config),
        StackSettings(),
        serde=None,
        pool=None,
        handlers={},  # type: ignore[arg-type]
    )
    fake = _Consumer(error)
    loop._consumer = fake  # type: ignore[assignment]
    return loop, fake


def _msgs() -> list[Any]:
    return [FakeMessage(partition=0, offset=5), FakeMessage(partition=0, offset=7), FakeMessage(partition=3, offset=2)]


def test_offsets_stored_are_one_past_the_highest_per_partition() -> None:
    fake = _Consumer(None)
    store_offsets(fake, _msgs())  # type: ignore[arg-type]
    assert {(tp.topic, tp.partition, tp.offset) for tp in fake.stored[0]} == {
        ("incidents", 0, 8),
        ("incidents", 3, 3),
    }


def test_offsets_refused_because_partitions_moved_are_survived() -> None:
    loop, fake = _loop(KafkaError._STATE)  # what librdkafka answers for partitions not assigned here
    loop._store_offsets(_msgs())  # logs, does not raise: redelivery is deduped
    assert fake.stored


def test_the_real_clients_answer_for_a_partition_it_does_not_hold_is_survived() -> None:
    # librdkafka itself, no broker: nothing is assigned, so nothing can be stored.
    real = Consumer(
        {"bootstrap.servers": "127.0.0.1:1", "group.id": "t", "enable.auto.offset.store": False, "log_level": 0}
    )  # log_level 0: its failed connects to the absent broker are not the test
    try:
        store_offsets(real, _msgs())  # type: ignore[arg-type]
    finally:
        real.close()


def test_other_store_failures_still_raise() -> None:
    loop, _ = _loop(KafkaError._INVALID_ARG)
    with pytest.raises(KafkaException):
        loop._store_offsets(_msgs())


def test_librdkafka_commits_what_the_loop_stored_every_second() -> None:
    conf = _loop(None)[0].kafka_config()
    assert conf["enable.auto.offset.store"] is False  # only offsets of committed transactions
    assert conf["enable.auto.commit"] is True and conf["auto.commit.interval.ms"] == 1000
    quick, _ = _loop(None, commit_interval_ms=200)
    assert quick.kafka_config()["auto.commit.interval.ms"] == 200


class _Pool:
    """Enough of a psycopg pool for a handler that never touches the connection."""

    @contextmanager
    def connection(self) -> Iterator[Any]:
        yield SimpleNamespace(transaction=nullcontext)


def test_the_raw_loop_survives_offsets_refused_after_a_rebalance() -> None:
    handled: list[int] = []
    loop = RawLoop(
        group="raw-t",
        topics=("incidents",),
        bootstrap="127.0.0.1:1",
        pool=_Pool(),  # type: ignore[arg-type]
        handle=lambda conn, records: handled.append(len(records)) or None,
    )
    fake = _Consumer(KafkaError._STATE, records=_msgs())
    loop._consumer = fake  # type: ignore[assignment]
    assert loop.poll_once() == 3  # handled and committed in the database; the offsets were refused
    assert handled == [3] and fake.stored
    loop._consumer = _Consumer(KafkaError._INVALID_ARG, records=_msgs())  # type: ignore[assignment]
    with pytest.raises(KafkaException):
        loop.poll_once()


class _RestartingDatabase:
    """A pool whose database is gone for the first ``failures`` checkouts."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.checks = 0

    @contextmanager
    def connection(self) -> Iterator[Any]:
        if self.failures:
            self.failures -= 1
            raise psycopg.OperationalError("terminating connection due to unexpected postmaster exit")
        yield SimpleNamespace()

    def check(self) -> None:
        self.checks += 1


def test_a_batch_waits_out_a_database_restart_instead_of_crashing_the_member(monkeypatch: pytest.MonkeyPatch) -> None:
    # Three quick retries (0.35 s) ended every member with a batch in flight when
    # PostgreSQL was killed in the chaos soak: the restart takes seconds.
    loop, fake = _loop(None, backoff_initial=0.001, backoff_max=0.001)
    database = _RestartingDatabase(failures=10 * loop.config.max_retries)
    loop._pool = database  # type: ignore[assignment]
    ran: list[Any] = []
    monkeypatch.setattr(loop, "_decode_batch", lambda msgs: list(msgs))  # their items: _run is replaced too
    monkeypatch.setattr(loop, "_run", lambda conn, items: ran.append(conn))
    loop.process(_msgs())
    assert len(ran) == 1 and fake.stored  # committed once, then its offsets stored
    assert database.checks == 10 * loop.config.max_retries  # dead pooled connections dropped after each failure


def test_a_database_gone_longer_than_the_patience_still_ends_the_member(monkeypatch: pytest.MonkeyPatch) -> None:
    loop, fake = _loop(None, backoff_initial=0.001, backoff_max=0.001, database_patience=0.05)
    loop._pool = _RestartingDatabase(failures=10**9)  # type: ignore[assignment]
    monkeypatch.setattr(loop, "_decode_batch", lambda msgs: list(msgs))  # their items: _run is replaced too
    with pytest.raises(psycopg.OperationalError):
        loop.process(_msgs())
    assert not fake.stored  # nothing committed: redelivered to whoever takes the partitions


def test_records_of_types_the_loop_does_not_need_are_skipped_unread_and_their_offsets_stored() -> None:
    from flotilla import metrics

    wanted = "dev.flotilla.incidents.RecoveryCompleted"
    loop, fake = _loop(None, needs=frozenset({wanted}))
    # poison of a skipped type: never decoded, so never dead-lettered by this loop
    skipped = [
        FakeMessage(offset=1, value=b"\x00junk", headers=[("ce_type", b"dev.flotilla.incidents.DiagnosticJobStarted")]),
        FakeMessage(offset=2, value=b"x", headers=[("ce_type", b"dev.flotilla.incidents.AlertObserved")]),
    ]
    counted = metrics.RECORDS_SKIPPED.labels("t", "dev.flotilla.incidents.DiagnosticJobStarted")
    before = counted._value.get()
    loop.process(skipped)  # a pool of None: touching the database would raise
    assert counted._value.get() == before + 1
    assert [(tp.partition, tp.offset) for tp in fake.stored[-1]] == [(0, 3)]


def test_a_record_without_a_type_of_an_unknown_type_or_of_a_needed_type_is_read() -> None:
    wanted = "dev.flotilla.incidents.RecoveryCompleted"
    loop, _ = _loop(None, needs=frozenset({wanted}))
    untyped = FakeMessage(offset=1, headers=[("ce_id", b"1")])
    needed = FakeMessage(offset=2, headers=[("ce_type", wanted.encode())])
    # a type no contract names is garbage: read, to be dead-lettered, never passed over
    forged = FakeMessage(offset=3, headers=[("ce_type", b"dev.flotilla.chaos.Made.Up")])
    other = FakeMessage(offset=4, headers=[("ce_type", b"dev.flotilla.incidents.AlertObserved")])
    assert loop._needed([untyped, needed, forged, other]) == [untyped, needed, forged]
    everything, _ = _loop(None)  # needs=None: a loop that declares nothing reads everything
    assert everything._needed([untyped, needed, forged, other]) == [untyped, needed, forged, other]
