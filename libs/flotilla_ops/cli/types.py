"""``flotilla types``: the catalogue of record types, their topics and fields."""

from __future__ import annotations

from typing import Annotated, Any, cast

import typer
from fastavro import parse_schema

from flotilla.validation import type_label
from flotilla_ops.cli.output import ExitCode, Output, table
from flotilla_ops.cli.records import InputError, catalogue, resolve_type, short_name


def describe_fields(schema: dict[str, Any]) -> list[dict[str, Any]]:
    parsed: dict[str, Any] = cast(dict[str, Any], parse_schema(schema, _ignore_default_error=True))
    docs = {str(f["name"]): f.get("doc") for f in cast(list[dict[str, Any]], schema["fields"])}
    return [
        {
            "name": f["name"],
            "type": type_label(f["type"]),
            "required": "default" not in f,
            **({"default": f["default"]} if "default" in f else {}),
            "doc": docs.get(f["name"]),
        }
        for f in parsed["fields"]
    ]


def types(
    ctx: typer.Context,
    name: Annotated[str | None, typer.Argument(help="A record type: show its fields.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON output.")] = False,
) -> None:
    """The record types `publish` knows (schemas/), or one type's fields."""
    out = Output.of(ctx, as_json)
    if name is None:
        rows = [{"type": c.full_name, "topic": c.topic, "subject": c.subject} for c in catalogue()]
        out.emit(
            {"types": rows},
            lambda d: table(
                [[short_name(r["type"]), r["topic"], r["type"]] for r in d["types"]], ["type", "topic", "full name"]
            ),
        )
        return
    try:
        contract = resolve_type(name)
    except InputError as exc:
        out.fail(str(exc), ExitCode.USAGE, problems=exc.problems)
    fields = describe_fields(contract.schema)
    out.emit(
        {"type": contract.full_name, "topic": contract.topic, "subject": contract.subject, "fields": fields},
        lambda d: (
            f"{d['type']} on {d['topic']}\n"
            + table(
                [
                    [f["name"], f["type"], "yes" if f["required"] else f"default {f.get('default')!r}"]
                    for f in d["fields"]
                ],
                ["field", "type", "required"],
            )
        ),
    )
