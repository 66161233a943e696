"""The base of the typed records in ``flotilla.records`` (generated from ``schemas/``).

A record class is a frozen dataclass whose attributes are the Avro fields in snake case
(``incidentId`` → ``incident_id``) and whose annotations say how a value converts:
a nested record is its class, an array a ``tuple``, a timestamp a ``datetime``, an
optional field ``X | None``. ``from_value`` reads a decoded Avro value (the dict
fastavro returns: UUIDs as ``uuid.UUID``, timestamps as ``datetime``); ``to_value``
gives the dict the serde writes. The conversion plan is worked out once per class from
the annotations, so the generated module holds declarations only.

``event_id`` is the envelope's id: leave it empty when building a record to emit, and
``HandlerContext.emit`` fills it in.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from typing import Any, ClassVar, Self

__all__ = ["Record", "avro_name", "millis"]

Codec = tuple[Callable[[Any], Any], Callable[[Any], Any]]  # (decode, encode)


def avro_name(attribute: str) -> str:
    """``incident_id`` → ``incidentId``: the Avro field an attribute stands for."""
    head, *rest = attribute.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def millis(at: datetime | int) -> datetime:
    """An instant as timestamp-millis holds it (UTC, whole milliseconds), so a value
    compares equal after a round trip; an int is epoch milliseconds."""
    if isinstance(at, int):
        return datetime.fromtimestamp(at / 1000, UTC)
    return at.astimezone(UTC).replace(microsecond=at.microsecond // 1000 * 1000)


def _same(value: Any) -> Any:
    return value


def _text(value: Any) -> str:
    return str(value)  # logicalType uuid decodes to uuid.UUID; handlers want the text


def _codec(hint: Any) -> Codec:
    """How one annotated attribute converts, from its annotation."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union) and type(None) in args:
        (inner,) = (arg for arg in args if arg is not type(None))
        decode, encode = _codec(inner)
        return (lambda v: None if v is None else decode(v)), (lambda v: None if v is None else encode(v))
    if origin is tuple:
        decode, encode = _codec(args[0])
        return (lambda v: tuple(decode(x) for x in v)), (lambda v: [encode(x) for x in v])
    if origin is dict and args[1] is not Any:
        decode, encode = _codec(args[1])
        return (lambda v: {k: decode(x) for k, x in v.items()}), (lambda v: {k: encode(x) for k, x in v.items()})
    if isinstance(hint, type) and issubclass(hint, Record):
        nested = hint
        return nested.from_value, lambda v: v.to_value()
    if hint is datetime:
        return millis, millis
    if hint is str:
        return _text, _same
    return _same, _same  # int, float, bool, bytes, and raw unions (dict[str, Any])


@dataclass(frozen=True)
class _Slot:
    attribute: str
    field: str
    decode: Callable[[Any], Any]
    encode: Callable[[Any], Any]


class Record:
    """A typed Avro record. Subclasses are generated; ``TYPE`` is the record's full name
    (its ``ce_type``), ``TOPIC`` the topic it is published on (empty for types that only
    appear inside other records)."""

    TYPE: ClassVar[str] = ""
    TOPIC: ClassVar[str] = ""
    _slots: ClassVar[tuple[_Slot, ...] | None] = None

    @classmethod
    def _plan(cls) -> tuple[_Slot, ...]:
        plan = cls.__dict__.get("_slots")
        if plan is None:
            hints = typing.get_type_hints(cls)
            plan = tuple(_Slot(f.name, avro_name(f.name), *_codec(hints[f.name])) for f in fields(cls))  # type: ignore[arg-type]
            cls._slots = plan
        return plan

    @classmethod
    def from_value(cls, value: Mapping[str, Any]) -> Self:
        """The record for a decoded Avro value; a field the value lacks takes its default."""
        present = {s.attribute: s.decode(value[s.field]) for s in cls._plan() if s.field in value}
        return cls(**present)

    def to_value(self) -> dict[str, Any]:
        """The Avro value to serialize (an empty ``event_id`` is left out for emit to fill)."""
        value = {s.field: s.encode(getattr(self, s.attribute)) for s in self._plan()}
        if value.get("eventId") == "":
            del value["eventId"]
        return value
