"""The Avro contracts in ``schemas/`` and their subjects in the registry.

``schemas/<topic>/<RecordName>.avsc`` holds the record types that may appear on a topic.
Several record types share a topic, so subjects follow the topic-record name strategy:
``<topic>-<record full name>``. Services never auto-register; ``register_all`` is run by
operators (``make schemas``) and by the test session, and the registry's compatibility
rule decides whether a change is allowed.

Named types shared by several contracts (``Reasoning``, ``ResourceRef``, the commands a
proposal carries, ...) are written once: in ``schemas/_<anything>/<full name>.avsc`` or as
a contract of their own, and referred to elsewhere by full name. Folders whose name
starts with ``_`` hold definitions only and are not topics. ``load_contracts`` inlines
each referenced definition at its first occurrence in a contract (later occurrences stay
name references, as Avro allows), so every schema registered is self-contained and the
registry never has to resolve references between subjects.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError
from fastavro import parse_schema
from fastavro.schema import SchemaParseException

from flotilla.registry import registrar_client, registry_client, write_refused
from flotilla.settings import load_settings, project_path

# Avro's primitive type names: every other string in a type position names a named type.
_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
_NAMED = frozenset({"record", "error", "enum", "fixed"})


def schemas_dir() -> Path:
    """``$FLOTILLA_SCHEMAS_DIR``, else the checkout's ``schemas/`` (``project_path``)."""
    return project_path("FLOTILLA_SCHEMAS_DIR", "schemas")


@dataclass(frozen=True)
class Contract:
    """One record type on one topic; ``schema`` is self-contained (references inlined)."""

    topic: str
    schema: dict[str, object]

    @property
    def full_name(self) -> str:
        ns = self.schema.get("namespace")
        return f"{ns}.{self.schema['name']}" if ns else str(self.schema["name"])

    @property
    def subject(self) -> str:
        return subject_for(self.topic, self.full_name)

    @property
    def schema_str(self) -> str:
        return json.dumps(self.schema, separators=(",", ":"), sort_keys=True)


def subject_for(topic: str, record_full_name: str) -> str:
    """The topic-record subject name; the one strategy every Flotilla client uses."""
    return f"{topic}-{record_full_name}"


def _is_topic_folder(folder: Path) -> bool:
    return not folder.name.startswith(("_", "."))


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON: {exc}") from exc


def qualified_name(name: str, namespace: str | None) -> str:
    """Avro's rule: a dotted name is already full; a bare one lives in the enclosing namespace."""
    return name if "." in name or not namespace else f"{namespace}.{name}"


def defined_name(schema: dict[str, Any], namespace: str | None) -> tuple[str, str | None]:
    """(full name, namespace its nested types inherit) of a named type's definition."""
    name = str(schema["name"])
    full = name if "." in name else qualified_name(name, schema.get("namespace", namespace) or None)
    return full, full.rpartition(".")[0] or None


@dataclass(frozen=True)
class _Definition:
    path: Path
    schema: dict[str, Any]


class _Inliner:
    """Expands one contract, inlining each referenced definition where it first occurs.

    The walk follows the order in which Avro parsers meet types (fields in order, union
    branches in order, depth first), so a name is always defined before a later
    occurrence refers to it.
    """

    def __init__(self, path: Path, index: dict[str, list[_Definition]]) -> None:
        self._path = path
        self._index = index
        self._defined: set[str] = set()

    def expand(self, schema: Any, namespace: str | None) -> Any:
        if isinstance(schema, list):
            return [self.expand(branch, namespace) for branch in schema]
        if isinstance(schema, str):
            return self._reference(schema, namespace)
        if not isinstance(schema, dict):
            return schema
        kind = schema.get("type")
        if kind in _NAMED and "name" in schema:
            full, inner = defined_name(schema, namespace)
            self._defined.add(full)  # before the fields: a record may refer to itself
            if kind in ("record", "error"):
                fields = [{**f, "type": self.expand(f["type"], inner)} for f in schema.get("fields", [])]
                return {**schema, "fields": fields}
            return dict(schema)
        if kind == "array":
            return {**schema, "items": self.expand(schema["items"], namespace)}
        if kind == "map":
            return {**schema, "values": self.expand(schema["values"], namespace)}
        # {"type": <primitive or name>, ...}, e.g. a logical type or a wrapped reference
        return {**schema, "type": self.expand(kind, namespace)}

    def _reference(self, name: str, namespace: str | None) -> Any:
        if name in _PRIMITIVES:
            return name
        full = qualified_name(name, namespace)
        if full in self._defined:
            return name
        definitions = self._index.get(full, [])
        if not definitions:
            raise ValueError(
                f"{self._path}: unknown type {full!r} (referenced as {name!r}); define it once in "
                f"schemas/_types/{full}.avsc or as a contract in a topic folder"
            )
        distinct = {json.dumps(d.schema, sort_keys=True) for d in definitions}
        if len(distinct) > 1:
            where = ", ".join(str(d.path) for d in definitions)
            raise ValueError(f"{self._path}: type {full!r} is defined differently in {where}")
        # The definition's file gives it its namespace (or none: then ``full`` is a bare
        # name, which can only be referred to from outside any namespace), so inlining it
        # here keeps its full name.
        return self.expand(definitions[0].schema, None)


def _index(files: Sequence[tuple[Path, Any]]) -> dict[str, list[_Definition]]:
    """Full name → the files whose top-level schema defines it."""
    index: dict[str, list[_Definition]] = {}
    for path, schema in files:
        if isinstance(schema, dict) and schema.get("type") in _NAMED and "name" in schema:
            full, _ = defined_name(schema, None)
            index.setdefault(full, []).append(_Definition(path, schema))
    return index


