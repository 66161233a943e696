"""The decision schemas a model must answer in, and the checks its answer must pass.

The same JSON Schema is sent to the model server as the structured-output format and
used here to validate the answer, so a server that ignores ``response_format`` (many
local ones only approximate it) is held to the contract all the same. The schemas use
OpenAI's strict subset: every property required, nullable ones typed ``[T, "null"]``,
``additionalProperties: false`` everywhere. What a schema cannot say — the ids must be
the incident's, the dependency must be one the service has, the proposal may only name
services of the topology — is checked after it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from flotilla import actions
from flotilla.actions import ParamType
from flotilla_reasoning.model import (
    CAUSE_CATEGORIES,
    Action,
    Diagnosis,
    DiagnosticEvidence,
    EvidenceItem,
    PlannedStep,
    Proposal,
    Reasoning,
    TokenUsage,
    Topology,
    Verdict,
)


class InvalidDecision(ValueError):
    """The answer is not an acceptable decision; ``problems`` say why, one per line."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("; ".join(problems))


def _nullable(kind: str) -> dict[str, Any]:
    return {"type": [kind, "null"]}


EVIDENCE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["kind", "source", "description", "observedValue"],
    "properties": {
        "kind": {"type": "string", "description": "metric, dependency-health, deployment, log or trace"},
        "source": {"type": "string", "description": "where it was observed"},
        "description": {"type": "string", "description": "what it shows, one sentence"},
        "observedValue": {**_nullable("string"), "description": "the value with its unit, e.g. 900 ms"},
    },
}

DIAGNOSIS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": [
        "incidentId",
        "service",
        "verdict",
        "suspectedDependency",
        "failureMode",
        "causeCategory",
        "jobKind",
        "summary",
        "confidence",
        "evidence",
    ],
    "properties": {
        "incidentId": {"type": "string", "description": "the incident id, exactly as given"},
        "service": {"type": "string", "description": "the degraded service, exactly as given"},
        "verdict": {"type": "string", "enum": [v.value for v in Verdict]},
        "suspectedDependency": {**_nullable("string"), "description": "dependency-failure: one of the service's"},
        "failureMode": {**_nullable("string"), "description": "dependency-failure: e.g. slow-responses, timeouts"},
        "causeCategory": {"type": ["string", "null"], "enum": [*CAUSE_CATEGORIES, None]},
        "jobKind": {**_nullable("string"), "description": "needs-evidence: e.g. cpu-profile, dependency-probe"},
        "summary": {"type": "string", "description": "the conclusion and its main reason, one or two sentences"},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        "evidence": {"type": "array", "items": EVIDENCE_SCHEMA},
    },
}

# The kinds a reasoner may plan, and their parameters a reasoner chooses.
PLANNED = tuple(spec for spec in actions.SPECS if spec.reasoners_plan)


def _planned_params() -> dict[str, ParamType]:
    """Every parameter a reasoner chooses, across the kinds (one name, one type)."""
    found: dict[str, ParamType] = {}
    for spec in PLANNED:
        for param in spec.params:
            if param.planned and found.setdefault(param.name, param.type) is not param.type:
                raise TypeError(f"{param.name} has two types across the action kinds")
    return found


def _param_schema(name: str, kind: ParamType) -> dict[str, Any]:
    docs = [p.doc for spec in PLANNED for p in spec.params if p.name == name and p.planned]
    schema = {**_nullable(kind.json_type), "description": "; ".join(docs)}
    if kind is ParamType.TEXTS:
        schema["items"] = {"type": "string"}
    return schema


# Each kind's planned parameters, and all of them: a step has every one, null where it
# does not apply (the strict subset has no optional properties).
_STEP_PARAMS: dict[Action, tuple[str, ...]] = {
    Action(spec.action): tuple(p.name for p in spec.params if p.planned) for spec in PLANNED
}
_ALL_PARAMS = tuple(_planned_params())

STEP_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["action", "service", "environment", *_ALL_PARAMS],
    "properties": {
        "action": {"type": "string", "enum": [spec.action for spec in PLANNED]},
        "service": {"type": "string", "description": "a service of the topology"},
        "environment": {"type": "string", "description": "that service's environment"},
        **{name: _param_schema(name, kind) for name, kind in _planned_params().items()},
    },
}

PROPOSAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["incidentId", "diagnosisEventId", "steps", "summary", "confidence", "evidence"],
    "properties": {
        "incidentId": {"type": "string", "description": "the incident id, exactly as given"},
        "diagnosisEventId": {"type": "string", "description": "the diagnosis event id, exactly as given"},
        "steps": {"type": "array", "items": STEP_SCHEMA, "minItems": 1, "maxItems": 5},
        "summary": {"type": "string"},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        "evidence": {"type": "array", "items": EVIDENCE_SCHEMA},
    },
}

