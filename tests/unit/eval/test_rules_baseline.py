"""The suite's cases as regression tests of the rules reasoner.

``rules_baseline.yaml`` holds what the rules reasoner decides on every case (its
diagnosis, whether the case counts it right, its plan, the plan's class). Any change in
the reasoner's behaviour fails the case it changes; a change made on purpose (an
improvement) updates the baseline on purpose:

    FLOTILLA_EVAL_UPDATE_BASELINE=1 .venv/bin/pytest tests/unit/eval/test_rules_baseline.py
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from flotilla_eval import CaseResult, PolicyCheck, Scenario, run_case
from flotilla_eval.report import case_line
from flotilla_reasoning import RulesConfig, RulesReasoner

from .conftest import SCENARIOS

BASELINE = Path(__file__).with_name("rules_baseline.yaml")
UPDATE = "FLOTILLA_EVAL_UPDATE_BASELINE"
HEADER = """\
# What the rules reasoner decides on every case of the evaluation suite: its diagnosis,
# whether the case counts it right (null: the case gives the diagnosis), its plan and the
# plan's class. tests/unit/eval/test_rules_baseline.py holds the reasoner to it; after a
# deliberate change, regenerate it and read the diff:
#   FLOTILLA_EVAL_UPDATE_BASELINE=1 .venv/bin/pytest tests/unit/eval/test_rules_baseline.py
"""


def outcome(result: CaseResult) -> dict[str, Any]:
    return {
        "diagnosis": result.diagnosis,
        "correct": result.diagnosis_correct,
        "plan": list(result.plan),
        "action": result.action.value,
    }


def outcomes(reasoner: RulesReasoner, policy: PolicyCheck) -> dict[str, dict[str, Any]]:
    return {s.id: outcome(run_case(s, reasoner, policy)) for s in SCENARIOS}


def render(found: dict[str, dict[str, Any]]) -> str:
    lines = [
        f"{case_id}: {yaml.safe_dump(o, default_flow_style=True, width=10_000, sort_keys=False).strip()}"
        for case_id, o in sorted(found.items())
    ]
    return HEADER + "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def baseline(policy: PolicyCheck) -> dict[str, dict[str, Any]]:
    if os.environ.get(UPDATE):
        BASELINE.write_text(render(outcomes(RulesReasoner(), policy)))
    found: dict[str, dict[str, Any]] = yaml.safe_load(BASELINE.read_text())
    return found


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.id for s in SCENARIOS])
def test_the_rules_reasoner_still_decides_its_baseline(
    scenario: Scenario, policy: PolicyCheck, baseline: dict[str, dict[str, Any]]
) -> None:
    result = run_case(scenario, RulesReasoner(), policy)
    assert outcome(result) == baseline.get(scenario.id), (
        f"the rules reasoner changed its decision: {case_line(result)}. If that is intended, update the baseline "
        f"({UPDATE}=1) and say why in the commit."
    )


def test_the_baseline_names_exactly_the_suites_cases(baseline: dict[str, dict[str, Any]]) -> None:
    assert sorted(baseline) == sorted(s.id for s in SCENARIOS)


def test_a_change_in_the_rules_shows_up_against_the_baseline(
    policy: PolicyCheck, baseline: dict[str, dict[str, Any]]
) -> None:
    stricter = outcomes(RulesReasoner(RulesConfig(suspect_ratio=10.0)), policy)
    changed = [case_id for case_id, found in stricter.items() if found != baseline[case_id]]
    assert len(changed) >= 3, "a reasoner that suspects far fewer dependencies should not pass as unchanged"
    failover = outcomes(RulesReasoner(RulesConfig(strategy="failover")), policy)
    assert any(found != baseline[case_id] for case_id, found in failover.items()), "the plan itself is held too"
