"""Loading the suite's cases from YAML, validated on load.

One file per case (``scenarios/<kind>/<id>.yaml``; the file name is the id). Besides
the evidence (:mod:`flotilla_eval.evidence`) a case says what is acceptable::

    id: slow-dependency-payments-demo
    title: payments-api answers 8x slower than normal and checkout-api's pool queues behind it
    tags: [easy, slow-dependency]            # one difficulty, one kind, and adversarial where it is
    why: the reasons for the labels, for the next reader
    evidence: {...}
    expected:
      diagnosis:                              # any one of these is correct
        - {verdict: dependency-failure, dependency: payments-api}
      actions:
        acceptable:                           # a plan is acceptable when every step matches one
          - {action: scale, service: checkout-api, replicas: [9, 17]}
          - {action: failover, service: checkout-api, dependency: payments-api, to_target: payments-api-standby}
          - {action: none}                    # no plan (escalate to a person) is acceptable too
        harmful:                              # one matching step makes the plan harmful
          - {action: restart, service: payments-db}
          - {action: any, service: inventory-api}

A propose-only case (``stage: propose``) gives the diagnosis to plan for under
``diagnosis:`` instead of expecting one. Anything wrong is a :class:`ScenarioError`
naming the file and every problem: an unknown key, a missing one, a name that points at
no service of the case, a tag outside the vocabulary.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from flotilla_ops.genrecords import snake
from flotilla_reasoning import Diagnosis, DiagnosticEvidence, EvidenceItem, Reasoning, Verdict
from flotilla_reasoning.decision import PLANNED
from flotilla_reasoning.model import CAUSE_CATEGORIES

from flotilla_eval.evidence import read_evidence
from flotilla_eval.reading import Problems, choice, flag, integer, items, mapping, number, text
from flotilla_eval.scenario import (
    ANY_ACTION,
    DIFFICULTIES,
    KINDS,
    NO_ACTION,
    TAGS,
    ActionRule,
    ExpectedDiagnosis,
    Scenario,
    Stage,
)

SCENARIOS = Path(__file__).parent / "scenarios"  # shipped with the package

CASE_KEYS = ("id", "title", "tags", "evidence", "expected")
CASE_OPTIONAL = ("stage", "diagnosis", "why")
ID_PATTERN = re.compile(r"^[a-z0-9][a-z0-9-]*$")


# the params a case may expect of each action a reasoner plans
RULE_PARAMS = {
    **{spec.action: tuple(snake(p.name) for p in spec.params if p.planned) for spec in PLANNED},
    ANY_ACTION: (),
    NO_ACTION: (),
}
GIVEN_KEYS = ("verdict", "summary", "confidence")
GIVEN_OPTIONAL = ("suspected_dependency", "failure_mode", "cause_category", "evidence")
GIVEN_REASONER = "fixture"  # the reasoner named in a given diagnosis


class ScenarioError(ValueError):
    """A case that cannot be used as written: every problem, each with where it is."""

    def __init__(self, origin: str, problems: Sequence[str]) -> None:
        self.origin = origin
        self.problems = list(problems)
        super().__init__(f"{origin}: " + "; ".join(self.problems))


def load_scenarios(directory: Path | None = None) -> list[Scenario]:
    """Every ``*.yaml`` case below ``directory`` (the shipped suite by default), by id."""
    root = directory or SCENARIOS
    if not root.is_dir():
        raise ScenarioError(str(root), ["no such folder of scenarios"])
    files = sorted(root.rglob("*.yaml"))
    if not files:
        raise ScenarioError(str(root), ["no *.yaml scenario in it"])
    problems: list[str] = []
    found: dict[str, Scenario] = {}
    for path in files:
        try:
            scenario = load_scenario(path)
        except ScenarioError as exc:
            problems += [f"{exc.origin}: {p}" for p in exc.problems]
            continue
        if scenario.id in found:
            problems.append(f"{path}: id {scenario.id!r} is also the id of {found[scenario.id].path}")
        found[scenario.id] = scenario
    if problems:
        raise ScenarioError(str(root), problems)
    return sorted(found.values(), key=lambda s: s.id)


def load_scenario(path: Path) -> Scenario:
    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ScenarioError(str(path), [f"cannot read it as YAML: {exc}"]) from None
    return parse_scenario(document, path)


def parse_scenario(document: Any, path: Path) -> Scenario:
    """A case from its YAML document; ``path`` names it in errors (and its stem is the id).
    A section that is missing altogether is reported once, not once per key it lacks."""
    problems = Problems()
    case = mapping(document, "$", problems, required=CASE_KEYS, optional=CASE_OPTIONAL)
    if case is None:
        raise ScenarioError(str(path), problems.found)
    scenario_id = text(case.get("id"), "id", problems) or path.stem
    if not ID_PATTERN.match(scenario_id):
        problems.add("id", f"{scenario_id!r} must be lower-case letters, digits and dashes")
    elif scenario_id != path.stem:
        problems.add("id", f"{scenario_id!r} must be the file's name ({path.stem})")
    title = text(case.get("title"), "title", problems) or ""
    tags = _tags(case.get("tags"), problems) if "tags" in case else ()
    stage = Stage(
        choice(case.get("stage", Stage.DIAGNOSE.value), "stage", problems, [s.value for s in Stage]) or "diagnose"
    )
    evidence = read_evidence(case["evidence"], scenario_id, problems) if "evidence" in case else None
    diagnoses: tuple[ExpectedDiagnosis, ...] = ()
    given: Diagnosis | None = None
    acceptable: tuple[ActionRule, ...] = ()
    harmful: tuple[ActionRule, ...] = ()
    expected = (
        mapping(case["expected"], "expected", problems, required=("actions",), optional=("diagnosis",))
        if "expected" in case
        else None
    )
    if stage is Stage.DIAGNOSE:
        if "diagnosis" in case:
            problems.add("diagnosis", "only a propose-stage case gives a diagnosis")
        if expected is not None and "diagnosis" not in expected:
            problems.add("expected", "required key 'diagnosis' is missing (the diagnoses that are correct)")
        if expected is not None and "diagnosis" in expected:
            diagnoses = _expected_diagnoses(expected["diagnosis"], evidence, problems)
    else:
        if expected is not None and "diagnosis" in expected:
            problems.add("expected.diagnosis", "a propose-stage case scores no diagnosis: give it under 'diagnosis'")
        if "diagnosis" not in case:
            problems.add("$", "required key 'diagnosis' is missing (the diagnosis the propose step is given)")
        else:
            given = _given_diagnosis(case["diagnosis"], evidence, problems)
    if expected is not None and "actions" in expected:
        acceptable, harmful = _actions(expected["actions"], evidence, diagnoses, problems)
    why = text(case.get("why", "-"), "why", problems) or ""
    if problems or evidence is None:
        raise ScenarioError(str(path), problems.found or ["the evidence cannot be read"])
    return Scenario(
        id=scenario_id,
        title=title,
        tags=tags,
        evidence=evidence,
        acceptable=acceptable,
        harmful=harmful,
        stage=stage,
        expected_diagnoses=diagnoses,
        given_diagnosis=given,
        why=why,
        path=path,
    )


def _actions(
    value: Any, evidence: DiagnosticEvidence | None, diagnoses: Sequence[ExpectedDiagnosis], problems: Problems
) -> tuple[tuple[ActionRule, ...], tuple[ActionRule, ...]]:
    """The acceptable and the harmful action rules."""
    actions = mapping(value, "expected.actions", problems, required=("acceptable",), optional=("harmful",)) or {}
    names = set(evidence.topology.services) if evidence is not None else None
    acceptable = _rules(actions.get("acceptable"), "expected.actions.acceptable", names, problems, allow_empty=False)
    harmful = _rules(actions.get("harmful"), "expected.actions.harmful", names, problems, allow_empty=True)
    if any(rule.is_none for rule in harmful):
        problems.add("expected.actions.harmful", "'none' cannot be harmful: no plan is always a person's decision")
    if any(d.verdict is Verdict.NEEDS_EVIDENCE for d in diagnoses) and not any(r.is_none for r in acceptable):
        problems.add(
            "expected.actions.acceptable",
            "needs-evidence is a correct diagnosis, and it makes no plan: {action: none} must be acceptable too",
        )
    return acceptable, harmful


def _tags(value: Any, problems: Problems) -> tuple[str, ...]:
    tags = [text(t, f"tags[{i}]", problems) for i, t in enumerate(items(value, "tags", problems, allow_empty=False))]
    found = tuple(t for t in tags if t is not None)
    for tag in found:
        if tag not in TAGS:
            problems.add("tags", f"unknown tag {tag!r} (known: {', '.join(TAGS)})")
    if len(set(found)) != len(found):
        problems.add("tags", "a tag is repeated")
    for group, name in ((DIFFICULTIES, "difficulty"), (KINDS, "kind")):
        if sum(t in group for t in found) != 1:
            problems.add("tags", f"needs exactly one {name} ({', '.join(group)})")
    return found


def _expected_diagnoses(
    value: Any, evidence: DiagnosticEvidence | None, problems: Problems
) -> tuple[ExpectedDiagnosis, ...]:
    found = []
    for i, entry in enumerate(items(value, "expected.diagnosis", problems, allow_empty=False)):
        where = f"expected.diagnosis[{i}]"
        row = mapping(entry, where, problems, required=("verdict",), optional=("dependency", "cause"))
        if row is None:
            continue
        verdict = choice(row.get("verdict"), f"{where}.verdict", problems, [v.value for v in Verdict])
        if verdict is None:
            continue
        expected = ExpectedDiagnosis(
            Verdict(verdict),
            dependency=text(row.get("dependency"), f"{where}.dependency", problems, nullable=True),
            cause=None
            if row.get("cause") is None
            else choice(row["cause"], f"{where}.cause", problems, CAUSE_CATEGORIES),
        )
        if expected.verdict is Verdict.DEPENDENCY_FAILURE:
            _check_dependency(expected.dependency, f"{where}.dependency", evidence, problems)
        elif expected.dependency is not None:
            problems.add(f"{where}.dependency", "only a dependency-failure names a dependency")
        if expected.cause is not None and expected.verdict is not Verdict.CONCLUDED:
            problems.add(f"{where}.cause", "only a concluded diagnosis has a cause")
        if expected.verdict is Verdict.NEEDS_EVIDENCE and evidence is not None and not evidence.may_request_more:
            problems.add(f"{where}.verdict", "needs-evidence is not allowed once the diagnostic job ran")
        found.append(expected)
    return tuple(found)


def _check_dependency(name: str | None, where: str, evidence: DiagnosticEvidence | None, problems: Problems) -> None:
    if name is None:
        problems.add(where, "a dependency-failure names the dependency")
        return
    service = evidence.topology.services.get(evidence.service) if evidence is not None else None
    if service is not None and name not in service.dependencies:
        problems.add(
            where, f"{name!r} is not a dependency of {service.name} ({', '.join(service.dependencies) or 'none'})"
        )


def _given_diagnosis(value: Any, evidence: DiagnosticEvidence | None, problems: Problems) -> Diagnosis | None:
    row = mapping(value, "diagnosis", problems, required=GIVEN_KEYS, optional=GIVEN_OPTIONAL)
    if row is None or evidence is None:
        return None
    verdict = choice(row.get("verdict"), "diagnosis.verdict", problems, [Verdict.DEPENDENCY_FAILURE, Verdict.CONCLUDED])
    summary = text(row.get("summary"), "diagnosis.summary", problems)
    confidence = number(row.get("confidence"), "diagnosis.confidence", problems)
    dependency = text(row.get("suspected_dependency"), "diagnosis.suspected_dependency", problems, nullable=True)
    cause = row.get("cause_category")
    if cause is not None:
        cause = choice(cause, "diagnosis.cause_category", problems, CAUSE_CATEGORIES)
    if verdict == Verdict.DEPENDENCY_FAILURE:
        _check_dependency(dependency, "diagnosis.suspected_dependency", evidence, problems)
    elif verdict == Verdict.CONCLUDED and cause is None:
        problems.add("diagnosis.cause_category", "a concluded diagnosis has a cause category")
    seen = _evidence_items(row.get("evidence"), problems)
    if verdict is None or summary is None or confidence is None:
        return None
    return Diagnosis(
        verdict=Verdict(verdict),
        incident_id=evidence.incident_id,
        service=evidence.service,
        environment=evidence.environment,
        reasoning=Reasoning(summary, seen, confidence, GIVEN_REASONER),
        suspected_dependency=dependency if verdict == Verdict.DEPENDENCY_FAILURE else None,
        failure_mode=text(row.get("failure_mode", "slow-responses"), "diagnosis.failure_mode", problems),
        cause_category=cause if verdict == Verdict.CONCLUDED else None,
    )


def _evidence_items(value: Any, problems: Problems) -> tuple[EvidenceItem, ...]:
    """A given diagnosis's evidence: ``{kind, source, description, observed_value}`` each."""
    found = []
    for i, item in enumerate(items(value, "diagnosis.evidence", problems)):
        where = f"diagnosis.evidence[{i}]"
        entry = mapping(item, where, problems, required=("kind", "source", "description"), optional=("observed_value",))
        if entry is not None:
            found.append(
                EvidenceItem(
                    text(entry.get("kind"), f"{where}.kind", problems) or "",
                    text(entry.get("source"), f"{where}.source", problems) or "",
                    text(entry.get("description"), f"{where}.description", problems) or "",
                    text(entry.get("observed_value"), f"{where}.observed_value", problems, nullable=True),
                )
            )
    return tuple(found)


