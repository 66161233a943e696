"""The evaluation suite: labelled incident scenarios, a reasoner run through them, deterministic scores.

``scenarios/`` holds the cases (YAML, one per file, shipped with the package);
:mod:`~flotilla_eval.fixtures` loads and validates them, :mod:`~flotilla_eval.runner`
asks a reasoner what the two agents would ask, :mod:`~flotilla_eval.policy` puts the plan
to the policy service's Cedar engine offline, :mod:`~flotilla_eval.scoring` classifies
it and :mod:`~flotilla_eval.report` sums the scores per tag. ``flotilla eval`` is the
command (docs/operations/evaluation.md).

It sits above the services in the import layers: it runs the remediation agent's
proposal builder and the policy service's engine, exactly as the fleet would.
"""

from flotilla_eval.fixtures import ScenarioError, load_scenario, load_scenarios
from flotilla_eval.policy import PolicyCheck, PolicyOutcome, PolicyVerdict
from flotilla_eval.report import TagScore, scores
from flotilla_eval.runner import CaseResult, Status, run_case
from flotilla_eval.scenario import ActionRule, ExpectedDiagnosis, Scenario, Stage
from flotilla_eval.scoring import ActionClass, classify_plan, diagnosis_correct
from flotilla_eval.selection import SelectionError, select

__all__ = [
    "ActionClass",
    "ActionRule",
    "CaseResult",
    "ExpectedDiagnosis",
    "PolicyCheck",
    "PolicyOutcome",
    "PolicyVerdict",
    "Scenario",
    "ScenarioError",
    "SelectionError",
    "Stage",
    "Status",
    "TagScore",
    "classify_plan",
    "diagnosis_correct",
    "load_scenario",
    "load_scenarios",
    "run_case",
    "scores",
    "select",
]
