"""``flotilla eval`` (``python -m flotilla_eval``): score a reasoner on the evaluation suite.

The reasoner is built from the agents' own settings (:class:`AgentSettings`:
``FLOTILLA_REASONER``'s choices, ``FLOTILLA_LLM_BASE_URL``, ``FLOTILLA_LLM_MODEL``,
``FLOTILLA_LLM_API_KEY``, the rules' thresholds), which the options override. Exit 0
when the run completed, whatever the scores: they are reported, not asserted (a case
the model server failed is scored as a failure with its error class). Exit 2 for bad
input: an unknown tag, a bad fixture, a ``--limit`` too small for the kinds, an llm run
without a server or a model, policies that cannot be found.
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated, Any

import typer
from flotilla_ops.cli.output import ExitCode, Output, table
from flotilla_reasoning import AgentSettings, LLMReasoner, Reasoner, RulesConfig, RulesReasoner
from pydantic import ValidationError

from flotilla_eval.fixtures import SCENARIOS, ScenarioError, load_scenarios
from flotilla_eval.policy import PolicyCheck
from flotilla_eval.report import HEADERS, case_line, scores, summary_lines, table_rows
from flotilla_eval.runner import CaseResult, run_case
from flotilla_eval.selection import SelectionError, select
from services.policy.decide import PolicyError

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


class ReasonerName(enum.StrEnum):
    RULES = "rules"
    LLM = "llm"


def build_reasoner(name: ReasonerName, *, base_url: str | None, model: str | None, api_key: str | None) -> Reasoner:
    """The reasoner the agents would build from the same settings, with the options over them."""
    given: dict[str, Any] = {"llm_base_url": base_url, "llm_model": model, "llm_api_key": api_key}
    settings = AgentSettings(**{k: v for k, v in given.items() if v is not None})
    if name is ReasonerName.LLM:
        return LLMReasoner.from_settings(settings)
    return RulesReasoner(RulesConfig.from_settings(settings))


def _report(reasoner: Reasoner, model: str | None, results: list[CaseResult]) -> dict[str, Any]:
    """The JSON answer: the scores per tag and every case."""
    rows = scores(results)
    return {
        "ok": True,
        "reasoner": reasoner.name,
        "model": model,
        "summary": [row.to_json() for row in rows],
        "adversarialPassPct": rows[0].to_json()["adversarialPassPct"],
        "cases": [r.to_json() for r in results],
    }


def _text(reasoner: Reasoner, model: str | None, results: list[CaseResult], show_cases: bool) -> str:
    """The answer for people: the cases (with ``--cases``), the table, the adversarial pass rate."""
    rows = scores(results)
    lines = [case_line(r) for r in results] + [""] if show_cases else []
    lines += [f"{reasoner.name} reasoner{f' ({model})' if model else ''}: {len(results)} cases"]
    lines += [table(table_rows(rows), HEADERS), *summary_lines(rows)]
    return "\n".join(lines)


@app.command()
def evaluate(
    ctx: typer.Context,
    reasoner_name: Annotated[ReasonerName, typer.Option("--reasoner", "-r", help="Which reasoner to score.")] = (
        ReasonerName.RULES
    ),
    base_url: Annotated[
        str | None, typer.Option("--base-url", help="llm: the OpenAI-compatible server (FLOTILLA_LLM_BASE_URL).")
    ] = None,
    model: Annotated[str | None, typer.Option("--model", help="llm: the model to ask (FLOTILLA_LLM_MODEL).")] = None,
    api_key: Annotated[
        str | None, typer.Option("--api-key", help="llm: the server's key (FLOTILLA_LLM_API_KEY).")
    ] = None,
    tags: Annotated[
        list[str] | None, typer.Option("--tag", "-t", help="Only cases with this tag (repeat: with every one).")
    ] = None,
    limit: Annotated[
        int | None, typer.Option("--limit", min=1, help="At most N cases, still covering every kind (deterministic).")
    ] = None,
    scenarios_dir: Annotated[
        Path | None, typer.Option("--scenarios", help="A folder of *.yaml cases instead of the shipped suite.")
    ] = None,
    policies_dir: Annotated[
        Path | None,
        typer.Option("--policies", help="The Cedar policies (default: FLOTILLA_POLICY_DIR, else the checkout's)."),
    ] = None,
    show_cases: Annotated[bool, typer.Option("--cases", help="A line per case before the table.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="JSON output: the scores and every case.")] = False,
) -> None:
    """Score a reasoner (rules, or any OpenAI-compatible model) on the labelled incident scenarios."""
    out = Output.of(ctx, as_json)
    try:
        chosen = select(load_scenarios(scenarios_dir), tags or (), limit)
        policy = PolicyCheck.from_directory(policies_dir)
        reasoner = build_reasoner(reasoner_name, base_url=base_url, model=model, api_key=api_key)
    except ScenarioError as exc:
        out.fail(f"bad scenario fixture(s) in {exc.origin}", ExitCode.USAGE, problems=exc.problems)
    except (SelectionError, PolicyError, FileNotFoundError, ValidationError, ValueError) as exc:
        out.fail(str(exc), ExitCode.USAGE)
    model_name = getattr(reasoner, "model", None)
    results = []
    for number, scenario in enumerate(chosen, 1):
        result = run_case(scenario, reasoner, policy)
        results.append(result)
        if reasoner_name is ReasonerName.LLM:
            out.note(f"[{number}/{len(chosen)}] {scenario.id}: {result.action.value} ({result.latency_ms:.0f} ms)")
    out.emit(_report(reasoner, model_name, results), _text(reasoner, model_name, results, show_cases))


def main() -> None:
    app(prog_name="flotilla eval")


__all__ = ["SCENARIOS", "app", "build_reasoner", "main"]