# ------------------------------------------------------------ JSON Schema


def _type_ok(value: Any, kind: str) -> bool:
    if kind == "null":
        return value is None
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "string":
        return isinstance(value, str)
    if kind == "array":
        return isinstance(value, list)
    if kind == "object":
        return isinstance(value, dict)
    raise ValueError(f"schema type {kind!r} is not supported")


def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def schema_problems(value: Any, schema: Mapping[str, Any], path: str = "$") -> list[str]:
    """Every way ``value`` breaks ``schema`` (the strict subset used above), by path."""
    kinds = schema.get("type")
    if kinds is not None:
        allowed = [kinds] if isinstance(kinds, str) else list(kinds)
        if not any(_type_ok(value, k) for k in allowed):
            return [f"{path}: expected {' or '.join(allowed)}, got {_shown(value)}"]
    found: list[str] = []
    if "enum" in schema and value not in schema["enum"]:
        choices = ", ".join("null" if c is None else str(c) for c in schema["enum"])
        found.append(f"{path}: {_shown(value)} is not one of {choices}")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            found.append(f"{path}: {value} is below the minimum {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            found.append(f"{path}: {value} is above the maximum {schema['maximum']}")
    if isinstance(value, dict):
        properties: Mapping[str, Any] = schema.get("properties", {})
        for name in schema.get("required", ()):
            if name not in value:
                found.append(f"{path}: required field '{name}' is missing")
        for name, item in value.items():
            if name in properties:
                found += schema_problems(item, properties[name], f"{path}.{name}")
            elif schema.get("additionalProperties") is False:
                found.append(f"{path}: field '{name}' is not in the schema")
    if isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            found.append(f"{path}: needs at least {schema['minItems']} item(s), got {len(value)}")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            found.append(f"{path}: allows at most {schema['maxItems']} item(s), got {len(value)}")
        if "items" in schema:
            for i, item in enumerate(value):
                found += schema_problems(item, schema["items"], f"{path}[{i}]")
    return found


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_json_object(text: str | None) -> dict[str, Any]:
    """The answer as a JSON object; NaN and Infinity (Python's extensions) are refused."""
    if text is None or not text.strip():
        raise InvalidDecision(["the answer is empty: expected one JSON object"])
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except ValueError as exc:
        raise InvalidDecision([f"the answer is not valid JSON: {exc}"]) from None
    if not isinstance(value, dict):
        raise InvalidDecision([f"the answer must be one JSON object, got {type(value).__name__}"])
    return value


# ------------------------------------------------------------- decisions


def _nonempty(value: dict[str, Any], fields: tuple[str, ...], path: str = "$") -> list[str]:
    return [
        f"{path}.{name}: must not be empty"
        for name in fields
        if isinstance(value.get(name), str) and not value[name].strip()
    ]


def _evidence(items: list[dict[str, Any]]) -> tuple[EvidenceItem, ...]:
    return tuple(EvidenceItem(e["kind"], e["source"], e["description"], e["observedValue"]) for e in items)


def diagnosis_from_answer(
    text: str | None, evidence: DiagnosticEvidence, *, reasoner: str, model: str | None, usage: TokenUsage
) -> Diagnosis:
    """Parse and validate a diagnosis answer; raises InvalidDecision listing every problem."""
    value = parse_json_object(text)
    problems = schema_problems(value, DIAGNOSIS_SCHEMA)
    if problems:
        raise InvalidDecision(problems)
    problems = _nonempty(value, ("incidentId", "service", "summary"))
    if value["incidentId"] != evidence.incident_id:
        problems.append(f"$.incidentId: must be {evidence.incident_id!r}, got {_shown(value['incidentId'])}")
    if value["service"] != evidence.service:
        problems.append(f"$.service: must be {evidence.service!r}, got {_shown(value['service'])}")
    verdict = Verdict(value["verdict"])
    known = evidence.topology.services.get(evidence.service)
    dependencies = known.dependencies if known is not None else ()
    if verdict is Verdict.DEPENDENCY_FAILURE:
        dependency = value["suspectedDependency"]
        if not dependency:
            problems.append("$.suspectedDependency: required when verdict is dependency-failure")
        elif dependency not in dependencies:
            problems.append(
                f"$.suspectedDependency: {_shown(dependency)} is not a dependency of {evidence.service} "
                f"(its dependencies: {', '.join(dependencies) or 'none'})"
            )
        if not value["failureMode"]:
            problems.append("$.failureMode: required when verdict is dependency-failure")
    elif verdict is Verdict.CONCLUDED:
        if not value["causeCategory"]:
            problems.append("$.causeCategory: required when verdict is concluded")
    else:
        if not evidence.may_request_more:
            problems.append(
                "$.verdict: needs-evidence is not allowed: the diagnostic job already ran, decide with this evidence"
            )
        if not value["jobKind"]:
            problems.append("$.jobKind: required when verdict is needs-evidence")
    if problems:
        raise InvalidDecision(problems)
    return Diagnosis(
        verdict=verdict,
        incident_id=value["incidentId"],
        service=value["service"],
        environment=evidence.environment,
        reasoning=Reasoning(
            value["summary"], _evidence(value["evidence"]), float(value["confidence"]), reasoner, model, usage
        ),
        suspected_dependency=value["suspectedDependency"] if verdict is Verdict.DEPENDENCY_FAILURE else None,
        failure_mode=value["failureMode"] if verdict is Verdict.DEPENDENCY_FAILURE else None,
        cause_category=value["causeCategory"] if verdict is Verdict.CONCLUDED else None,
        job_kind=value["jobKind"] if verdict is Verdict.NEEDS_EVIDENCE else None,
    )


def _step_problems(i: int, step: dict[str, Any], topology: Topology, max_replicas: int) -> list[str]:
    path = f"$.steps[{i}]"
    action = Action(step["action"])
    service = topology.services.get(step["service"])
    if service is None:
        return [
            f"{path}.service: {_shown(step['service'])} is not a service of the topology "
            f"(services: {', '.join(sorted(topology.services))})"
        ]
    found = _nonempty(step, ("environment",), path)
    if step["environment"] != service.environment:
        found.append(
            f"{path}.environment: {service.name} runs in {service.environment!r}, not {_shown(step['environment'])}"
        )
    wanted = _STEP_PARAMS[action]
    for name in _ALL_PARAMS:
        if name in wanted and step[name] is None:
            found.append(f"{path}.{name}: required for {action.value}")
        elif name not in wanted and step[name] is not None:
            found.append(f"{path}.{name}: must be null for {action.value}")
    if found:
        return found
    found = [f"{path}: {problem}" for problem in actions.by_action(action).check(step)]
    if action is Action.SCALE and not 1 <= step["replicas"] <= max_replicas:
        found.append(f"{path}.replicas: must be between 1 and {max_replicas}, got {step['replicas']}")
    elif action is Action.FAILOVER:
        dependency, target = step["dependency"], step["toTarget"]
        if dependency not in service.dependencies:
            found.append(f"{path}.dependency: {_shown(dependency)} is not a dependency of {service.name}")
        elif service.failover_targets.get(dependency) != target:
            configured = service.failover_targets.get(dependency)
            found.append(
                f"{path}.toTarget: {_shown(target)} is not {service.name}'s failover target for {dependency} "
                f"({configured or 'none configured'})"
            )
    return found


def proposal_from_answer(
    text: str | None,
    diagnosis: Diagnosis,
    topology: Topology,
    *,
    reasoner: str,
    model: str | None,
    usage: TokenUsage,
    max_replicas: int,
) -> Proposal:
    """Parse and validate a proposal answer; raises InvalidDecision listing every problem."""
    value = parse_json_object(text)
    problems = schema_problems(value, PROPOSAL_SCHEMA)
    if problems:
        raise InvalidDecision(problems)
    problems = _nonempty(value, ("summary",))
    if value["incidentId"] != diagnosis.incident_id:
        problems.append(f"$.incidentId: must be {diagnosis.incident_id!r}, got {_shown(value['incidentId'])}")
    if value["diagnosisEventId"] != diagnosis.event_id:
        problems.append(f"$.diagnosisEventId: must be {diagnosis.event_id!r}, got {_shown(value['diagnosisEventId'])}")
    for i, step in enumerate(value["steps"]):
        problems += _step_problems(i, step, topology, max_replicas)
    if problems:
        raise InvalidDecision(problems)
    steps = tuple(
        PlannedStep(
            Action(s["action"]),
            s["service"],
            s["environment"],
            {name: s[name] for name in _STEP_PARAMS[Action(s["action"])]},
        )
        for s in value["steps"]
    )
    reasoning = Reasoning(
        value["summary"], _evidence(value["evidence"]), float(value["confidence"]), reasoner, model, usage
    )
    return Proposal(diagnosis.incident_id, value["diagnosisEventId"], steps, reasoning)
