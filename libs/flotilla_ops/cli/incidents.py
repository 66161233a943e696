"""``flotilla incidents list|show``: incidents and their timelines, from the audit service.

A timeline is every audited record of one incident in the order things happened, with
the time since the first record, the time since the one before, and which record caused
it (and how long after its cause it came). The audit service serves it in pages of log
order (``--limit``, ``--after``); the command says how to ask for the next one.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from flotilla_ops.cli.output import Output, api_errors, table
from flotilla_ops.cli.records import short_name
from flotilla_ops.cli.runtime import runtime

app = typer.Typer(help="Incidents and their timelines (audit service).", no_args_is_help=True)


def with_timings(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each entry with ``position`` (1-based), ``sincePreviousMs`` and, when its cause is in
    the timeline, ``causePosition`` and ``sinceCauseMs``."""
    by_seq = {e["seq"]: (i + 1, e) for i, e in enumerate(entries)}
    result = []
    previous: dict[str, Any] | None = None
    for position, entry in enumerate(entries, start=1):
        enriched = {**entry, "position": position}
        enriched["sincePreviousMs"] = None if previous is None else entry["elapsedMs"] - previous["elapsedMs"]
        cause = entry.get("causedBy")
        if cause and cause.get("seq") in by_seq:
            cause_position, cause_entry = by_seq[cause["seq"]]
            enriched["causePosition"] = cause_position
            enriched["sinceCauseMs"] = entry["elapsedMs"] - cause_entry["elapsedMs"]
        result.append(enriched)
        previous = entry
    return result


def _short(kind: str | None) -> str:
    return short_name(kind) if kind else "?"


def render_timeline(found: dict[str, Any], show_values: bool = False) -> str:
    entries = found["timeline"]
    head = (
        f"incident {found['incidentId']}  status {found['status']}  {found['entries']} records  "
        f"{found['firstAt']} .. {found['lastAt']}"
    )
    rows = []
    for e in entries:
        if e.get("causePosition") is not None:
            cause = f"#{e['causePosition']} {_short(e['causedBy']['type'])} (+{e['sinceCauseMs']} ms)"
        elif e.get("causedBy"):
            cause = f"seq {e['causedBy']['seq']} {_short(e['causedBy']['type'])} (another page)"
        elif e.get("causationId"):
            cause = f"{e['causationId']} (not in this incident)"
        else:
            cause = "-"
        kind = _short(e.get("type"))
        if e.get("deadLetter"):
            kind += f" [DLQ {e['deadLetter'].get('reason', '?')}]"
        rows.append(
            [
                f"#{e['position']}",
                f"+{e['elapsedMs']} ms",
                "-" if e["sincePreviousMs"] is None else f"+{e['sincePreviousMs']}",
                e["topic"],
                kind,
                e.get("source") or "-",
                cause,
            ]
        )
    text = table(rows, ["#", "elapsed", "Δprev ms", "topic", "type", "source", "caused by"])
    lines = [head, text]
    page = found.get("page") or {}
    if page.get("nextAfter") is not None:
        lines.append(
            f"... more records: flotilla incidents show {found['incidentId']} --after {page['nextAfter']}"
            f"{' --limit ' + str(page['limit']) if page.get('limit') else ''}"
        )
    if show_values:
        lines.append("")
        for e in entries:
            lines.append(f"#{e['position']} {_short(e.get('type'))} {e.get('eventId')}: {e.get('value')}")
    return "\n".join(lines)


@app.command("list")
def list_incidents(
    ctx: typer.Context,
    limit: Annotated[int, typer.Option("--limit", min=1, max=5000, help="At most this many, latest first.")] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="JSON output.")] = False,
) -> None:
    """Incidents the audit service has records of: status, first and last record, count."""
    out = Output.of(ctx, as_json)
    with runtime(ctx).api() as api, api_errors(out, "listing incidents"):
        found = api.incidents(limit=limit)
    out.emit(
        {"incidents": found},
        lambda d: (
            table(
                [[i["incidentId"], i["status"], i["firstAt"], i["lastAt"], i["entries"]] for i in d["incidents"]],
                ["incident", "status", "first", "last", "records"],
            )
            if d["incidents"]
            else "no incidents audited yet"
        ),
    )


@app.command("show")
def show(
    ctx: typer.Context,
    incident_id: Annotated[str, typer.Argument(help="e.g. incident-7")],
    values: Annotated[bool, typer.Option("--values", help="Also print each record's value.")] = False,
    limit: Annotated[
        int | None, typer.Option("--limit", min=1, max=5000, help="At most this many records (audit's page: 500).")
    ] = None,
    after: Annotated[int, typer.Option("--after", min=0, help="Only records after this log position (seq).")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="JSON output.")] = False,
) -> None:
    """An incident's timeline: each record, its time, what caused it and how long after."""
    out = Output.of(ctx, as_json)
    with runtime(ctx).api() as api, api_errors(out, f"reading the timeline of {incident_id}"):
        found = api.timeline(incident_id, limit=limit, after=after or None)
    found = {**found, "timeline": with_timings(found.get("timeline", []))}
    out.emit(found, lambda d: render_timeline(d, values))
