"""Dead letters: the topic name, the reasons, and the context headers added to a record."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from flotilla.deadletter import (
    ATTEMPTS,
    CONSUMER,
    ERROR_CLASS,
    ERROR_MESSAGE,
    FIRST_FAILURE_TIME,
    ORIGIN_OFFSET,
    ORIGIN_PARTITION,
    ORIGIN_TOPIC,
    REASON,
    DeadLetter,
    Reason,
    dlq_topic,
)
from tests.support.messages import FakeMessage

CONTEXT_NAMES = [
    "dlq_origin_topic",
    "dlq_origin_partition",
    "dlq_origin_offset",
    "dlq_consumer",
    "dlq_reason",
    "dlq_error_class",
    "dlq_error_message",
    "dlq_first_failure_time",
    "dlq_attempts",
]
FIRST_FAILURE = datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=UTC)


def dead_lettered(headers: Any, *, topic: str | None = "incidents") -> Any:
    """The dead-lettered record these tests describe: incidents[3]@1042, keyed incident-204."""
    return FakeMessage(
        topic=topic, partition=3, offset=1042, key=b"incident-204", value=b"\x00\x00\x00\x00\x01junk", headers=headers
    )


class HandlerBroke(RuntimeError):
    pass


def _letter(**overrides: Any) -> DeadLetter:
    fields: dict[str, Any] = {
        "reason": Reason.RETRIES_EXHAUSTED,
        "error": HandlerBroke("database said no"),
        "first_failure": FIRST_FAILURE,
        "attempts": 5,
    }
    fields.update(overrides)
    return DeadLetter(**fields)


ORIGINAL = [
    ("ce_id", b"6f1c1b52-8a55-4d55-9c69-5e0f4b1e2a10"),
    ("ce_type", "dev.flotilla.incidents.ServiceLatencyIncreased"),
    ("ce_hops", b"7"),
    ("x-empty", None),
]


def test_dlq_topic_name() -> None:
    assert dlq_topic("incidents") == "incidents.dlq"
    assert dlq_topic("commands") == "commands.dlq"


def test_reason_values_are_exactly_these() -> None:
    assert [r.value for r in Reason] == [
        "undecodable",
        "unknown-schema",
        "invalid-record",
        "retries-exhausted",
        "unauthorized",
        "unpublishable",
    ]
    assert Reason("unknown-schema") is Reason.UNKNOWN_SCHEMA


def test_context_header_names() -> None:
    assert [
        ORIGIN_TOPIC,
        ORIGIN_PARTITION,
        ORIGIN_OFFSET,
        CONSUMER,
        REASON,
        ERROR_CLASS,
        ERROR_MESSAGE,
        FIRST_FAILURE_TIME,
        ATTEMPTS,
    ] == CONTEXT_NAMES


def test_original_headers_come_first_normalised_to_bytes() -> None:
    headers = _letter().headers(dead_lettered(ORIGINAL), "policy-service")  # type: ignore[arg-type]
    assert headers[:4] == [
        ("ce_id", b"6f1c1b52-8a55-4d55-9c69-5e0f4b1e2a10"),
        ("ce_type", b"dev.flotilla.incidents.ServiceLatencyIncreased"),
        ("ce_hops", b"7"),
        ("x-empty", None),
    ]


def test_context_headers_follow_in_order_with_values() -> None:
    headers = _letter().headers(dead_lettered(ORIGINAL), "policy-service")  # type: ignore[arg-type]
    context = headers[len(ORIGINAL) :]
    assert [name for name, _ in context] == CONTEXT_NAMES
    assert all(isinstance(value, bytes) for _, value in context)
    assert dict(context) == {
        "dlq_origin_topic": b"incidents",
        "dlq_origin_partition": b"3",
        "dlq_origin_offset": b"1042",
        "dlq_consumer": b"policy-service",
        "dlq_reason": b"retries-exhausted",
        "dlq_error_class": b"HandlerBroke",
        "dlq_error_message": b"database said no",
        "dlq_first_failure_time": b"2024-05-01T12:00:00.123+00:00",
        "dlq_attempts": b"5",
    }


@pytest.mark.parametrize(
    "shape",
    [
        [("ce_id", "abc"), ("ce_hops", "3")],
        {"ce_id": "abc", "ce_hops": b"3"},
        [("ce_id", b"abc"), ("ce_hops", b"3")],
    ],
    ids=["pairs-of-str", "dict-mixed", "pairs-of-bytes"],
)
def test_every_header_shape_is_kept(shape: Any) -> None:
    headers = _letter().headers(dead_lettered(shape), "c")  # type: ignore[arg-type]
    assert headers[:2] == [("ce_id", b"abc"), ("ce_hops", b"3")]
    assert [name for name, _ in headers[2:]] == CONTEXT_NAMES


def test_a_message_without_headers_gets_only_context() -> None:
    headers = _letter().headers(dead_lettered(None), "c")  # type: ignore[arg-type]
    assert [name for name, _ in headers] == CONTEXT_NAMES


def test_duplicate_original_headers_are_all_kept() -> None:
    dupes = [("trace", b"a"), ("trace", b"b")]
    headers = _letter().headers(dead_lettered(dupes), "c")  # type: ignore[arg-type]
    assert headers[:2] == dupes


def test_long_error_messages_are_truncated_at_2000_characters() -> None:
    letter = _letter(error=ValueError("é" * 1999 + "xyz"))
    context = dict(letter.headers(dead_lettered([]), "c"))  # type: ignore[arg-type]
    message = context["dlq_error_message"]
    assert isinstance(message, bytes)
    assert message.decode() == "é" * 1999 + "x"
    assert len(message.decode()) == 2000


def test_a_message_of_exactly_2000_characters_is_kept_whole() -> None:
    letter = _letter(error=ValueError("a" * 2000))
    context = dict(letter.headers(dead_lettered([]), "c"))  # type: ignore[arg-type]
    assert context["dlq_error_message"] == b"a" * 2000


@pytest.mark.parametrize("reason", list(Reason))
def test_reason_header_carries_the_reason_value(reason: Reason) -> None:
    context = dict(_letter(reason=reason).headers(dead_lettered([]), "c"))  # type: ignore[arg-type]
    assert context["dlq_reason"] == reason.value.encode()


def test_first_failure_time_is_iso_8601_with_milliseconds() -> None:
    local = FIRST_FAILURE.astimezone(timezone(timedelta(hours=2)))
    context = dict(_letter(first_failure=local).headers(dead_lettered([]), "c"))  # type: ignore[arg-type]
    stamp = context["dlq_first_failure_time"]
    assert isinstance(stamp, bytes)
    assert stamp == b"2024-05-01T14:00:00.123+02:00"
    assert datetime.fromisoformat(stamp.decode()) == FIRST_FAILURE.replace(microsecond=123000)


def test_first_failure_time_keeps_milliseconds_when_zero() -> None:
    whole = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    context = dict(_letter(first_failure=whole).headers(dead_lettered([]), "c"))  # type: ignore[arg-type]
    assert context["dlq_first_failure_time"] == b"2024-05-01T12:00:00.000+00:00"


def test_a_message_with_no_topic_gets_an_empty_origin() -> None:
    context = dict(_letter().headers(dead_lettered([], topic=None), "c"))  # type: ignore[arg-type]
    assert context["dlq_origin_topic"] == b""


def test_headers_leave_the_message_alone() -> None:
    original = list(ORIGINAL)
    msg = dead_lettered(original)
    _letter().headers(msg, "c")  # type: ignore[arg-type]
    assert msg.headers() == ORIGINAL
    assert msg.key() == b"incident-204"
