"""The ``evidence`` section of a fixture: what the agent sees, read into the reasoners' own types.

The section mirrors :class:`~flotilla_evidence.model.Topology` field by field (snake case,
a list of services instead of a mapping), so a case reads like a snapshot the evidence
source would take, and a reasoner sees exactly what it would see in production::

    evidence:
      service: checkout-api
      environment: production
      symptom: checkout-api p95 1840 ms over its 500 ms threshold
      diagnostic_job: null            # the slow job that already ran (cpu-profile); null: first look
      topology:
        observed_at: 2026-03-02T10:12:00Z
        services:
          - {name: checkout-api, replicas: 4, p95_ms: 1840, threshold_ms: 500, dependencies: [payments-api]}
          - {name: payments-api, replicas: 3, p95_ms: 880, threshold_ms: 400}
        dependency_latency:
          - {service: checkout-api, dependency: payments-api, p95_ms: 900, baseline_ms: 110}
        utilization: {checkout-api: 2.125}
        healthy_revisions: {checkout-api: r42}
        history: {checkout-api: [[2026-03-02T10:00:00Z, 310], [2026-03-02T10:05:00Z, 1790]]}

A service's ``environment`` defaults to the incident's. Every name that points at a
service (a dependency, a failover target, a latency, a utilization, a history) must be
one of the case's services: a dangling name is an error, never an empty reading.
"""

from __future__ import annotations

import itertools
from typing import Any

from flotilla_evidence.model import Series, named_revisions
from flotilla_reasoning import DiagnosticEvidence, ServiceView, Topology

from flotilla_eval.reading import Problems, integer, items, keyed, mapping, moment, number, text

EVIDENCE_KEYS = ("service", "environment", "symptom", "topology")
TOPOLOGY_KEYS = ("observed_at", "source", "dependency_latency", "utilization", "healthy_revisions", "history")
SERVICE_KEYS = ("name", "replicas", "p95_ms", "threshold_ms")
SERVICE_OPTIONAL = (
    "environment",
    "dependencies",
    "revision",
    "previous_revision",
    "revision_changed_at",
    "failover_targets",
    "active_dependencies",
    "rollback_forbidden",
    "paused",
)
LATENCY_KEYS = ("service", "dependency", "p95_ms")


def incident_id(scenario_id: str) -> str:
    """The incident a case's decisions must name (a model has to copy it exactly)."""
    return f"incident-eval-{scenario_id}"


def read_evidence(value: Any, scenario_id: str, problems: Problems) -> DiagnosticEvidence | None:
    """The evidence section as the diagnostic agent would build it (None when a part of it is
    missing); its problems are added to ``problems``."""
    section = mapping(value, "evidence", problems, required=EVIDENCE_KEYS, optional=("diagnostic_job",))
    if section is None:
        return None
    service = text(section.get("service"), "evidence.service", problems)
    environment = text(section.get("environment"), "evidence.environment", problems)
    symptom = text(section.get("symptom"), "evidence.symptom", problems)
    job_kind = text(section.get("diagnostic_job"), "evidence.diagnostic_job", problems, nullable=True)
    topology = _topology(section.get("topology"), environment or "", problems)
    if topology is not None and service is not None and service not in topology.services:
        problems.add("evidence.service", f"{service!r} is not one of the topology's services")
    if None in (service, environment, symptom, topology):
        return None  # what is there is still checked by the caller; the problems say what is not
    assert service is not None and environment is not None and symptom is not None and topology is not None
    return DiagnosticEvidence(
        incident_id=incident_id(scenario_id),
        service=service,
        environment=environment,
        symptom=symptom,
        topology=topology,
        job_id=None if job_kind is None else f"job-eval-{scenario_id}",
        job_kind=job_kind,
        may_request_more=job_kind is None,
    )


def _topology(value: Any, environment: str, problems: Problems) -> Topology | None:
    path = "evidence.topology"
    section = mapping(value, path, problems, required=("services",), optional=TOPOLOGY_KEYS)
    if section is None:
        return None
    services: dict[str, ServiceView] = {}
    for i, entry in enumerate(items(section.get("services"), f"{path}.services", problems, allow_empty=False)):
        view = _service(entry, f"{path}.services[{i}]", environment, problems)
        if view is None:
            continue
        if view.name in services:
            problems.add(f"{path}.services[{i}].name", f"{view.name!r} is declared twice")
        services[view.name] = view
    _check_references(services, path, problems)
    names = set(services)
    observed_at = section.get("observed_at")
    latencies, baselines = _latencies(section.get("dependency_latency"), services, path, problems)
    return Topology(
        services=services,
        dependency_p95=latencies,
        baselines=baselines,
        utilization=_per_service(section.get("utilization"), f"{path}.utilization", names, problems, number),
        healthy_revisions=_per_service(
            section.get("healthy_revisions"), f"{path}.healthy_revisions", names, problems, text
        ),
        history=_per_service(section.get("history"), f"{path}.history", names, problems, _series),
        observed_at=None if observed_at is None else moment(observed_at, f"{path}.observed_at", problems),
        source=text(section.get("source", "fixture"), f"{path}.source", problems) or "fixture",
    )


