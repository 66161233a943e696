"""Outbox.row refuses a topic the service did not declare, before serializing anything."""

from __future__ import annotations

from typing import Any

import pytest

from flotilla.envelope import Envelope
from flotilla.escalations import escalation
from flotilla.outbox import Outbox, UndeclaredTopicError
from flotilla.records import IncidentEscalated


class _Serde:
    def __init__(self) -> None:
        self.serialized: list[str] = []

    def serialize(self, topic: str, record: str, value: dict[str, Any]) -> bytes:
        self.serialized.append(topic)
        return b"\x00\x00\x00\x00\x01"


def _row(outbox: Outbox, topic: str) -> tuple[Any, ...]:
    env = Envelope(type=IncidentEscalated.TYPE, source="/flotilla/remediation-agent", correlationid="i-1")
    record = escalation("i-1", "test", cause=env)
    return outbox.row(record, env, key="production/checkout-api", topic=topic)


def test_a_declared_topic_is_written_and_an_undeclared_one_refused_naming_both() -> None:
    serde = _Serde()
    outbox = Outbox(serde, ("incidents",))  # type: ignore[arg-type]
    assert _row(outbox, "incidents")[1] == "incidents"
    with pytest.raises(UndeclaredTopicError, match=r"remediation-agent may publish to incidents, not to 'commands'"):
        _row(outbox, "commands")
    assert serde.serialized == ["incidents"]


def test_a_service_that_declares_nothing_may_emit_nothing_and_none_means_unchecked() -> None:
    with pytest.raises(UndeclaredTopicError, match="no topic"):
        _row(Outbox(_Serde(), ()), "incidents")  # type: ignore[arg-type]
    assert _row(Outbox(_Serde()), "anything")[1] == "anything"  # type: ignore[arg-type]
