"""`flotilla eval` on the rules reasoner: the table, JSON, filters, and bad input."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from flotilla_eval.cli import app
from flotilla_ops.cli import app as flotilla
from typer.testing import CliRunner

from .conftest import SCENARIOS, minimal, write

LLM_VARIABLES = ("FLOTILLA_LLM_BASE_URL", "FLOTILLA_LLM_MODEL", "FLOTILLA_LLM_API_KEY", "FLOTILLA_REASONER")


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    for name in LLM_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return CliRunner()


def test_the_table_for_the_rules_reasoner(cli: CliRunner) -> None:
    result = cli.invoke(app, [])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == f"rules reasoner: {len(SCENARIOS)} cases"
    assert lines[1].split() == [
        "tag", "cases", "diagnosis", "action", "harmful", "refused", "valid", "1st", "valid", "retry", "tokens",
        "p50", "ms", "p95", "ms",
    ]  # fmt: skip
    rows = {line.split()[0]: line.split() for line in lines[2:] if not line.startswith("adversarial pass")}
    assert rows["all"][1] == str(len(SCENARIOS))
    assert {"easy", "medium", "hard", "slow-dependency", "noisy-neighbour", "no-action", "adversarial"} <= set(rows)
    assert lines[-1].startswith("adversarial pass rate: ")


def test_json_gives_the_scores_and_every_case(cli: CliRunner) -> None:
    result = cli.invoke(app, ["--json", "--tag", "adversarial"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    adversarial = [s for s in SCENARIOS if s.adversarial]
    assert report["ok"] and report["reasoner"] == "rules" and len(report["cases"]) == len(adversarial)
    assert report["summary"][0]["tag"] == "all" and report["summary"][0]["cases"] == len(adversarial)
    assert report["adversarialPassPct"] is not None
    assert {r["id"] for r in report["cases"]} == {s.id for s in adversarial}
    first = report["cases"][0]
    assert {"diagnosis", "plan", "action", "policy", "validFirstTry", "latencyMs", "decisions"} <= set(first)


def test_cases_prints_a_line_per_case(cli: CliRunner) -> None:
    result = cli.invoke(app, ["--limit", "9", "--cases"])
    assert result.exit_code == 0, result.output
    assert sum(" -> " in line for line in result.stdout.splitlines()) == 9


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tag", "hrad"], "unknown tag(s) hrad"),
        (["--limit", "3"], "--limit 3 cannot cover the 8 kinds"),
        (["--reasoner", "llm"], "FLOTILLA_LLM_BASE_URL and FLOTILLA_LLM_MODEL"),
    ],
)
def test_bad_input_exits_2_with_a_clear_error(cli: CliRunner, args: list[str], message: str) -> None:
    result = cli.invoke(app, ["--json", *args])
    assert result.exit_code == 2
    answer = json.loads(result.stdout)
    assert answer["ok"] is False and message in answer["error"]


def test_a_bad_fixture_exits_2_naming_the_file_and_the_problem(cli: CliRunner, tmp_path: Path) -> None:
    document = minimal()
    document["evidence"]["topology"]["services"][0]["dependencies"].append("nowhere")
    write(tmp_path, document)
    result = cli.invoke(app, ["--scenarios", str(tmp_path)])
    assert result.exit_code == 2
    assert "bad scenario fixture(s)" in result.stderr
    assert "minimal.yaml: evidence.topology.services[0] (checkout-api): dependency 'nowhere'" in result.stderr


def test_a_folder_of_ones_own_cases_is_scored(cli: CliRunner, tmp_path: Path) -> None:
    write(tmp_path, minimal())
    result = cli.invoke(app, ["--json", "--scenarios", str(tmp_path)])
    assert result.exit_code == 0, result.output
    [case] = json.loads(result.stdout)["cases"]
    assert case["id"] == "minimal" and case["action"] == "acceptable"


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_an_unreachable_model_server_is_scored_as_failures_not_a_crash(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLOTILLA_LLM_MAX_RETRIES", "0")
    base_url = f"http://127.0.0.1:{closed_port()}/v1"
    result = cli.invoke(app, ["--json", "--reasoner", "llm", "--base-url", base_url, "--model", "m", "--limit", "9"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    everything = report["summary"][0]
    assert report["reasoner"] == "llm" and report["model"] == "m"
    assert everything["errors"] == {"APIConnectionError": 9}
    assert everything["validAfterRetryPct"] == 0.0 and everything["harmful"] == 0


def test_flotilla_eval_runs_the_suite(cli: CliRunner) -> None:
    result = cli.invoke(flotilla, ["--json", "eval", "--limit", "9"])
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.stdout)["cases"]) == 9
    refused = cli.invoke(flotilla, ["eval", "--tag", "hrad"])
    assert refused.exit_code == 2
