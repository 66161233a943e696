"""``flotilla``: the operator's command line for a running fleet.

Commands (``flotilla --help``, ``flotilla <command> --help``): ``publish`` (the CLI
producer), ``tail``, ``types``, ``incidents list|show``, ``approvals list|show``,
``whoami``, ``approve``, ``reject``, ``dlq list|show|requeue``, ``audit verify``, ``stack
up|down|status``, ``fleet up|down|restart|status``, ``demo``, ``eval`` (the evaluation
suite, :mod:`flotilla_ops.cli.evaluation`). Shell completion:
``flotilla --install-completion``.

``--json`` (on the root, ``flotilla --json <command>``, or on each command) prints JSON
for scripts; ``publish --json '{...}'`` is the record itself, so its report in JSON is
``flotilla --json publish ...``.

Exit codes: 0 ok; 1 refused, not found, failed (broken audit chain, unacknowledged
record, a stack command failed); 2 bad input, nothing sent; 3 Kafka, the registry or a
service unreachable (or a member down in ``status``). See
:mod:`flotilla_ops.cli.output` and ``docs/operations/cli.md``.

Every HTTP call goes through :class:`flotilla_ops.fleetapi.FleetApi`.
"""

from __future__ import annotations

from typing import Annotated

import typer

from flotilla_ops.cli import approvals, audit, dlq, evaluation, incidents, stack
from flotilla_ops.cli.output import JSON_META, ExitCode
from flotilla_ops.cli.publish import publish
from flotilla_ops.cli.runtime import Runtime
from flotilla_ops.cli.tail import tail
from flotilla_ops.cli.types import types

app = typer.Typer(
    name="flotilla",
    help="Drive a running Flotilla fleet: publish test events, tail topics, approve recoveries, read timelines.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


@app.callback()
def root(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="JSON output for every command.")] = False,
    http_timeout: Annotated[
        float,
        typer.Option(
            "--http-timeout", envvar="FLOTILLA_HTTP_TIMEOUT", min=0.1, help="Seconds to wait for a fleet service."
        ),
    ] = 10.0,
) -> None:
    if not isinstance(ctx.obj, Runtime):
        ctx.obj = Runtime()
    ctx.obj.http_timeout = http_timeout
    ctx.meta[JSON_META] = as_json


app.command("publish")(publish)
app.command("tail")(tail)
app.command("types")(types)
app.add_typer(incidents.app, name="incidents")
app.add_typer(approvals.app, name="approvals")
app.command("whoami")(approvals.whoami)
app.command("approve")(approvals.approve)
app.command("reject")(approvals.reject)
app.add_typer(dlq.app, name="dlq")
app.add_typer(audit.app, name="audit")
app.add_typer(stack.stack_app, name="stack")
app.add_typer(stack.fleet_app, name="fleet")
app.command("demo")(stack.demo)
app.command("eval", context_settings=evaluation.PASS_THROUGH, add_help_option=False)(evaluation.evaluate)


def main() -> None:
    """The console script."""
    app()


__all__ = ["ExitCode", "Runtime", "app", "main"]