def _service(value: Any, path: str, environment: str, problems: Problems) -> ServiceView | None:
    entry = mapping(value, path, problems, required=SERVICE_KEYS, optional=SERVICE_OPTIONAL)
    if entry is None:
        return None
    before = len(problems.found)
    name = text(entry.get("name"), f"{path}.name", problems)
    replicas = integer(entry.get("replicas"), f"{path}.replicas", problems, nullable=True)
    if replicas is not None and replicas < 0:
        problems.add(f"{path}.replicas", f"must not be negative, got {replicas}")
    p95 = number(entry.get("p95_ms"), f"{path}.p95_ms", problems)
    threshold = number(entry.get("threshold_ms"), f"{path}.threshold_ms", problems, positive=True)
    dependencies = [
        text(d, f"{path}.dependencies[{j}]", problems)
        for j, d in enumerate(items(entry.get("dependencies"), f"{path}.dependencies", problems))
    ]
    changed = entry.get("revision_changed_at")
    view_environment = text(entry.get("environment", environment), f"{path}.environment", problems)
    targets = _names(entry.get("failover_targets"), f"{path}.failover_targets", problems)
    active = _names(entry.get("active_dependencies"), f"{path}.active_dependencies", problems)
    revision = text(entry.get("revision"), f"{path}.revision", problems, nullable=True)
    previous = text(entry.get("previous_revision"), f"{path}.previous_revision", problems, nullable=True)
    forbidden = text(entry.get("rollback_forbidden"), f"{path}.rollback_forbidden", problems, nullable=True)
    paused = entry.get("paused")
    if paused is not None and not isinstance(paused, bool):
        problems.add(f"{path}.paused", f"must be true, false or null, got {paused!r}")
    if len(problems.found) > before:
        return None
    assert name is not None and p95 is not None and threshold is not None and view_environment is not None
    # A case's revisions are names, as the sim's telemetry gives them (its service_version),
    # and the facts a rollback is planned with are made from them the same way.
    running, candidate = named_revisions(revision, previous)
    return ServiceView(
        name=name,
        environment=view_environment,
        replicas=replicas,
        p95_ms=p95,
        threshold_ms=threshold,
        dependencies=tuple(d for d in dependencies if d is not None),
        revision=revision,
        previous_revision=previous,
        failover_targets=targets,
        active_dependencies=active,
        revision_changed_at=None if changed is None else moment(changed, f"{path}.revision_changed_at", problems),
        running=running,
        rollback_candidate=candidate,
        rollback_forbidden=forbidden,
        paused=paused,
    )


def _names(value: Any, path: str, problems: Problems) -> dict[str, str]:
    """A mapping of names to names (failover targets, active dependencies)."""
    pairs = {k: text(v, f"{path}.{k}", problems) for k, v in keyed(value, path, problems).items()}
    return {k: v for k, v in pairs.items() if v is not None}


def _check_references(services: dict[str, ServiceView], path: str, problems: Problems) -> None:
    known = ", ".join(sorted(services))
    for index, view in enumerate(services.values()):
        where = f"{path}.services[{index}] ({view.name})"
        for dependency in view.dependencies:
            if dependency not in services:
                problems.add(where, f"dependency {dependency!r} names no service of the case (services: {known})")
        for field_name, pairs in (
            ("failover_targets", view.failover_targets),
            ("active_dependencies", view.active_dependencies),
        ):
            for dependency, target in pairs.items():
                if dependency not in view.dependencies:
                    problems.add(f"{where}.{field_name}", f"{dependency!r} is not one of its dependencies")
                if target not in services:
                    problems.add(f"{where}.{field_name}.{dependency}", f"{target!r} names no service of the case")


def _latencies(
    value: Any, services: dict[str, ServiceView], path: str, problems: Problems
) -> tuple[dict[tuple[str, str], float], dict[tuple[str, str], float]]:
    """The p95 each caller sees per dependency, and the normal the agent learned for it."""
    latencies: dict[tuple[str, str], float] = {}
    baselines: dict[tuple[str, str], float] = {}
    for i, entry in enumerate(items(value, f"{path}.dependency_latency", problems)):
        where = f"{path}.dependency_latency[{i}]"
        row = mapping(entry, where, problems, required=LATENCY_KEYS, optional=("baseline_ms",))
        if row is None:
            continue
        caller = text(row.get("service"), f"{where}.service", problems)
        dependency = text(row.get("dependency"), f"{where}.dependency", problems)
        if caller is not None and caller not in services:
            problems.add(f"{where}.service", f"{caller!r} names no service of the case")
        elif caller is not None and dependency is not None and dependency not in services[caller].dependencies:
            problems.add(f"{where}.dependency", f"{dependency!r} is not a dependency of {caller}")
        p95 = number(row.get("p95_ms"), f"{where}.p95_ms", problems)
        baseline = row.get("baseline_ms")
        normal = None if baseline is None else number(baseline, f"{where}.baseline_ms", problems, positive=True)
        if caller is None or dependency is None:
            continue
        if p95 is not None:
            latencies[(caller, dependency)] = p95
        if normal is not None:
            baselines[(caller, dependency)] = normal
    return latencies, baselines


def _per_service(value: Any, path: str, names: set[str], problems: Problems, read: Any) -> dict[str, Any]:
    """A mapping keyed by service name, each value read by ``read``."""
    result: dict[str, Any] = {}
    for name, raw in keyed(value, path, problems).items():
        if name not in names:
            problems.add(f"{path}.{name}", "names no service of the case")
            continue
        reading = read(raw, f"{path}.{name}", problems)
        if reading is not None:
            result[name] = reading
    return result


def _series(value: Any, path: str, problems: Problems) -> Series | None:
    """``[[time, value], ...]``, oldest first."""
    points = []
    for i, point in enumerate(items(value, path, problems)):
        if not isinstance(point, list) or len(point) != 2:
            problems.add(f"{path}[{i}]", f"expected [time, value], got {point!r}")
            continue
        at, reading = moment(point[0], f"{path}[{i}][0]", problems), number(point[1], f"{path}[{i}][1]", problems)
        if at is not None and reading is not None:
            points.append((at, reading))
    if any(later[0] <= earlier[0] for earlier, later in itertools.pairwise(points)):
        problems.add(path, "points must be in time order, oldest first")
    return tuple(points)
