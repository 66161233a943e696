"""Waiting for records in tests; ``tail_consumer`` is the library's."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from confluent_kafka import Consumer, Message
from confluent_kafka.admin import AdminClient, NewTopic

from flotilla import tailing as headers
from flotilla.tailing import tail_consumer

__all__ = ["by_event_id", "header", "read_until_all", "tail_consumer", "wait_for"]


def wait_for(consumer: Consumer, match: Callable[[Message], bool], timeout: float = 30) -> Message:
    """The first record for which ``match`` is true; fails the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = consumer.poll(0.2)
        if msg is None or msg.error():
            continue
        if match(msg):
            return msg
    raise AssertionError(f"no matching record within {timeout:.0f} s")


def read_until_all(consumer: Consumer, event_ids: set[str], timeout: float = 30) -> list[Message]:
    """Every record read until each of ``event_ids`` has been seen, in the order read.

    Waiting for several records one ``wait_for`` at a time would drop any awaited record
    that arrives (on another partition) before the one being waited for.
    """
    missing = {event_id.encode() for event_id in event_ids}
    read: list[Message] = []
    deadline = time.monotonic() + timeout
    while missing and time.monotonic() < deadline:
        msg = consumer.poll(0.2)
        if msg is None or msg.error():
            continue
        read.append(msg)
        missing.discard(header(msg, "ce_id") or b"")
    if missing:
        raise AssertionError(f"{len(missing)} of {len(event_ids)} records not seen within {timeout:.0f} s")
    return read


def header(msg: Message, name: str) -> bytes | None:
    return headers.header(msg.headers(), name)


def by_event_id(event_id: str) -> Callable[[Message], bool]:
    return lambda msg: header(msg, "ce_id") == event_id.encode()


def wait_visible(admin: AdminClient, topics: list[str], timeout: float = 15) -> None:
    """Until the broker's metadata has every topic with its partitions. A create is answered
    once the controller has committed it; the broker applies it a moment later, and until
    then a describe of its configs says UNKNOWN_TOPIC_OR_PART (seen under load)."""
    deadline = time.monotonic() + timeout
    while True:
        listed = admin.list_topics(timeout=5).topics
        missing = [t for t in topics if t not in listed or listed[t].error is not None or not listed[t].partitions]
        if not missing:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"topics {missing} not in the broker's metadata {timeout:.0f} s after their creation")
        time.sleep(0.2)


@contextmanager
def fresh_topic(bootstrap: str, prefix: str, partitions: int = 1) -> Iterator[str]:
    """A new topic named ``<prefix>-<random>`` and its DLQ (one partition), deleted afterwards."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, partitions, 1), NewTopic(f"{name}.dlq", 1, 1)]).values():
        future.result(15)
    wait_visible(admin, [name, f"{name}.dlq"])
    try:
        yield name
    finally:
        admin.delete_topics([name, f"{name}.dlq"])