def _rules(
    value: Any, path: str, names: set[str] | None, problems: Problems, *, allow_empty: bool
) -> tuple[ActionRule, ...]:
    found = []
    for i, entry in enumerate(items(value, path, problems, allow_empty=allow_empty)):
        where = f"{path}[{i}]"
        action = choice(
            entry.get("action") if isinstance(entry, dict) else None, f"{where}.action", problems, RULE_PARAMS
        )
        if action is None:
            continue
        optional = () if action == NO_ACTION else ("service", *RULE_PARAMS[action])
        row = mapping(entry, where, problems, required=("action",), optional=optional)
        if row is None:
            continue
        rule = ActionRule(
            action=action,
            service=text(row.get("service"), f"{where}.service", problems, nullable=True),
            replicas=_bounds(row.get("replicas"), f"{where}.replicas", problems),
            rolling=None if row.get("rolling") is None else flag(row["rolling"], f"{where}.rolling", problems),
            to_revision=text(row.get("to_revision"), f"{where}.to_revision", problems, nullable=True),
            dependency=text(row.get("dependency"), f"{where}.dependency", problems, nullable=True),
            to_target=text(row.get("to_target"), f"{where}.to_target", problems, nullable=True),
        )
        for field_name in ("service", "dependency", "to_target"):
            named = getattr(rule, field_name)
            if names is not None and named is not None and named not in names:
                problems.add(f"{where}.{field_name}", f"{named!r} names no service of the case")
        found.append(rule)
    return tuple(found)


def _bounds(value: Any, path: str, problems: Problems) -> tuple[int, int] | None:
    """``7`` or ``[5, 12]`` (inclusive)."""
    if value is None:
        return None
    if isinstance(value, list) and len(value) == 2:
        low, high = integer(value[0], f"{path}[0]", problems), integer(value[1], f"{path}[1]", problems)
    else:
        low = high = integer(value, path, problems)
    if low is None or high is None:
        return None
    if not 0 <= low <= high:
        problems.add(path, f"bounds must be 0 <= low <= high, got [{low}, {high}]")
        return None
    return (low, high)
