"""Strict validation of a record value against its Avro schema, with readable errors.

fastavro's own validator stops at the first problem, reports a missing field as the
whole record, and accepts fields the schema does not have. A producer that gets a
value wrong — a person at the CLI or a model's structured output — needs every
problem, each naming the field, what was expected and what was given.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from fastavro._validation_py import _validate as _validate_field
from fastavro.validation import ValidationError, validate

# fastavro's public validate() re-parses the schema it is given, losing the record's
# named types; its pure-Python core takes them explicitly. Used on the slow path only.
_OPTIONS = {"strict": False, "disable_tuple_notation": False}


def type_label(avro_type: Any) -> str:
    """A short human rendering of an Avro type: ``long (timestamp-millis)``, ``null | string``."""
    if isinstance(avro_type, list):
        return " | ".join(type_label(t) for t in avro_type)
    if isinstance(avro_type, dict):
        logical = avro_type.get("logicalType")
        base = avro_type.get("type")
        if logical:
            return f"{type_label(base)} ({logical})"
        if base in ("record", "enum", "fixed"):
            name = str(avro_type.get("name", base))
            if base == "enum":
                return f"enum {name.rsplit('.', 1)[-1]} {{{', '.join(avro_type.get('symbols', []))}}}"
            return f"{base} {name.rsplit('.', 1)[-1]}"
        if base == "array":
            return f"array<{type_label(avro_type.get('items'))}>"
        if base == "map":
            return f"map<{type_label(avro_type.get('values'))}>"
        return type_label(base)
    return str(avro_type)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_CANONICAL_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


def _is_uuid(text: str) -> bool:
    """The 8-4-4-4-12 form only: other consumers (Java's UUID.fromString) reject the rest."""
    return _CANONICAL_UUID.fullmatch(text) is not None


@dataclass(frozen=True)
class _Field:
    name: str
    parsed: Any
    label: str
    required: bool
    logical: str | None


class RecordValidator:
    """Validates dicts against one record schema; built once per schema, reused per value.

    A valid value costs one pass of fastavro's compiled validator; only an invalid one
    is walked field by field to say everything that is wrong with it.
    """

    def __init__(self, parsed_record: dict[str, Any]) -> None:
        self._parsed = parsed_record
        # Types defined in one field and referred to by name in another resolve here.
        self._named: dict[str, Any] = dict(parsed_record.get("__named_schemas", {}))
        self.name = str(parsed_record["name"])
        self._fields = [
            _Field(
                name=f["name"],
                parsed=f["type"],
                label=type_label(f["type"]),
                required="default" not in f,
                logical=f["type"].get("logicalType") if isinstance(f["type"], dict) else None,
            )
            for f in parsed_record["fields"]
        ]
        self._names = {f.name for f in self._fields}
        self._uuid_fields = [f.name for f in self._fields if f.logical == "uuid"]

    def _quickly_valid(self, value: dict[str, Any]) -> bool:
        if not self._names.issuperset(value):
            return False
        for name in self._uuid_fields:
            given = value.get(name)
            if isinstance(given, str) and not _is_uuid(given):
                return False
        return bool(validate(value, self._parsed, raise_errors=False))

    def problems(self, value: Any) -> list[str]:
        """Every way ``value`` breaks the schema; empty when it is valid."""
        if not isinstance(value, dict):
            return [f"expected a record {self.name.rsplit('.', 1)[-1]} (a mapping), got {type(value).__name__}"]
        if self._quickly_valid(value):
            return []
        found = []
        for field in self._fields:
            if field.name not in value:
                if field.required:
                    found.append(f"field '{field.name}' is missing (expected {field.label})")
                continue
            given = value[field.name]
            if field.logical == "uuid" and isinstance(given, str) and not _is_uuid(given):
                # fastavro accepts any string for a uuid; the contract says otherwise.
                found.append(f"field '{field.name}': expected {field.label}, got a string that is not a UUID")
                continue
            try:
                _validate_field(given, field.parsed, self._named, field.name, True, _OPTIONS)  # type: ignore[no-untyped-call]
            except ValidationError as exc:
                nested = [e.field for e in exc.errors if getattr(e, "field", "")]
                where = f" at {nested[0]}" if nested and "." in nested[0] else ""
                found.append(
                    f"field '{field.name}'{where}: expected {field.label}, got {type(given).__name__} {_shown(given)}"
                )
        for extra in sorted(set(value) - self._names):
            found.append(f"field '{extra}' is not in the schema")
        return found
