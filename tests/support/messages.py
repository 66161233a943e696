"""A stand-in for a polled ``confluent_kafka.Message``, for tests that need no broker."""

from __future__ import annotations

from typing import Any

from flotilla import Envelope


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


SAMPLE_TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def sample_envelope(**overrides: object) -> Envelope:
    """A fully populated envelope with fixed values (a latency fact of incident-204)."""
    fields: dict[str, object] = {
        "type": "dev.flotilla.incidents.ServiceLatencyIncreased",
        "source": "/agents/health",
        "correlationid": "incident-204",
        "id": "6f1c1b52-8a55-4d55-9c69-5e0f4b1e2a10",
        "time": "2024-05-01T12:00:00.123Z",
        "hops": 7,
        "traceparent": SAMPLE_TRACEPARENT,
    }
    fields.update(overrides)
    return Envelope(**fields)  # type: ignore[arg-type]
