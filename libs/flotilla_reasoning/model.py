"""What a reasoner reads and what it returns, as plain immutable values.

The agents turn these into Avro records; the reasoners never see a record or a topic.
A :class:`Reasoning` is the justification every decision carries (the contract's
``Reasoning`` record); a :class:`Diagnosis` and a :class:`Proposal` are decisions, not
facts: nothing here is authorized to act.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from flotilla import records


@dataclass(frozen=True)
class TokenUsage:
    """Model tokens one decision consumed, summed over retries (zeros for rules)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(self.prompt_tokens + other.prompt_tokens, self.completion_tokens + other.completion_tokens)

    def to_record(self) -> records.TokenUsage:
        return records.TokenUsage(prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens)


@dataclass(frozen=True)
class EvidenceItem:
    """One observation a decision rests on (the contract's ``Evidence`` record)."""

    kind: str
    source: str
    description: str
    observed_value: str | None = None

    def to_record(self) -> records.Evidence:
        return records.Evidence(
            kind=self.kind, source=self.source, description=self.description, observed_value=self.observed_value
        )

    @classmethod
    def from_record(cls, record: records.Evidence) -> EvidenceItem:
        return cls(record.kind, record.source, record.description, record.observed_value)


@dataclass(frozen=True)
class Reasoning:
    """Why a reasoner decided what it decided, and what it cost."""

    summary: str
    evidence: tuple[EvidenceItem, ...]
    confidence: float
    reasoner: str  # "rules" or "llm"
    model: str | None = None
    usage: TokenUsage = field(default_factory=TokenUsage)

    def to_record(self) -> records.Reasoning:
        return records.Reasoning(
            summary=self.summary,
            evidence=tuple(e.to_record() for e in self.evidence),
            confidence=float(self.confidence),
            reasoner=self.reasoner,
            model=self.model,
            token_usage=self.usage.to_record(),
        )

    @classmethod
    def from_record(cls, record: records.Reasoning) -> Reasoning:
        usage = record.token_usage
        return cls(
            summary=record.summary,
            evidence=tuple(EvidenceItem.from_record(e) for e in record.evidence),
            confidence=record.confidence,
            reasoner=record.reasoner,
            model=record.model,
            usage=TokenUsage(usage.prompt_tokens, usage.completion_tokens),
        )


# ----------------------------------------------------------------- the world


@dataclass(frozen=True)
class ServiceView:
    """One service of the (simulated) production as ``GET /services`` describes it."""

    name: str
    environment: str
    replicas: int
    p95_ms: float
    threshold_ms: float
    dependencies: tuple[str, ...] = ()
    revision: str | None = None
    previous_revision: str | None = None
    failover_targets: Mapping[str, str] = field(default_factory=dict)
    active_dependencies: Mapping[str, str] = field(default_factory=dict)

    @property
    def degraded(self) -> bool:
        return self.p95_ms > self.threshold_ms

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "environment": self.environment,
            "replicas": self.replicas,
            "p95Ms": self.p95_ms,
            "thresholdMs": self.threshold_ms,
            "dependencies": list(self.dependencies),
            "revision": self.revision,
            "previousRevision": self.previous_revision,
            "failoverTargets": dict(self.failover_targets),
            "activeDependencies": dict(self.active_dependencies),
        }


@dataclass(frozen=True)
class Topology:
    """A snapshot of the services, their dependencies and their latencies.

    ``dependency_p95`` is the p95 a caller observes on calls to one dependency, keyed
    ``(service, dependency)`` (``sim_dependency_latency_p95_ms``); ``baselines`` the same
    p95 as the agent learned it while the caller was healthy (its "normal");
    ``utilization`` a service's worker-slot demand over its slots (above 1 requests wait
    for the pool), where the source reports it; ``healthy_revisions`` the revision each
    service last ran while healthy, as the agent saw it.
    """

    services: Mapping[str, ServiceView]
    dependency_p95: Mapping[tuple[str, str], float] = field(default_factory=dict)
    utilization: Mapping[str, float] = field(default_factory=dict)
    baselines: Mapping[tuple[str, str], float] = field(default_factory=dict)
    healthy_revisions: Mapping[str, str] = field(default_factory=dict)  # last revision seen healthy
    observed_at: datetime | None = None
    source: str = "sim"

    def observed_dependency_p95(self, service: str, dependency: str) -> float | None:
        """What ``service`` sees when it calls ``dependency``; else the dependency's own p95."""
        seen = self.dependency_p95.get((service, dependency))
        if seen is not None:
            return seen
        own = self.services.get(dependency)
        return own.p95_ms if own is not None else None

    def to_json(self) -> dict[str, Any]:
        return {
            "services": [s.to_json() for s in self.services.values()],
            "dependencyLatencyP95Ms": [
                {"service": s, "dependency": d, "p95Ms": v, "baselineP95Ms": self.baselines.get((s, d))}
                for (s, d), v in sorted(self.dependency_p95.items())
            ],
            "poolUtilization": dict(sorted(self.utilization.items())),
            "lastHealthyRevisions": dict(sorted(self.healthy_revisions.items())),
        }


# ------------------------------------------------------------- what goes in


@dataclass(frozen=True)
class DiagnosticEvidence:
    """What the diagnostic agent knows when it asks for a diagnosis."""

    incident_id: str
    service: str
    environment: str
    symptom: str
    topology: Topology
    job_id: str | None = None  # the slow job whose result this is, if any
    job_kind: str | None = None
    # False once a slow job already ran: the reasoner must decide with what it has.
    may_request_more: bool = True


# ----------------------------------------------------------- what comes out


class Verdict(enum.StrEnum):
    DEPENDENCY_FAILURE = "dependency-failure"  # -> DependencyFailureSuspected
    CONCLUDED = "concluded"  # -> DiagnosisConcluded
    NEEDS_EVIDENCE = "needs-evidence"  # -> DiagnosticJobStarted, decide later


CAUSE_CATEGORIES = ("capacity", "bad-deployment", "configuration", "external", "unknown")


@dataclass(frozen=True)
class Diagnosis:
    """A diagnosis: a suspected dependency, another conclusion, or a request for more evidence."""

    verdict: Verdict
    incident_id: str
    service: str
    reasoning: Reasoning
    suspected_dependency: str | None = None
    failure_mode: str | None = None
    cause_category: str | None = None
    job_kind: str | None = None  # NEEDS_EVIDENCE: which slow job to run
    event_id: str | None = None  # the record's eventId, once it is one


class Action(enum.StrEnum):
    """What a command does; the names are the sim's and the executor's action names."""

    SCALE = "scale"
    RESTART = "restart"
    ROLLBACK = "rollback"
    FAILOVER = "failover"


@dataclass(frozen=True)
class PlannedStep:
    """One step of a plan: an action on a service with its parameters.

    ``params`` holds exactly the command's own fields: ``replicas`` (scale), ``rolling``
    (restart), ``toRevision`` (rollback), ``dependency`` and ``toTarget`` (failover).
    """

    action: Action
    service: str
    environment: str
    params: Mapping[str, Any]


@dataclass(frozen=True)
class Proposal:
    """A recovery plan: steps run in order as a saga, with why."""

    incident_id: str
    diagnosis_event_id: str
    steps: tuple[PlannedStep, ...]
    reasoning: Reasoning
