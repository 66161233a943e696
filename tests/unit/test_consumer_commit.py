"""Offset commits after the group took our partitions away must not end a loop (either one)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from flotilla.consumer import ConsumerLoop, LoopConfig, commit_offsets
from flotilla.rawloop import RawLoop
from flotilla.settings import StackSettings
from tests.support.messages import FakeMessage


class _Consumer:
    def __init__(self, error: int | None, records: list[Any] | None = None) -> None:
        self.error = error
        self.records = list(records or [])
        self.committed: list[list[TopicPartition]] = []

    def subscribe(self, topics: list[str]) -> None:
        pass

    def poll(self, timeout: float) -> Any:
        return self.records.pop(0) if self.records else None

    def consume(self, num_messages: int, timeout: float) -> list[Any]:
        taken, self.records = self.records[:num_messages], self.records[num_messages:]
        return taken

    def commit(self, offsets: list[TopicPartition], asynchronous: bool) -> None:
        self.committed.append(offsets)
        if self.error is not None:
            raise KafkaException(KafkaError(self.error))


def _loop(error: int | None) -> tuple[ConsumerLoop, _Consumer]:
    # Nothing connects: Consumer/Producer construction is lazy, and no pool is used here.
    loop = ConsumerLoop(
        LoopConfig(name="t", topics=("t",), source="/t"),
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


def test_offsets_committed_are_one_past_the_highest_per_partition() -> None:
    fake = _Consumer(None)
    commit_offsets(fake, _msgs())  # type: ignore[arg-type]
    assert {(tp.topic, tp.partition, tp.offset) for tp in fake.committed[0]} == {
        ("incidents", 0, 8),
        ("incidents", 3, 3),
    }


@pytest.mark.parametrize(
    "code", [KafkaError.UNKNOWN_MEMBER_ID, KafkaError.ILLEGAL_GENERATION, KafkaError.REBALANCE_IN_PROGRESS]
)
def test_a_commit_refused_because_partitions_moved_is_survived(code: int) -> None:
    loop, fake = _loop(code)
    loop._commit_offsets(_msgs())  # logs, does not raise: redelivery is deduped
    assert fake.committed


def test_other_commit_failures_still_raise() -> None:
    loop, _ = _loop(KafkaError._TRANSPORT)
    with pytest.raises(KafkaException):
        loop._commit_offsets(_msgs())


class _Pool:
    """Enough of a psycopg pool for a handler that never touches the connection."""

    @contextmanager
    def connection(self) -> Iterator[Any]:
        yield SimpleNamespace(transaction=nullcontext)


def test_the_raw_loop_survives_a_commit_refused_after_a_rebalance() -> None:
    handled: list[int] = []
    loop = RawLoop(
        group="raw-t",
        topics=("incidents",),
        bootstrap="127.0.0.1:1",
        pool=_Pool(),  # type: ignore[arg-type]
        handle=lambda conn, records: handled.append(len(records)) or None,
    )
    fake = _Consumer(KafkaError.REBALANCE_IN_PROGRESS, records=_msgs())
    loop._consumer = fake  # type: ignore[assignment]
    assert loop.poll_once() == 3  # handled and committed in the database; the offsets were refused
    assert handled == [3] and fake.committed
    loop._consumer = _Consumer(KafkaError._TRANSPORT, records=_msgs())  # type: ignore[assignment]
    with pytest.raises(KafkaException):
        loop.poll_once()
