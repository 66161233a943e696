"""What is known around a service, as plain immutable values, whatever the source.

A :class:`Topology` is what every evidence source returns (Prometheus plus a catalogue
in production, the same for the sim locally) and what both reasoners read: services
with their environment, replicas, latency, threshold, dependencies and revision; the
latency each caller sees per dependency; utilization where the source knows it; and a
short history of latency, so a decision can tell before from after.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

# A short history of one value: (when, value), oldest first.
Series = tuple[tuple[datetime, float], ...]


# Bounds on revision facts read from a source any workload can write into (a template's
# images, an annotation's text): enough for a real pod, never a prompt's worth.
MAX_IMAGES = 16
MAX_FACT_CHARS = 300


def bounded(text: str) -> str:
    """``text`` cut to MAX_FACT_CHARS, control characters as spaces."""
    return "".join(" " if ord(c) < 32 or ord(c) == 127 else c for c in text[:MAX_FACT_CHARS])


@dataclass(frozen=True)
class RevisionFacts:
    """One revision of a service, as a target rolls back by it (issue 40's contract).

    ``revision`` is the target's own id: a ReplicaSet's revision number as text on
    Kubernetes (``deployment.kubernetes.io/revision``), the revision name in the sim (its
    ``service_version``). ``template_hash`` is the ReplicaSet's ``pod-template-hash``
    (None where there is none); ``images`` its containers' images in order, each
    ``"container=image"`` (empty where the source does not know them).
    """

    revision: str
    template_hash: str | None = None
    images: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "revision", bounded(self.revision))
        if self.template_hash is not None:
            object.__setattr__(self, "template_hash", bounded(self.template_hash))
        object.__setattr__(self, "images", tuple(bounded(i) for i in self.images[:MAX_IMAGES]))

    def to_json(self) -> dict[str, Any]:
        return {"revision": self.revision, "templateHash": self.template_hash, "images": list(self.images)}


def named_revisions(
    current: str | None, previous: str | None, images: Mapping[str, tuple[str, ...]] | None = None
) -> tuple[RevisionFacts | None, RevisionFacts | None]:
    """(running, rollback candidate) where a revision is known by its name, as a service
    reports it in telemetry (``service_version``, and its image where the resource says
    it): the sim rolls back by that name."""
    known = images or {}
    return (
        None if current is None else RevisionFacts(current, images=known.get(current, ())),
        None if current is None or previous is None else RevisionFacts(previous, images=known.get(previous, ())),
    )


@dataclass(frozen=True)
class ServiceView:
    """One service as the estate's telemetry (and catalogue) describe it.

    ``replicas`` is None where the source has no replica count (no kube-state-metrics for
    it): a plan that sizes a scale-out then refuses rather than guesses.
    ``revision_changed_at`` is when the current revision first appeared within the
    source's look-back (None: it is the only one seen there).

    ``revision`` and ``previous_revision`` describe (images and number, for a person and a
    prompt); ``running`` and ``rollback_candidate`` (the newest older revision) are the
    facts a rollback is planned with, None where the source cannot tell them.
    ``rollback_forbidden`` is why the running release may not be rolled back (the
    ``flotilla.dev/rollback-forbidden`` annotation, or the sim's mark); ``paused`` whether
    its rollout is paused (None: unknown).
    """

    name: str
    environment: str
    replicas: int | None
    p95_ms: float
    threshold_ms: float
    dependencies: tuple[str, ...] = ()
    revision: str | None = None
    previous_revision: str | None = None
    failover_targets: Mapping[str, str] = field(default_factory=dict)
    active_dependencies: Mapping[str, str] = field(default_factory=dict)
    revision_changed_at: datetime | None = None
    # Where the Kubernetes API is a source (flotilla_evidence.kubernetes): the replicas
    # ready for traffic, and the Deployment's recent events ("reason: message").
    available_replicas: int | None = None
    events: tuple[str, ...] = ()
    running: RevisionFacts | None = None
    rollback_candidate: RevisionFacts | None = None
    rollback_forbidden: str | None = None
    paused: bool | None = None

    def __post_init__(self) -> None:
        if self.rollback_forbidden is not None:
            object.__setattr__(self, "rollback_forbidden", bounded(self.rollback_forbidden))

    @property
    def key(self) -> str:
        return f"{self.environment}/{self.name}"

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
            "revisionChangedAt": None if self.revision_changed_at is None else self.revision_changed_at.isoformat(),
            "failoverTargets": dict(self.failover_targets),
            "activeDependencies": dict(self.active_dependencies),
            "availableReplicas": self.available_replicas,
            "recentEvents": list(self.events),
            "runningRevision": None if self.running is None else self.running.to_json(),
            "rollbackCandidate": None if self.rollback_candidate is None else self.rollback_candidate.to_json(),
            "rollbackForbidden": self.rollback_forbidden,
            "paused": self.paused,
        }


@dataclass(frozen=True)
class Topology:
    """A snapshot of the services, their dependencies and their latencies.

    ``dependency_p95`` is the p95 a caller observes on calls to one dependency, keyed
    ``(service, dependency)``; ``baselines`` the same p95 as the agent learned it while
    the caller was healthy (its "normal"); ``utilization`` a service's worker-slot demand
    over its slots (above 1 requests wait for the pool), where the source reports it;
    ``healthy_revisions`` the revision each service last ran while healthy, as the agent
    saw it; ``history`` each service's p95 over the source's look-back (range queries),
    oldest first; ``source`` names where it came from (a URL), for the evidence's sake.
    """

    services: Mapping[str, ServiceView]
    dependency_p95: Mapping[tuple[str, str], float] = field(default_factory=dict)
    utilization: Mapping[str, float] = field(default_factory=dict)
    baselines: Mapping[tuple[str, str], float] = field(default_factory=dict)
    healthy_revisions: Mapping[str, str] = field(default_factory=dict)  # last revision seen healthy
    history: Mapping[str, Series] = field(default_factory=dict)
    observed_at: datetime | None = None
    source: str = "estate"

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
            "p95HistoryMs": {
                name: [[at.isoformat(), value] for at, value in series] for name, series in sorted(self.history.items())
            },
        }