def load_contracts(root: Path | None = None) -> list[Contract]:
    """Every ``schemas/<topic>/*.avsc``, references inlined, sorted for reproducible order.

    Definitions are looked up by full name in every ``*/*.avsc`` (topic folders and
    ``_``-folders alike). An unknown or ambiguous reference raises ValueError naming the
    file and the type.
    """
    base = root or schemas_dir()
    files = [(path, _read(path)) for path in sorted(base.glob("*/*.avsc"))]
    index = _index(files)
    return [
        Contract(topic=path.parent.name, schema=_Inliner(path, index).expand(schema, None))
        for path, schema in files
        if _is_topic_folder(path.parent)
    ]


class IncompatibleSchemaError(RuntimeError):
    """The registry refused a schema change under its compatibility rule."""


def register(client: SchemaRegistryClient, contract: Contract) -> int:
    """Register one contract (idempotent: an identical schema keeps its id)."""
    try:
        return int(client.register_schema(contract.subject, Schema(contract.schema_str, "AVRO")))
    except SchemaRegistryError as exc:
        if exc.http_status_code == 409:
            raise IncompatibleSchemaError(
                f"{contract.subject}: the registry refused this schema as incompatible with the "
                f"registered versions under its compatibility rule: {exc.error_message}"
            ) from exc
        raise


def register_all(client: SchemaRegistryClient, root: Path | None = None) -> dict[str, int]:
    """Register every contract; returns subject → schema id."""
    return {c.subject: register(client, c) for c in load_contracts(root)}


def _as_read(schema: dict[str, Any]) -> dict[str, Any]:
    """A schema as a reader sees it: every name in full, docs dropped.

    The registry hands back its own normal form (names shortened, redundant namespaces
    dropped, docs as first registered), so texts are compared only in this form.
    """

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in ("doc", "__named_schemas")}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    parsed: dict[str, Any] = strip(parse_schema(schema, _ignore_default_error=True))
    return parsed


def _field_changes(registered: dict[str, Any], candidate: dict[str, Any]) -> list[str]:
    """Top-level changes a BACKWARD reader cannot absorb, in words; empty if none is visible."""
    before, after = _as_read(registered), _as_read(candidate)
    found = []
    if before["name"] != after["name"]:
        found.append(f"renames the record from {before['name']} to {after['name']}")
    old = {f["name"]: f for f in before["fields"]}
    for field in after["fields"]:
        was = old.get(field["name"])
        if was is None:
            if "default" not in field:
                found.append(
                    f"adds field '{field['name']}' without a default: records written earlier have no value for it"
                )
        elif was["type"] != field["type"]:
            found.append(f"changes the type of field '{field['name']}'")
    return found


def check_compatible(client: SchemaRegistryClient, contract: Contract) -> None:
    """Ask the registry whether ``contract`` could be registered, without registering it.

    Raises IncompatibleSchemaError naming the subject (and, where it can tell, the
    offending fields) when the subject's compatibility rule would refuse it. A subject
    that does not exist yet accepts anything.
    """
    try:
        compatible = client.test_compatibility(contract.subject, Schema(contract.schema_str, "AVRO"))
    except SchemaRegistryError as exc:
        if exc.http_status_code == 404:  # no such subject (Confluent); Apicurio answers true
            return
        raise
    if compatible:
        return
    why = ""
    try:
        latest = client.get_latest_version(contract.subject)
        text = latest.schema.schema_str if latest.schema is not None else None
        changes = _field_changes(json.loads(text), contract.schema) if text else []
        if changes:
            why = ": it " + "; it ".join(changes)
    except (SchemaRegistryError, SchemaParseException, ValueError):
        pass  # the verdict stands without the explanation
    raise IncompatibleSchemaError(
        f"{contract.subject}: the registry's compatibility rule refuses this schema against the "
        f"registered versions{why}"
    )


def check_all(client: SchemaRegistryClient, root: Path | None = None) -> list[str]:
    """Check every contract without registering; one message per refused subject."""
    refused = []
    for contract in load_contracts(root):
        try:
            check_compatible(client, contract)
        except IncompatibleSchemaError as exc:
            refused.append(str(exc))
    return refused


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m flotilla.schemas``: register every contract, print subject → id.

    ``--check`` only asks the registry whether each contract would be accepted (a CI
    gate for schema changes) and registers nothing.
    """
    parser = argparse.ArgumentParser(prog="python -m flotilla.schemas", description=main.__doc__)
    parser.add_argument("--check", action="store_true", help="check compatibility only; register nothing")
    parser.add_argument("--quiet", action="store_true", help="one summary line instead of a line per subject")
    args = parser.parse_args(argv)
    settings = load_settings()
    if args.check:  # a read: anonymous, so a CI gate needs no registrar credentials
        refused = check_all(registry_client(settings.schema_registry_url))
        if refused:
            raise SystemExit("error: " + "\nerror: ".join(refused))
        print("every contract is compatible with the registry")
        return
    try:
        ids = register_all(registrar_client(settings))  # a write: as the registrar
    except IncompatibleSchemaError as exc:
        raise SystemExit(f"error: {exc}") from None
    except SchemaRegistryError as exc:
        refusal = write_refused(exc, settings)
        if refusal is None:
            raise
        raise SystemExit(f"error: {refusal}") from None
    if args.quiet:
        print(f"[schemas] {len(ids)} contracts registered (python -m flotilla.schemas lists them)")
        return
    for subject, schema_id in ids.items():
        print(f"{subject} -> id {schema_id}")


if __name__ == "__main__":
    main()
