"""``flotilla audit verify``: ask the audit service to walk its hash chain and signatures."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from flotilla_ops.cli.output import ExitCode, Output, api_errors
from flotilla_ops.cli.runtime import runtime

app = typer.Typer(help="The audit log.", no_args_is_help=True)


def render_verdict(v: dict[str, Any]) -> str:
    if v.get("ok"):
        anchors = v.get("anchors") or {}
        return (
            f"audit chain intact: {v.get('entriesChecked')} entries checked, last seq {v.get('lastSeq')}, "
            f"signed by trusted key {', '.join(v.get('trustedKeys') or []) or '?'}; "
            f"held against {anchors.get('checked', 0)} anchor(s), the newest at entry {anchors.get('newestSeq')}"
        )
    broken = v.get("firstBroken") or {}
    return (
        f"audit chain BROKEN at seq {broken.get('seq')}: {broken.get('problem')} "
        f"({v.get('entriesChecked')} entries checked)"
    )


@app.command("verify")
def verify(
    ctx: typer.Context,
    timeout: Annotated[
        float, typer.Option("--timeout", min=1.0, help="Seconds to wait: the whole log is walked (minutes when large).")
    ] = 600.0,
    as_json: Annotated[bool, typer.Option("--json", help="JSON output.")] = False,
) -> None:
    """Verify every link and signature of the audit log. Exit 1 when the chain is broken."""
    out = Output.of(ctx, as_json)
    with runtime(ctx).api(timeout) as api, api_errors(out, "verifying the audit chain"):
        verdict = api.verify_audit()
    out.emit(verdict, render_verdict)
    if not verdict.get("ok"):
        raise typer.Exit(int(ExitCode.FAILED))
