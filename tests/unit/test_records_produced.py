"""``flotilla_records_produced_total`` counts every record appended to the outbox: those a
handler emits and those a service emits outside a handler (a timer, a person's HTTP
call) through ``ServiceContext.emit``. Driven through both emit paths with a fake outbox
(nothing connects) and read back from the Prometheus registry."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
from prometheus_client import REGISTRY

from flotilla.bounds import DEFAULT_MAX_RECORD_BYTES
from flotilla.envelope import Envelope
from flotilla.handling import HandlerContext, Incoming
from flotilla.outbox import OutboxRow
from flotilla.runner import ServiceContext, ServiceSpec
from flotilla.typedrecord import Record

TOPIC = "incidents"
NO_CONN: Any = None  # the fake outbox never touches a connection
OPENED = "flotilla.incidents.ServiceLatencyIncreased"
APPROVED = "flotilla.incidents.RecoveryApproved"


@dataclass(frozen=True, kw_only=True)
class Opened(Record):
    TYPE: ClassVar[str] = OPENED
    TOPIC: ClassVar[str] = TOPIC
    incident_id: str
    invalid: bool = False  # the fake outbox refuses it


@dataclass(frozen=True, kw_only=True)
class Approved(Record):
    TYPE: ClassVar[str] = APPROVED
    TOPIC: ClassVar[str] = TOPIC
    incident_id: str


def produced(source: str, record_type: str, topic: str = TOPIC) -> float:
    return (
        REGISTRY.get_sample_value(
            "flotilla_records_produced_total", {"source": source, "topic": topic, "type": record_type}
        )
        or 0.0
    )


class FakeOutbox:
    """Records what would have been serialized and inserted; refuses records marked invalid."""

    def __init__(self) -> None:
        self.appended: list[tuple[str, str | None, dict[str, Any], Envelope]] = []

    def _check(self, record: Any) -> None:
        if getattr(record, "invalid", False):
            raise ValueError("does not match the schema")

    def append(
        self, conn: Any, record: Any, envelope: Envelope, *, key: str | None = None, topic: str | None = None
    ) -> bytes:
        self._check(record)
        self.appended.append((topic or record.TOPIC, key, record.to_value(), envelope))
        return b""

    def row(self, record: Any, envelope: Envelope, *, key: str | None = None, topic: str | None = None) -> OutboxRow:
        self._check(record)
        return (envelope.id, topic or record.TOPIC, key, envelope.type)


def service(name: str) -> tuple[ServiceContext, FakeOutbox]:
    spec = ServiceSpec(name=name, database="none", publishes=False)  # its outbox is the fake below
    settings = SimpleNamespace(outbox_max_record_bytes=DEFAULT_MAX_RECORD_BYTES)  # all the context reads of it
    ctx = ServiceContext(spec, settings, None, None)  # type: ignore[arg-type]
    outbox = FakeOutbox()
    ctx.outbox = outbox  # type: ignore[assignment]
    return ctx, outbox


def test_records_emitted_outside_a_handler_are_counted() -> None:
    ctx, outbox = service("produced-timer")
    before = produced(ctx.source, OPENED), produced(ctx.source, APPROVED)
    opened = ctx.emit(NO_CONN, Opened(incident_id="incident-1"), key="incident-1", correlation="incident-1")
    ctx.emit(NO_CONN, Approved(incident_id="incident-1"), key="incident-1", correlation="incident-1", cause=opened)
    assert len(outbox.appended) == 2
    assert (produced(ctx.source, OPENED), produced(ctx.source, APPROVED)) == (before[0] + 1, before[1] + 1)
    assert ctx.source == "/flotilla/produced-timer"


def test_a_record_the_outbox_refuses_is_not_counted() -> None:
    ctx, outbox = service("produced-refused")
    before = produced(ctx.source, OPENED)
    with pytest.raises(ValueError):
        ctx.emit(NO_CONN, Opened(incident_id="incident-2", invalid=True), key="incident-2", correlation="incident-2")
    assert outbox.appended == []
    assert produced(ctx.source, OPENED) == before


def test_handler_and_service_emits_count_in_the_same_series() -> None:
    ctx, _ = service("produced-both")
    before = produced(ctx.source, APPROVED)
    cause = Envelope(type=OPENED, source="/flotilla/elsewhere", correlationid="incident-3")
    incoming = Incoming(
        topic=TOPIC, partition=0, offset=0, key="incident-3", envelope=cause, record_type=OPENED, value={}
    )
    pending: list[OutboxRow] = []
    handler = HandlerContext(None, incoming, None, FakeOutbox(), ctx.source, pending)  # type: ignore[arg-type]
    handler.emit(Approved(incident_id="incident-3"), key="incident-3")
    ctx.emit(NO_CONN, Approved(incident_id="incident-3"), key="incident-3", correlation="incident-3")
    assert len(pending) == 1
    assert produced(ctx.source, APPROVED) == before + 2
