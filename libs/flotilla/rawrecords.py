"""Showing and storing raw Kafka records: headers as text, values as JSON-ready data."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Mapping
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

from flotilla.envelope import RawHeaders, header_pairs
from flotilla.tailing import header

__all__ = ["b64", "clean_text", "epoch_millis", "first_header", "headers_of", "is_uuid", "jsonable"]


def headers_of(raw: RawHeaders) -> list[tuple[str, bytes | None]]:
    """A record's headers as an ordered list of (name, bytes-or-None)."""
    return list(header_pairs(raw))


def first_header(headers: RawHeaders, name: str) -> str | None:
    """The first value of header ``name`` as text (Kafka headers may repeat)."""
    value = header(headers, name)
    return None if value is None else clean_text(value)


def clean_text(value: bytes) -> str:
    """Bytes as text PostgreSQL will store: undecodable bytes and NULs replaced."""
    return value.decode("utf-8", errors="replace").replace("\x00", "\ufffd")


def is_uuid(text: str | None) -> bool:
    if not text:
        return False
    try:
        return str(uuid.UUID(text)) == text.lower()
    except ValueError:
        return False


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def epoch_millis(at: datetime) -> int:
    """Milliseconds since the epoch, in integers (floats would round 123 ms to 122)."""
    aware = at if at.tzinfo is not None else at.replace(tzinfo=UTC)
    return (aware - _EPOCH) // timedelta(milliseconds=1)


def b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def jsonable(value: Any) -> Any:
    """A decoded Avro value as JSON-ready data that round-trips through the serde.

    Timestamps become epoch milliseconds and UUIDs text — what Avro's ``long``
    (timestamp-millis) and ``string`` (uuid) accept back — so a value shown by an API can
    be edited and sent back as a sanitized replacement unchanged in form.
    """
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, datetime):
        return epoch_millis(value)
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        return b64(bytes(value))
    if isinstance(value, Decimal):
        return str(value)
    return value
