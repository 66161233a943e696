"""``flotilla stack``, ``flotilla fleet``, ``flotilla demo``: delegate to the local tooling.

``infra/local/stackctl.py`` runs the stack, ``infra/local/fleetctl.py`` the fleet and
``infra/local/demo.py`` the demo incident; this module only runs them (with this
Python) and maps their outcome to the CLI's exit codes: a status with a member down
is 3, a failed up/down/restart is 1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer

from flotilla_ops.cli.output import ExitCode, Output
from flotilla_ops.cli.runtime import runtime

stack_app = typer.Typer(
    help="The local stack: Kafka, registry, Connect, PostgreSQL (infra/local/stackctl.py).", no_args_is_help=True
)
fleet_app = typer.Typer(
    help="The local fleet: the sim and the seven services (infra/local/fleetctl.py).", no_args_is_help=True
)
JsonFlag = Annotated[bool, typer.Option("--json", help="JSON output.")]


def _script(ctx: typer.Context, out: Output, name: str) -> Path:
    path = runtime(ctx).project_root / "infra" / "local" / name
    if not path.exists():
        out.fail(f"{path} not found: stack and fleet commands need a source checkout of Flotilla")
    return path


def run_tool(ctx: typer.Context, out: Output, script: str, *args: str, env: dict[str, str] | None = None) -> int:
    """Run a tool live (text mode) or captured (JSON mode: its output is reported)."""
    path = _script(ctx, out, script)
    command = [sys.executable, str(path), *args]
    cwd = runtime(ctx).project_root
    if not out.json:
        return subprocess.run(command, cwd=cwd, env=env, check=False).returncode
    done = subprocess.run(command, cwd=cwd, env=env, check=False, capture_output=True, text=True)
    out.emit(
        {
            "ok": done.returncode == 0,
            "command": " ".join([Path(sys.executable).name, str(path.relative_to(cwd)), *args]),
            "exitCode": done.returncode,
            "output": done.stdout,
            "errors": done.stderr,
        }
    )
    return done.returncode


def _finish(returncode: int) -> None:
    if returncode != 0:
        raise typer.Exit(int(ExitCode.FAILED))


def status(ctx: typer.Context, out: Output, script: str) -> None:
    path = _script(ctx, out, script)
    done = subprocess.run(
        [sys.executable, str(path), "status", "--json"], cwd=runtime(ctx).project_root, capture_output=True, text=True
    )
    try:
        rows = json.loads(done.stdout)
    except json.JSONDecodeError:
        out.fail(f"{script} status failed: {done.stderr.strip() or done.stdout.strip()}")
    name = "component" if script == "stackctl.py" else "service"
    down = [r[name] for r in rows if r.get("state") != "up"]
    out.emit(
        {"ok": not down, "members": rows, "down": down},
        lambda d: "\n".join(
            f"{r[name]:<18} {r['state']:<5} {r['endpoint']:<24} {r.get('version') or r.get('database') or '-':<22} "
            f"{r['log']}"
            for r in d["members"]
        ),
    )
    if down:
        raise typer.Exit(int(ExitCode.UNREACHABLE))


@stack_app.command("up")
def stack_up(ctx: typer.Context, as_json: JsonFlag = False) -> None:
    """Start the local stack (idempotent; downloads on first run)."""
    _finish(run_tool(ctx, Output.of(ctx, as_json), "stackctl.py", "up"))


@stack_app.command("down")
def stack_down(ctx: typer.Context, as_json: JsonFlag = False) -> None:
    """Stop the local stack, keeping its data."""
    _finish(run_tool(ctx, Output.of(ctx, as_json), "stackctl.py", "down"))


@stack_app.command("status")
def stack_status(ctx: typer.Context, as_json: JsonFlag = False) -> None:
    """Each component: up/down, endpoint, version, log. Exit 3 if any is down."""
    status(ctx, Output.of(ctx, as_json), "stackctl.py")


@fleet_app.command("up")
def fleet_up(ctx: typer.Context, as_json: JsonFlag = False) -> None:
    """Register the contracts, start the sim and the seven services, wait until ready."""
    _finish(run_tool(ctx, Output.of(ctx, as_json), "fleetctl.py", "up"))


@fleet_app.command("down")
def fleet_down(ctx: typer.Context, as_json: JsonFlag = False) -> None:
    """Stop the fleet (the stack keeps running)."""
    _finish(run_tool(ctx, Output.of(ctx, as_json), "fleetctl.py", "down"))


@fleet_app.command("restart")
def fleet_restart(
    ctx: typer.Context,
    service: Annotated[str | None, typer.Argument(help="One member (default: all).")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Restart one member (or all) and wait until it is ready again."""
    _finish(run_tool(ctx, Output.of(ctx, as_json), "fleetctl.py", "restart", *([service] if service else [])))


@fleet_app.command("status")
def fleet_status(ctx: typer.Context, as_json: JsonFlag = False) -> None:
    """Each member: up/down, endpoint, database, log. Exit 3 if any is down."""
    status(ctx, Output.of(ctx, as_json), "fleetctl.py")


def demo(
    ctx: typer.Context,
    auto_approve: Annotated[
        bool, typer.Option("--auto-approve", help="Approve as alice instead of waiting for a person.")
    ] = False,
) -> None:
    """What `make demo` does: stack up, register schemas, fleet up, then a live incident.

    Exit 0 only for a verified recovery and a verified audit chain.
    """
    out = Output(False)
    env = {**os.environ, **({"DEMO_AUTO_APPROVE": "1"} if auto_approve else {})}
    root = runtime(ctx).project_root
    for step, command in (
        ("stack up", [sys.executable, str(_script(ctx, out, "stackctl.py")), "up"]),
        ("schemas", [sys.executable, "-m", "flotilla.schemas"]),
        ("fleet up", [sys.executable, str(_script(ctx, out, "fleetctl.py")), "up"]),
        ("demo", [sys.executable, str(_script(ctx, out, "demo.py"))]),
    ):
        code = subprocess.run(command, cwd=root, env=env, check=False).returncode
        if code != 0:
            out.fail(f"{step} failed (exit {code})")
