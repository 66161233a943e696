"""`flotilla stack|fleet|demo` delegate to infra/local scripts; here the scripts are
stand-ins in a temporary checkout, so only the delegation and exit codes are tested."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from flotilla_ops.cli import Runtime, app
from typer.testing import CliRunner

from flotilla.settings import StackSettings

ROWS = [
    {"component": "kafka", "state": "up", "endpoint": "127.0.0.1:19092", "version": "4.3.0", "log": "k.log"},
    {"component": "registry", "state": "{registry}", "endpoint": "127.0.0.1:18081", "version": "", "log": "r.log"},
]

SCRIPT = """
import json, sys
open({calls!r}, "a").write(" ".join(sys.argv[1:]) + "\\n")
if sys.argv[1] == "status":
    print(json.dumps({rows}))
    sys.exit(0 if "down" not in {rows!r} else 1)
sys.exit({code})
"""


def checkout(tmp_path: Path, registry: str = "up", code: int = 0) -> Runtime:
    local = tmp_path / "infra" / "local"
    local.mkdir(parents=True)
    rows = json.dumps(ROWS).replace("{registry}", registry)
    for name in ("stackctl.py", "fleetctl.py"):
        (local / name).write_text(SCRIPT.format(calls=str(tmp_path / "calls"), rows=rows, code=code))
    return Runtime(settings_factory=StackSettings, repo_root=tmp_path)


def calls(tmp_path: Path) -> list[str]:
    return (tmp_path / "calls").read_text().splitlines()


def test_status_all_up(cli: CliRunner, tmp_path: Path) -> None:
    rt = checkout(tmp_path)
    result = cli.invoke(app, ["stack", "status"], obj=rt)
    assert result.exit_code == 0
    assert "kafka" in result.stdout and "4.3.0" in result.stdout
    assert calls(tmp_path) == ["status --json"]


def test_status_with_a_member_down_exits_3(cli: CliRunner, tmp_path: Path) -> None:
    rt = checkout(tmp_path, registry="down")
    result = cli.invoke(app, ["--json", "stack", "status"], obj=rt)
    assert result.exit_code == 3
    answer = json.loads(result.stdout)
    assert answer["ok"] is False and answer["down"] == ["registry"]


@pytest.mark.parametrize(("code", "expected"), [(0, 0), (2, 1)])
def test_up_and_down_pass_through_success_or_failure(cli: CliRunner, tmp_path: Path, code: int, expected: int) -> None:
    rt = checkout(tmp_path, code=code)
    assert cli.invoke(app, ["fleet", "up"], obj=rt).exit_code == expected
    assert cli.invoke(app, ["stack", "down"], obj=rt).exit_code == expected
    result = cli.invoke(app, ["fleet", "restart", "audit", "--json"], obj=rt)
    assert result.exit_code == expected
    assert json.loads(result.stdout)["exitCode"] == code
    assert calls(tmp_path) == ["up", "down", "restart audit"]


def test_without_a_checkout(cli: CliRunner, tmp_path: Path) -> None:
    rt = Runtime(settings_factory=StackSettings, repo_root=tmp_path)
    result = cli.invoke(app, ["stack", "status"], obj=rt)
    assert result.exit_code == 1 and "source checkout" in result.stderr


def test_help_and_completion_are_there(cli: CliRunner) -> None:
    result = cli.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("publish", "tail", "incidents", "approvals", "approve", "reject", "dlq", "audit", "stack", "fleet",
                    "demo", "types", "--install-completion"):  # fmt: skip
        assert command in result.stdout
    assert cli.invoke(app, ["no-such-command"]).exit_code == 2


def test_types(cli: CliRunner) -> None:
    listed = json.loads(cli.invoke(app, ["--json", "types"]).stdout)
    assert {"type": "dev.flotilla.commands.ScaleService", "topic": "commands",
            "subject": "commands-dev.flotilla.commands.ScaleService"} in listed["types"]  # fmt: skip
    one = cli.invoke(app, ["types", "ServiceLatencyIncreased"])
    assert "observedAt" in one.stdout and "long (timestamp-millis)" in one.stdout
    assert cli.invoke(app, ["types", "Nope"]).exit_code == 2
