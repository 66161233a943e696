"""Building a record value from what a person typed: the catalogue, ``--field``, ``--json``, ``--file``.

Only the *shape* of the input is handled here: which record type is meant, which text
goes to which (possibly nested) field, and turning text into the type the registered
schema asks for (``windowSeconds=60`` → 60, ``observedAt=now`` → a timestamp). Whether
the result is valid is decided by :class:`flotilla.serde.AvroSerde` against the schema
registered in the registry, which names every wrong field; text that cannot be turned
into the wanted type is passed on as text so that the validator reports it.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from flotilla.contracts import Contract, load_contracts


class InputError(ValueError):
    """What the person typed cannot be used; ``problems`` say why, one line each."""

    def __init__(self, message: str, problems: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.problems = list(problems)


@lru_cache(maxsize=1)
def catalogue() -> tuple[Contract, ...]:
    """Every contract in ``schemas/`` (the catalogue of record types and their topics)."""
    return tuple(load_contracts())


def short_name(full_name: str) -> str:
    return full_name.rsplit(".", 1)[-1]


def resolve_type(name: str, contracts: Sequence[Contract] | None = None) -> Contract:
    """The contract for a short (``ServiceLatencyIncreased``) or full record name."""
    known = list(contracts if contracts is not None else catalogue())
    exact = [c for c in known if c.full_name == name]
    if exact:
        return exact[0]
    by_short = [c for c in known if short_name(c.full_name).lower() == name.lower()]
    if len(by_short) == 1:
        return by_short[0]
    if len(by_short) > 1:
        raise InputError(f"record type {name!r} is ambiguous", [f"use the full name: {c.full_name}" for c in by_short])
    names = sorted({short_name(c.full_name) for c in known})
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}?" if close else "see `flotilla types` for the catalogue"
    raise InputError(f"unknown record type {name!r}: {hint}")


# --------------------------------------------------------------------------- input


def parse_json_object(text: str, where: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{where} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    if not isinstance(value, dict):
        raise InputError(f"{where} must be a JSON object (the record's fields), not {type(value).__name__}")
    return value


def read_json_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None
    return parse_json_object(text, str(path))


def parse_field_flags(flags: Sequence[str]) -> list[tuple[list[str], str]]:
    """``name=value`` (``target.name=value`` for a nested field) → (path, text)."""
    parsed, problems = [], []
    for flag in flags:
        name, sep, text = flag.partition("=")
        path = [p.strip() for p in name.split(".")]
        if not sep or not all(path):
            problems.append(f"--field {flag!r}: expected name=value (nested: outer.inner=value)")
            continue
        parsed.append((path, text))
    if problems:
        raise InputError("bad --field", problems)
    return parsed


# --------------------------------------------------------------------------- types

_PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}
_TIMESTAMPS = {"timestamp-millis", "timestamp-micros", "local-timestamp-millis", "local-timestamp-micros"}


def _resolve(avro_type: Any, named: dict[str, Any]) -> Any:
    if isinstance(avro_type, str) and avro_type not in _PRIMITIVES:
        return named.get(avro_type, avro_type)
    return avro_type


def parse_time(text: str) -> datetime:
    """``now``, epoch milliseconds, or ISO-8601 (``Z`` or an offset; naive means UTC)."""
    text = text.strip()
    if text.lower() == "now":
        return datetime.now(UTC)
    if text.lstrip("-").isdigit():
        return datetime.fromtimestamp(int(text) / 1000, tz=UTC)
    parsed = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


_TRUE = {"true", "yes", "1", "on"}
_FALSE = {"false", "no", "0", "off"}


def _from_text(text: str, avro_type: Any, named: dict[str, Any]) -> Any:
    """Text as the type; ValueError when it is not one."""
    avro_type = _resolve(avro_type, named)
    if isinstance(avro_type, list):
        if text == "null" and "null" in avro_type:
            return None
        branches = [b for b in avro_type if b != "null"]
        # text fits a string branch always: try the others first
        ordered = [b for b in branches if b != "string"] + [b for b in branches if b == "string"]
        for branch in ordered:
            try:
                return _from_text(text, branch, named)
            except ValueError:
                continue
        raise ValueError(text)
    if isinstance(avro_type, dict):
        logical = avro_type.get("logicalType")
        kind = avro_type.get("type")
        if logical in _TIMESTAMPS:
            return parse_time(text)
        if kind in ("record", "array", "map"):
            return from_json(json.loads(text), avro_type, named)
        if kind == "enum":
            return text
        if kind == "fixed":
            return text.encode()
        return _from_text(text, kind, named)
    if avro_type == "string":
        return text
    if avro_type in ("int", "long"):
        return int(text)
    if avro_type in ("float", "double"):
        return float(text)
    if avro_type == "boolean":
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise ValueError(text)
    if avro_type == "bytes":
        return text.encode()
    if avro_type == "null":
        if text == "null":
            return None
        raise ValueError(text)
    raise ValueError(text)


def from_text(text: str, avro_type: Any, named: dict[str, Any]) -> Any:
    """Text as the type, or the text itself when it is not one (the validator says so)."""
    try:
        return _from_text(text, avro_type, named)
    except (ValueError, OverflowError):
        return text


def from_json(value: Any, avro_type: Any, named: dict[str, Any]) -> Any:
    """A JSON value with what JSON cannot say filled in: timestamps given as text."""
    avro_type = _resolve(avro_type, named)
    if isinstance(avro_type, list):
        if value is None:
            return None
        for branch in avro_type:
            resolved = _resolve(branch, named)
            if isinstance(resolved, dict) and (
                (resolved.get("type") == "record" and isinstance(value, dict))
                or (resolved.get("type") == "array" and isinstance(value, list))
                or (resolved.get("logicalType") in _TIMESTAMPS and isinstance(value, str))
            ):
                return from_json(value, resolved, named)
        return value
    if not isinstance(avro_type, dict):
        return value
    if avro_type.get("logicalType") in _TIMESTAMPS and isinstance(value, str):
        try:
            return parse_time(value)
        except ValueError:
            return value
    kind = avro_type.get("type")
    if kind == "record" and isinstance(value, dict):
        fields = {f["name"]: f["type"] for f in avro_type.get("fields", [])}
        return {k: from_json(v, fields[k], named) if k in fields else v for k, v in value.items()}
    if kind == "array" and isinstance(value, list):
        return [from_json(v, avro_type.get("items"), named) for v in value]
    if kind == "map" and isinstance(value, dict):
        return {k: from_json(v, avro_type.get("values"), named) for k, v in value.items()}
    return value


def _field_type(schema: dict[str, Any], path: Sequence[str], named: dict[str, Any]) -> Any:
    """The type at a dotted path through records (through a union's record branch); None if unknown."""
    current: Any = schema
    for part in path:
        current = _resolve(current, named)
        if isinstance(current, list):
            records = [_resolve(b, named) for b in current]
            current = next((r for r in records if isinstance(r, dict) and r.get("type") == "record"), None)
        if not isinstance(current, dict) or current.get("type") != "record":
            return None
        current = next((f["type"] for f in current.get("fields", []) if f["name"] == part), None)
        if current is None:
            return None
    return current


def build_value(
    schema: dict[str, Any], base: dict[str, Any] | None, fields: Sequence[tuple[list[str], str]]
) -> dict[str, Any]:
    """``base`` (from JSON or a file) with ``fields`` (from flags) set over it, typed by ``schema``.

    ``schema`` is a parsed (fastavro) record schema: named types are looked up in its
    ``__named_schemas``.
    """
    named: dict[str, Any] = dict(schema.get("__named_schemas", {}))
    value: dict[str, Any] = from_json(dict(base or {}), schema, named)
    for path, text in fields:
        target = value
        for part in path[:-1]:
            inner = target.get(part)
            if not isinstance(inner, dict):
                inner = {}
                target[part] = inner
            target = inner
        field_type = _field_type(schema, path, named)
        target[path[-1]] = text if field_type is None else from_text(text, field_type, named)
    return value


def field_names(schema: dict[str, Any]) -> set[str]:
    return {str(f["name"]) for f in schema.get("fields", [])}
