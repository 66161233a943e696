"""The evidence seam: what both agents ask of the estate, and its one failure.

Modelled on the policy service's ``Inventory`` protocol: one small interface, a real
implementation (:class:`~flotilla_evidence.prometheus.PrometheusEvidence`: Prometheus plus
an optional catalogue) and a static one for tests. The agents never know which.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Protocol

from flotilla_evidence.model import ServiceView, Topology


class EvidenceUnavailable(Exception):
    """The source could not say what is known now (down, refusing, answering garbage or
    only part of the answer). Transient by assumption: the agents wait and ask again
    (a diagnostic job, a deferred retry) until their deadline, never guess."""


class EvidenceSource(Protocol):
    """What is known around a service now, as a source-neutral :class:`Topology`."""

    name: str  # where the evidence comes from, for logs and the evidence items

    def snapshot(self, around: str | None = None, *, environment: str | None = None) -> Topology:
        """The whole estate, or with ``around`` the neighbourhood of that service in
        ``environment``: itself, its dependencies and the targets it fails them over to,
        everything a diagnosis or a plan for it reads or names. Raises
        :class:`EvidenceUnavailable` when that cannot be known now (including when the
        service itself has no latency reading)."""
        ...


def neighbourhood(service: ServiceView) -> set[str]:
    """The services a diagnosis or a plan for ``service`` may read or name."""
    return {
        service.name,
        *service.dependencies,
        *service.failover_targets.values(),
        *service.active_dependencies.values(),
    }


class StaticEvidence:
    """A fixed topology (tests, or an estate without telemetry): the neighbourhood of
    ``around`` from it, or all of it. ``unavailable`` set: every snapshot raises it."""

    name = "static"

    def __init__(self, topology: Topology, *, unavailable: str | None = None) -> None:
        self.topology = topology
        self.unavailable = unavailable

    def snapshot(self, around: str | None = None, *, environment: str | None = None) -> Topology:
        if self.unavailable is not None:
            raise EvidenceUnavailable(self.unavailable)
        services: Mapping[str, ServiceView] = self.topology.services
        if around is not None:
            centre = services.get(around)
            if centre is None or (environment is not None and centre.environment != environment):
                raise EvidenceUnavailable(f"the static evidence has no {environment or '*'}/{around}")
            wanted = neighbourhood(centre)
            services = {n: s for n, s in services.items() if n in wanted}
        return replace(self.topology, services=dict(services), observed_at=datetime.now(UTC), source=self.name)
