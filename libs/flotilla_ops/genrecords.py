"""Generate ``libs/flotilla/records.py``, the typed records, from ``schemas/``.

``python -m flotilla_ops.genrecords`` writes it; ``--check`` fails (exit 1) when the file
is not what the schemas give, which ``make lint`` and a unit test run, so a schema change
without regeneration cannot land. The file holds declarations only; how a value converts
is worked out from the annotations by ``flotilla.typedrecord.Record``.
"""

from __future__ import annotations

import argparse
import json
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import flotilla
from flotilla.contracts import Contract, defined_name, load_contracts, qualified_name, schemas_dir
from flotilla.typedrecord import avro_name
from flotilla_ops.generated import write_or_check

TARGET = Path(flotilla.__file__).resolve().parent / "records.py"  # next to the runtime it belongs to
REGENERATE = "python -m flotilla_ops.genrecords"

_SCALARS = {"string": "str", "int": "int", "long": "int", "boolean": "bool", "float": "float", "double": "float"}
_SCALARS["bytes"] = "bytes"
_RAW = "dict[str, Any]"  # a union of several records (a proposal's steps): kept as the Avro value


def snake(name: str) -> str:
    """``incidentId`` → ``incident_id``; ``p95Ms`` → ``p95_ms``."""
    out = "".join("_" + c.lower() if c.isupper() else c for c in name)
    return out.lstrip("_")


@dataclass
class _Class:
    name: str
    full_name: str
    topic: str
    doc: str
    fields: list[str] = field(default_factory=list)


class _Collector:
    """Walks the inlined contracts and declares one class per named record."""

    def __init__(self) -> None:
        self.classes: dict[str, _Class] = {}  # full name -> class, in definition order

    def add_contract(self, contract: Contract) -> None:
        self._record(contract.schema, None, topic=contract.topic)

    def _record(self, schema: dict[str, Any], namespace: str | None, *, topic: str = "") -> str:
        full, inner = defined_name(schema, namespace)
        known = self.classes.get(full)
        if known is not None:
            known.topic = known.topic or topic
            return known.name
        name = full.rpartition(".")[2]
        clash = [c.full_name for c in self.classes.values() if c.name == name]
        if clash:
            raise ValueError(f"record names must be unique without their namespace: {full} and {clash[0]}")
        declared = _Class(name, full, topic, str(schema.get("doc", "")))
        lines = [self._field(f, inner) for f in schema.get("fields", [])]
        self.classes[full] = declared  # after its nested types: they are declared first
        declared.fields = lines
        return name

    def _field(self, spec: dict[str, Any], namespace: str | None) -> str:
        attribute = snake(str(spec["name"]))
        if avro_name(attribute) != spec["name"]:
            raise ValueError(f"field {spec['name']!r} does not survive snake case and back ({attribute!r})")
        hint = self._hint(spec["type"], namespace)
        line = f"{attribute}: {hint}"
        if attribute == "event_id":
            return line + ' = ""'
        if "default" in spec:
            default = spec["default"]
            if default == []:
                return line + " = ()"
            if isinstance(default, (dict, list)):
                raise ValueError(f"field {spec['name']!r}: only scalar, null and [] defaults are supported")
            return f"{line} = {json.dumps(default) if isinstance(default, str) else repr(default)}"
        return line

    def _hint(self, schema: Any, namespace: str | None) -> str:
        if isinstance(schema, list):
            branches = [b for b in schema if b != "null"]
            inner = self._hint(branches[0], namespace) if len(branches) == 1 else _RAW
            return f"{inner} | None" if "null" in schema else inner
        if isinstance(schema, str):
            if schema in _SCALARS:
                return _SCALARS[schema]
            full = qualified_name(schema, namespace)
            return self.classes[full].name
        kind = schema.get("type")
        if kind == "record":
            return self._record(schema, namespace)
        if kind == "enum":
            return "str"
        if kind == "array":
            return f"tuple[{self._hint(schema['items'], namespace)}, ...]"
        if kind == "map":
            return f"dict[str, {self._hint(schema['values'], namespace)}]"
        if schema.get("logicalType") == "timestamp-millis":
            return "datetime"
        return self._hint(kind, namespace)


def _docstring(text: str, where: str) -> list[str]:
    body = textwrap.wrap(text, width=104) or [""]
    return ['    """' + body[0], *("    " + line for line in body[1:]), "", f"    {where}", '    """']


def render(contracts: Sequence[Contract]) -> str:
    collector = _Collector()
    for contract in contracts:
        collector.add_contract(contract)
    out = [
        f'"""Typed records, one per Avro record in schemas/. Generated by {REGENERATE}: do not edit.',
        "",
        "Each class is a frozen dataclass (keyword arguments only) whose attributes are the",
        "record's fields in snake case; ``TYPE`` is its full name (the ``ce_type``) and ``TOPIC``",
        "the topic it is published on. See ``flotilla.typedrecord`` for how values convert.",
        '"""',
        "",
        "from __future__ import annotations",
        "",
        "from dataclasses import dataclass",
        "from datetime import datetime",
        "from typing import Any, ClassVar",
        "",
        "from flotilla.typedrecord import Record",
        "",
    ]
    published = [c for c in collector.classes.values() if c.topic]
    names = ["BY_TYPE", *sorted(c.name for c in collector.classes.values())]  # constants first, as ruff sorts
    out += ["__all__ = [", *(f'    "{n}",' for n in names), "]"]
    for declared in collector.classes.values():
        folder = declared.topic or "_types"
        where = f"schemas/{folder}/{declared.name if declared.topic else declared.full_name}.avsc"
        out += ["", "", "@dataclass(frozen=True, kw_only=True, slots=True)", f"class {declared.name}(Record):"]
        out += _docstring(declared.doc, where)
        out += ["", f'    TYPE: ClassVar[str] = "{declared.full_name}"']
        if declared.topic:
            out.append(f'    TOPIC: ClassVar[str] = "{declared.topic}"')
        out += [f"    {line}" for line in declared.fields]
    out += ["", ""]
    out.append("# The published records by ce_type: what a consumer decodes an incoming value into.")
    out.append("BY_TYPE: dict[str, type[Record]] = {")
    out += [f"    {c.name}.TYPE: {c.name}," for c in published]
    out.append("}")
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=REGENERATE, description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only fail when the generated file is stale")
    args = parser.parse_args(argv)
    files = {TARGET: render(load_contracts(schemas_dir()))}
    return write_or_check(files, check=args.check, root=TARGET.parent.parent, regenerate=REGENERATE)


if __name__ == "__main__":
    raise SystemExit(main())
