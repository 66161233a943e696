"""How the CLI answers: text for people, ``--json`` for scripts, and exit codes that mean something.

Exit codes (the same for every command):

====  =====================================================================================
0     done: published and acknowledged, found, approved, chain intact
1     refused or failed: not found, the service said no (401/403/409), the audit chain is
      broken, a record was not acknowledged, ``tail --max N`` saw fewer than N, a stack or
      fleet command failed
2     bad input, nothing was sent: unknown option or record type, a field that does not
      match its schema, unreadable JSON or file, a missing token
3     unreachable: Kafka, the schema registry or a fleet service did not answer (or
      answered 5xx); ``stack status`` / ``fleet status`` with a member down
====  =====================================================================================

In ``--json`` mode every answer, errors included, is JSON on stdout (errors as
``{"ok": false, "error": ..., "exitCode": ...}``); in text mode errors go to stderr.
"""

from __future__ import annotations

import base64
import json
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import date, datetime
from decimal import Decimal
from enum import IntEnum
from typing import Any, NoReturn

import typer

from flotilla_ops.fleetapi import FleetApiError


class ExitCode(IntEnum):
    OK = 0
    FAILED = 1
    USAGE = 2
    UNREACHABLE = 3


JSON_META = "flotilla.json"


def jsonable(value: Any) -> Any:
    """Decoded Avro (datetimes, UUIDs, bytes, decimals) as JSON-ready data."""
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat().replace("+00:00", "Z")
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, Decimal):
        return str(value)
    return value


def status_exit(status: int) -> ExitCode:
    """The exit code for a service's HTTP status (0: it could not be reached)."""
    if status == 0 or status >= 500:
        return ExitCode.UNREACHABLE
    if status in (400, 422):
        return ExitCode.USAGE
    return ExitCode.FAILED


def unreachable(exc: BaseException) -> bool:
    """Whether an exception from a client library means "could not reach it"."""
    if isinstance(exc, (OSError, TimeoutError)):
        return True
    names = {cls.__name__ for cls in type(exc).__mro__}
    return bool(names & {"TransportError", "ConnectError", "TimeoutException", "NetworkError"})


class Output:
    """One command's way of answering, chosen by ``--json`` (the command's or the root's)."""

    def __init__(self, as_json: bool) -> None:
        self.json = as_json

    @classmethod
    def of(cls, ctx: typer.Context, as_json: bool = False) -> Output:
        return cls(as_json or bool(ctx.meta.get(JSON_META)))

    def emit(self, data: Any, text: Callable[[Any], str] | str | None = None) -> None:
        """``data`` as JSON, or its text rendering."""
        if self.json:
            typer.echo(json.dumps(jsonable(data), sort_keys=False))
        elif text is not None:
            typer.echo(text(data) if callable(text) else text)

    def line(self, data: Any) -> None:
        """One JSON object per line (streams), compact."""
        typer.echo(json.dumps(jsonable(data), separators=(",", ":")))

    def note(self, message: str) -> None:
        """Progress for people: stderr, and never in JSON mode."""
        if not self.json:
            typer.echo(message, err=True)

    def fail(self, message: str, code: ExitCode = ExitCode.FAILED, **details: Any) -> NoReturn:
        if self.json:
            typer.echo(json.dumps(jsonable({"ok": False, "error": message, "exitCode": int(code), **details})))
        else:
            typer.echo(f"error: {message}", err=True)
            for problem in details.get("problems") or ():
                typer.echo(f"  - {problem}", err=True)
        raise typer.Exit(int(code))

    def api_failure(self, exc: FleetApiError, doing: str) -> NoReturn:
        code = status_exit(exc.status)
        if exc.status == 0:
            message = f"{doing}: service unreachable at {exc.url} ({exc.message})"
        else:
            message = f"{doing}: {exc.status} {exc.message}"
        problems = _problems(exc.detail)
        self.fail(message, code, status=exc.status, url=exc.url, detail=exc.detail, problems=problems)


def _problems(detail: Any) -> list[str]:
    """A service's list of problems (e.g. a 422 naming fields), when it gives one."""
    if isinstance(detail, dict):
        inner = detail.get("detail", detail)
        if isinstance(inner, dict) and isinstance(inner.get("problems"), list):
            return [str(p) for p in inner["problems"]]
    return []


@contextmanager
def api_errors(out: Output, doing: str) -> Iterator[None]:
    """Turn a FleetApiError into the right message and exit code."""
    try:
        yield
    except FleetApiError as exc:
        out.api_failure(exc, doing)


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    """A plain left-aligned table."""
    cells = [[str(h) for h in headers], *[["-" if c is None else str(c) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells)


def stdout_is_tty() -> bool:
    return sys.stdout.isatty()
