"""``flotilla dlq list|show|requeue``: quarantined dead letters (DLQ reconciler).

A re-queue sends the record back to its origin topic with its original identity
(same ``ce_id``), optionally with a sanitized value read from ``--value-file``, which
the reconciler checks against the registered schema (422 naming the field → exit 2).
A bad file is reported before anything is sent.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from flotilla_ops.cli.output import ExitCode, Output, api_errors, table
from flotilla_ops.cli.records import InputError, read_json_file
from flotilla_ops.cli.runtime import runtime

app = typer.Typer(help="Quarantined dead letters (DLQ reconciler).", no_args_is_help=True)
JsonFlag = Annotated[bool, typer.Option("--json", help="JSON output.")]


def _origin(e: dict[str, Any]) -> str:
    o = e.get("origin") or {}
    return f"{o.get('topic')}[{o.get('partition')}]@{o.get('offset')}"


def render_entry(e: dict[str, Any]) -> str:
    lines = [
        f"entry      {e.get('id')}  ({e.get('status')})",
        f"incident   {e.get('incidentId') or '-'}",
        f"record     {e.get('originalType')}  event {e.get('originalEventId')}",
        f"origin     {_origin(e)}   consumer {e.get('consumer')}",
        f"reason     {e.get('reason')}: {e.get('errorClass')}: {e.get('errorMessage')}",
        f"attempts   {e.get('attempts')}, first failure {e.get('firstFailureTime')}, "
        f"quarantined {e.get('quarantinedAt')}",
    ]
    if e.get("requeue"):
        r = e["requeue"]
        lines.append(
            f"requeued   by {r.get('by')} at {r.get('at')} to {r.get('topic')}[{r.get('partition')}]@{r.get('offset')}"
            + (" (sanitized)" if r.get("sanitized") else "")
        )
    if "headers" in e:
        lines.append("headers")
        lines += [
            f"  {h.get('name')}: {h.get('text') if h.get('text') is not None else h.get('base64')}"
            for h in e["headers"]
        ]
    value = e.get("value")
    if isinstance(value, dict):
        if value.get("decoded"):
            decoded = value["decoded"]
            lines.append(f"value      {decoded.get('recordType')} (schema id {decoded.get('schemaId')})")
            lines += ["  " + line for line in json.dumps(decoded.get("fields"), indent=2).splitlines()]
        else:
            lines.append(f"value      not decodable: {value.get('decodeError')}")
            lines.append(f"  base64 {value.get('base64')}")
    return "\n".join(lines)


@app.command("list")
def list_entries(
    ctx: typer.Context,
    status: Annotated[str | None, typer.Option("--status", help="quarantined or requeued.")] = None,
    reason: Annotated[str | None, typer.Option("--reason", help="e.g. invalid-record, retries-exhausted.")] = None,
    origin: Annotated[str | None, typer.Option("--origin", help="Origin topic.")] = None,
    incident: Annotated[str | None, typer.Option("--incident", "-i", help="Incident id.")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=1000)] = 100,
    as_json: JsonFlag = False,
) -> None:
    """Quarantined records, newest first, filtered by status, reason, origin or incident."""
    out = Output.of(ctx, as_json)
    with runtime(ctx).api() as api, api_errors(out, "listing the quarantine"):
        found = api.quarantine(status=status, reason=reason, origin=origin, incident=incident, limit=limit)
    out.emit(
        {"entries": found},
        lambda d: (
            table(
                [
                    [e["id"], e["status"], e.get("incidentId"), e.get("originalType"), _origin(e), e.get("reason")]
                    for e in d["entries"]
                ],
                ["id", "status", "incident", "type", "origin", "reason"],
            )
            if d["entries"]
            else "nothing quarantined"
        ),
    )


@app.command("show")
def show(
    ctx: typer.Context,
    entry_id: Annotated[str, typer.Argument(help="Quarantine entry id.")],
    as_json: JsonFlag = False,
) -> None:
    """One entry: context, headers, key and value (decoded when it can be)."""
    out = Output.of(ctx, as_json)
    with runtime(ctx).api() as api, api_errors(out, f"reading quarantine entry {entry_id}"):
        found = api.quarantined(entry_id)
    out.emit(found, render_entry)


@app.command("requeue")
def requeue(
    ctx: typer.Context,
    entry_id: Annotated[str, typer.Argument(help="Quarantine entry id.")],
    value_file: Annotated[
        Path | None,
        typer.Option("--value-file", help="Sanitized replacement value: the record's fields as a JSON object."),
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(
            "--token",
            envvar=["FLOTILLA_OPERATOR_TOKEN", "FLOTILLA_TOKEN"],
            help="Operator bearer token (or FLOTILLA_OPERATOR_TOKEN / FLOTILLA_TOKEN).",
        ),
    ] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Re-queue an entry to its origin topic (as it was, or with --value-file)."""
    out = Output.of(ctx, as_json)
    if not token:
        out.fail("an operator token is required: --token or FLOTILLA_OPERATOR_TOKEN", ExitCode.USAGE)
    if out.json and not yes:
        out.fail("--json cannot ask for confirmation: add --yes to re-queue", ExitCode.USAGE)
    value = None
    if value_file is not None:
        try:
            value = read_json_file(value_file)
        except InputError as exc:
            out.fail(f"{exc}; nothing was re-queued", ExitCode.USAGE)
    with runtime(ctx).api() as api:
        with api_errors(out, f"reading quarantine entry {entry_id}"):
            entry = api.quarantined(entry_id)
        if entry.get("status") == "requeued":
            out.fail(f"entry {entry_id} was already re-queued", entry=entry)
        if not out.json:
            typer.echo(render_entry(entry))
            if value is not None:
                typer.echo(f"with the sanitized value from {value_file}:\n{json.dumps(value, indent=2)}")
        if not yes and not typer.confirm(f"\nRe-queue to {(entry.get('origin') or {}).get('topic')}?"):
            out.fail("not re-queued; nothing was sent")
        with api_errors(out, f"re-queueing {entry_id}"):
            done = api.requeue(token, entry_id, value)
    out.emit(
        done,
        lambda d: (
            f"re-queued {d.get('recordType')} {d.get('eventId')} to "
            f"{d['requeuedTo']['topic']}[{d['requeuedTo']['partition']}]@{d['requeuedTo']['offset']} "
            f"as {d.get('requeuedBy')}" + (" (sanitized)" if d.get("sanitized") else "")
        ),
    )
