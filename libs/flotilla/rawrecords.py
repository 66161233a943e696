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

__all__ = ["b64", "clean_text", "epoch_millis", "first_header", "from_jsonable", "headers_of", "is_uuid", "jsonable"]


def headers_of(raw: RawHeaders) -> list[tuple[str, bytes | None]]:
    """A record's headers as an ordered list of (name, bytes-or-None)."""
    return list(header_pairs(raw))


def first_header(headers: RawHeaders, name: str) -> str | None:
    """The value of header ``name`` as text: the first of a repeated header, but None for a
    repeated ``ce_*`` attribute, which no reader believes (:func:`flotilla.tailing.header`)."""
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


def from_jsonable(schema: Any, value: Any) -> Any:
    """A value in :func:`jsonable` form made writable with ``schema`` (a parsed Avro schema)
    again: base64 text back to bytes where the schema has ``bytes``. Everything else
    jsonable produces (epoch milliseconds, UUID text) Avro takes as it is."""
    named: dict[str, Any] = {}
    _collect(schema, named)
    return _from_jsonable(schema, value, named)


def _collect(schema: Any, named: dict[str, Any]) -> None:
    """Every named type defined anywhere in ``schema`` (later uses refer to it by name)."""
    if isinstance(schema, list):
        for branch in schema:
            _collect(branch, named)
    elif isinstance(schema, Mapping):
        if schema.get("type") in ("record", "error", "enum", "fixed") and "name" in schema:
            named[str(schema["name"])] = schema
        for field in schema.get("fields", []):
            _collect(field["type"], named)
        for part in ("items", "values"):
            if part in schema:
                _collect(schema[part], named)


def _from_jsonable(schema: Any, value: Any, named: dict[str, Any]) -> Any:
    if isinstance(schema, str):
        if schema == "bytes" and isinstance(value, str):
            try:
                return base64.b64decode(value, validate=True)
            except ValueError:
                return value  # not base64: the schema check names the field
        return _from_jsonable(named[schema], value, named) if schema in named else value
    if isinstance(schema, list):  # a union: the branch the value fits
        if value is None:
            return None
        branches = [b for b in schema if b != "null"]
        return _from_jsonable(_branch(branches, value, named), value, named)
    if not isinstance(schema, Mapping):
        return value
    kind = schema.get("type")
    if kind in ("record", "error"):
        if not isinstance(value, Mapping):
            return value
        types = {f["name"]: f["type"] for f in schema.get("fields", [])}
        return {k: _from_jsonable(types[k], v, named) if k in types else v for k, v in value.items()}
    if kind == "array" and isinstance(value, list):
        return [_from_jsonable(schema["items"], v, named) for v in value]
    if kind == "map" and isinstance(value, Mapping):
        return {k: _from_jsonable(schema["values"], v, named) for k, v in value.items()}
    return _from_jsonable(kind, value, named) if kind == "bytes" else value


def _branch(branches: list[Any], value: Any, named: dict[str, Any]) -> Any:
    """For a mapping, the record branch whose fields are exactly its keys (else the first)."""
    if isinstance(value, Mapping):
        for branch in branches:
            record = named.get(branch, branch) if isinstance(branch, str) else branch
            if isinstance(record, Mapping) and {f["name"] for f in record.get("fields", [])} == set(value):
                return branch
    return branches[0] if branches else "null"
