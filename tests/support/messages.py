"""A stand-in for a polled ``confluent_kafka.Message``, for tests that need no broker."""

from __future__ import annotations

from typing import Any


class FakeMessage:
    """The accessors of a record as consumers read it: topic, partition, offset, key,
    value, headers, timestamp and (no) error. Every field is a keyword with a neutral
    default; a test names what it asserts on."""

    def __init__(
        self,
        *,
        topic: str | None = "incidents",
        partition: int = 0,
        offset: int = 0,
        key: bytes | None = None,
        value: bytes | None = None,
        headers: Any = None,
        timestamp_ms: int = 1_700_000_000_000,
    ) -> None:
        self._topic, self._partition, self._offset = topic, partition, offset
        self._key, self._value, self._headers, self._ts = key, value, headers, timestamp_ms

    def topic(self) -> str | None:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def headers(self) -> Any:
        return self._headers

    def timestamp(self) -> tuple[int, int]:
        return (1, self._ts)  # TIMESTAMP_CREATE_TIME

    def error(self) -> None:
        return None
