"""``flotilla eval``: run the evaluation suite (``python -m flotilla_eval``) and pass its answer on.

The suite sits above the services in the import layers — it runs the remediation agent's
proposal builder and the policy service's Cedar engine as the fleet does — and this CLI
sits below them, so the command reaches it as a process, the way ``stack`` and ``fleet``
reach their tools. Every argument goes through unchanged (``flotilla eval --help`` is the
suite's own help); ``--json`` on the root is passed on; the exit code is the suite's.
Its progress lines go straight to stderr; its answer (the table or JSON) is echoed.
"""

from __future__ import annotations

import subprocess
import sys

import typer

from flotilla_ops.cli.output import JSON_META

MODULE = "flotilla_eval"
PASS_THROUGH = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


def evaluate(ctx: typer.Context) -> None:
    """Score a reasoner (rules, or any OpenAI-compatible model) on the labelled incident scenarios.

    Options: see `flotilla eval --help` (docs/operations/evaluation.md).
    """
    args = list(ctx.args)
    if ctx.meta.get(JSON_META) and "--json" not in args:
        args.append("--json")
    done = subprocess.run([sys.executable, "-m", MODULE, *args], stdout=subprocess.PIPE, text=True, check=False)
    typer.echo(done.stdout, nl=False)
    raise typer.Exit(done.returncode)
