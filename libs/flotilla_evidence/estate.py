"""The estate as Prometheus (and a catalogue) show it: :class:`PrometheusEvidence`.

One instance serves both uses: the agents' :meth:`~PrometheusEvidence.snapshot` (a
neighbourhood, or the whole estate for baselines) and the health agent's
:meth:`~PrometheusEvidence.latency_readings` (every watched service's p95 against its
threshold, each tick).

The dependency graph comes from telemetry (the service-graph edges with traffic), from
the catalogue, or both merged (``FLOTILLA_ESTATE_GRAPH``). Merging: a declared dependency
is kept even while it has no traffic; an observed edge the catalogue does not declare is
added; traffic to a declared standby (``failover_to``) and none to its primary means the
caller has failed over — the dependency stays the primary, its *active* target is the
standby. A catalogue's threshold, Deployment and namespace win over telemetry's.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, TypeVar

from flotilla_evidence.base import EvidenceUnavailable
from flotilla_evidence.catalogue import Catalogue
from flotilla_evidence.coalesce import Coalescer
from flotilla_evidence.model import Series, ServiceView, Topology
from flotilla_evidence.prometheus import PrometheusClient, RangeSeries, Reading
from flotilla_evidence.queries import DEFAULTS, Labels, Queries

log = logging.getLogger(__name__)

Graph = Literal["telemetry", "catalogue", "both"]
Key = tuple[str, str]  # (environment, service)


@dataclass(frozen=True)
class LatencyReading:
    """One watched service's p95 now, against its threshold (the health agent's sample)."""

    service: str
    environment: str
    p95_ms: float
    threshold_ms: float


@dataclass(frozen=True)
class _Versions:
    current: str
    previous: str | None
    changed_at: datetime | None


# Threads for the readings of concurrent snapshots: nine readings each, a few snapshots at
# once (merged requests keep Prometheus' load from growing with them).
SNAPSHOT_THREADS = 4 * (len(DEFAULTS) + 1)

R = TypeVar("R", Reading, RangeSeries)


def _within(answer: list[R], label: str, names: frozenset[str]) -> list[R]:
    """The part of a (possibly merged) answer a reader asked for: series of its own names."""
    return [r for r in answer if r.labels.get(label) in names]


class PrometheusEvidence:
    """:class:`~flotilla_evidence.base.EvidenceSource` over Prometheus' query API."""

    def __init__(
        self,
        client: PrometheusClient,
        *,
        queries: Queries | None = None,
        labels: Labels | None = None,
        catalogue: Catalogue | None = None,
        graph: Graph = "both",
        default_environment: str = "production",
        namespaces: Mapping[str, str] | None = None,
        lookback: timedelta = timedelta(minutes=15),
        step: timedelta = timedelta(seconds=30),
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.client = client
        self.queries = queries or Queries()
        self.labels = labels or Labels()
        self.catalogue = catalogue or Catalogue()
        self.graph = graph
        self.default_environment = default_environment
        self.namespaces = dict(namespaces or {})
        self.lookback = lookback
        self.step = step
        self._clock = clock
        self.name = client.base_url
        # A snapshot's readings at once (one per query it asks), for several snapshots at
        # once (an agent's worker threads); threads are made as needed and idle otherwise.
        self._threads = ThreadPoolExecutor(max_workers=SNAPSHOT_THREADS, thread_name_prefix="evidence")
        # Concurrent snapshots' reads of one query merged into one request (coalesce.py).
        self._readings: Coalescer[Reading] = Coalescer()
        self._series: Coalescer[RangeSeries] = Coalescer()

    # ------------------------------------------------------------- readings

    def _query(
        self, name: str, *, services: Iterable[str] | None = None, deployments: Iterable[str] | None = None
    ) -> list[Reading]:
        if not getattr(self.queries, name):
            return []
        field = self.queries.scoped_label(name)
        names = services if deployments is None else deployments
        if field is None or names is None or not (wanted := frozenset(names)):
            return self.client.query(self.queries.render(name, services=services, deployments=deployments))
        scope = "services" if deployments is None else "deployments"
        answer = self._readings.read(
            name, wanted, lambda union: self.client.query(self.queries.render(name, **{scope: union}))
        )
        return _within(answer, getattr(self.labels, field), wanted)

    def _query_range(self, name: str, services: Iterable[str] | None, now: datetime) -> list[RangeSeries]:
        """A range query over the look-back; merged like :meth:`_query` (a merged request
        spans the look-back up to the ``now`` of the read that opened it, at most one
        request's time earlier than this one's)."""

        def ask(scope: Iterable[str] | None) -> list[RangeSeries]:
            promql = self.queries.render(name, services=scope)
            return self.client.query_range(promql, start=now - self.lookback, end=now, step=self.step)

        field = self.queries.scoped_label(name)
        if field is None or services is None or not (wanted := frozenset(services)):
            return ask(services)
        return _within(self._series.read(name, wanted, ask), getattr(self.labels, field), wanted)

    def _environment_of(self, labels: Mapping[str, str]) -> str:
        return labels.get(self.labels.environment) or self.default_environment

    def _per_service(self, readings: list[Reading]) -> dict[Key, float]:
        found: dict[Key, float] = {}
        for r in readings:
            service = r.labels.get(self.labels.service)
            if service:
                found[(self._environment_of(r.labels), service)] = r.value
        return found

    def _thresholds(self, services: Iterable[str] | None) -> dict[Key, float]:
        """From the threshold query, then the catalogue's over it."""
        found = self._per_service(self._query("threshold", services=services))
        for key, declared in self.catalogue.services.items():
            if declared.latency_threshold_ms is not None and (services is None or key[1] in set(services)):
                found[key] = declared.latency_threshold_ms
        return found

    def latency_readings(self) -> list[LatencyReading]:
        """Every service with both a p95 and a threshold now: what the health agent
        watches. Raises :class:`~flotilla_evidence.prometheus.PrometheusUnavailable`."""
        p95 = self._per_service(self._query("service_p95"))
        thresholds = self._thresholds(None)
        return [
            LatencyReading(service, environment, p95[(environment, service)], thresholds[(environment, service)])
            for environment, service in sorted(p95.keys() & thresholds.keys())
        ]

    # ------------------------------------------------------------- topology

    def _edges(self, clients: Iterable[str] | None) -> dict[tuple[str, str], float]:
        if self.graph == "catalogue":
            return {}
        found = {}
        for r in self._query("edges", services=clients):
            client, server = r.labels.get(self.labels.client), r.labels.get(self.labels.server)
            if client and server and r.value > 0:
                found[(client, server)] = r.value
        return found

    def _declared_dependencies(self, environment: str, name: str) -> tuple[str, ...]:
        declared = self.catalogue.get(environment, name)
        return declared.depends_on if declared is not None and self.graph != "telemetry" else ()

    def _standby(self, environment: str, name: str) -> str | None:
        declared = self.catalogue.get(environment, name)
        return declared.failover_to if declared is not None else None

    def _wiring(
        self, environment: str, name: str, edges: Mapping[tuple[str, str], float]
    ) -> tuple[tuple[str, ...], dict[str, str], dict[str, str]]:
        """(dependencies, failover targets, active targets) of one service."""
        declared = self._declared_dependencies(environment, name)
        observed = {server for client, server in edges if client == name}
        failover = {d: s for d in declared if (s := self._standby(environment, d)) is not None}
        standbys = set(failover.values())
        dependencies = (*declared, *sorted(observed - set(declared) - standbys - {name}))
        active = {
            d: failover[d] if d in failover and failover[d] in observed and d not in observed else d
            for d in dependencies
        }
        return dependencies, failover, active

    def _names_around(self, around: str, environment: str) -> set[str]:
        """The service, what it calls or is declared to call, and their standbys."""
        edges = self._edges([around])
        dependencies, failover, active = self._wiring(environment, around, edges)
        return {around, *dependencies, *failover.values(), *active.values()}

    def _peer(self, address: str, known: set[str]) -> str:
        """A client histogram's ``server_address`` as a service name: the name itself, or
        its host without port and domain (payments-api.shop.svc.cluster.local:8080)."""
        host = address.rsplit(":", 1)[0] if address.count(":") == 1 else address
        if host in known:
            return host
        return host.split(".", 1)[0]

    def _versions(self, services: Iterable[str] | None, now: datetime) -> dict[Key, _Versions]:
        if not self.queries.versions:
            return {}
        series = self._query_range("versions", services, now)
        seen: dict[Key, list[tuple[datetime, datetime, str]]] = defaultdict(list)
        for s in series:
            service, version = s.labels.get(self.labels.service), s.labels.get(self.labels.version)
            if service and version and s.points:
                seen[(self._environment_of(s.labels), service)].append((s.points[0][0], s.points[-1][0], version))
        found = {}
        for key, spans in seen.items():
            spans.sort(key=lambda span: (span[1], span[0]))  # by last seen, then first seen
            current = spans[-1]
            before = [span for span in spans[:-1] if span[2] != current[2]]
            previous = before[-1][2] if before else None
            found[key] = _Versions(current[2], previous, current[0] if before else None)
        return found

    def _history(self, services: Iterable[str], environment: str, now: datetime) -> dict[str, Series]:
        series = self._query_range("service_p95", services, now)
        return {
            s.labels[self.labels.service]: s.points
            for s in series
            if s.labels.get(self.labels.service) and self._environment_of(s.labels) == environment
        }

    def snapshot(self, around: str | None = None, *, environment: str | None = None) -> Topology:
        now = self._clock()
        if around is not None and environment is None:
            environment = self._environment_running(around)
        names = None if around is None or environment is None else self._names_around(around, environment)
        # Once the names are known every reading is independent of the others: asked at
        # once, a neighbourhood costs its slowest query rather than the sum of ten (an
        # incident reads two neighbourhoods on its way to a recovery). Replicas and history
        # are asked for every name, a superset of the services they are kept for below.
        keys = None if names is None or environment is None else {(environment, n) for n in names}
        found = self._together(
            p95=lambda: self._per_service(self._query("service_p95", services=names)),
            thresholds=lambda: self._thresholds(names),
            edges=lambda: self._edges(names),
            utilization=lambda: self._per_service(self._query("utilization", services=names)),
            versions=lambda: self._versions(names, now),
            edge_p95=lambda: self._query("edge_p95", services=names),
            dependency_p95=lambda: self._query("dependency_p95", services=names),
            replicas=lambda: {} if keys is None else self._replicas(keys),
            history=lambda: {} if names is None or environment is None else self._history(names, environment, now),
        )
        p95: dict[Key, float] = found["p95"]
        thresholds: dict[Key, float] = found["thresholds"]
        edges: dict[tuple[str, str], float] = found["edges"]
        versions: dict[Key, _Versions] = found["versions"]
        in_scope = {k for k in p95 if environment is None or k[0] == environment}
        if around is not None and (environment, around) not in in_scope:
            raise EvidenceUnavailable(
                f"{self.name} has no p95 for {environment}/{around} now (no requests in the last "
                f"{self.queries.window}, or its metrics are not scraped)"
            )
        known = {name for _, name in in_scope} | {s for _, s in edges}
        replicas: dict[Key, int] = found["replicas"] if keys is not None else self._replicas(in_scope)
        utilization = {k[1]: v for k, v in found["utilization"].items() if k in in_scope}

        services: dict[str, ServiceView] = {}
        dependency_p95: dict[tuple[str, str], float] = {}
        edge_p95 = {
            (r.labels.get(self.labels.client, ""), r.labels.get(self.labels.server, "")): r.value
            for r in found["edge_p95"]
        }
        client_p95 = {
            (
                r.labels.get(self.labels.service, ""),
                self._peer(r.labels.get(self.labels.dependency, ""), known),
            ): r.value
            for r in found["dependency_p95"]
        }
        for key in sorted(in_scope):
            env, name = key
            if key not in thresholds:
                log.debug("%s/%s has no latency threshold (catalogue or threshold query): left out", env, name)
                continue
            dependencies, failover, active = self._wiring(env, name, edges)
            for dependency in dependencies:
                target = active[dependency]
                seen = client_p95.get((name, target), edge_p95.get((name, target)))
                if seen is not None:
                    dependency_p95[(name, dependency)] = seen
            version = versions.get(key)
            if name in services:
                log.debug("%s is in several environments; the whole-estate snapshot keeps %s", name, env)
            services[name] = ServiceView(
                name=name,
                environment=env,
                replicas=replicas.get(key),
                p95_ms=p95[key],
                threshold_ms=thresholds[key],
                dependencies=dependencies,
                revision=None if version is None else version.current,
                previous_revision=None if version is None else version.previous,
                failover_targets=failover,
                active_dependencies=active,
                revision_changed_at=None if version is None else version.changed_at,
            )
        history: dict[str, Series] = {}
        if around is not None and around in services:
            kept = {around, *services[around].active_dependencies.values()}
            history = {name: points for name, points in found["history"].items() if name in kept}
        return Topology(
            services=services,
            dependency_p95=dependency_p95,
            utilization=utilization,
            history=history,
            observed_at=now,
            source=self.name,
        )

    def _together(self, **readings: Callable[[], Any]) -> dict[str, Any]:
        """Each reading, asked at once on this source's threads; the first failure raises
        (PrometheusUnavailable: no decision on part of an answer) once all have ended."""
        futures = {name: self._threads.submit(read) for name, read in readings.items()}
        wait(futures.values())
        return {name: future.result() for name, future in futures.items()}

    def _environment_running(self, name: str) -> str:
        """Where ``name`` runs, for a caller that did not say: the only environment its p95
        is reported in, else the default one (a record older than its environment field)."""
        environments = sorted({k[0] for k in self._per_service(self._query("service_p95", services=[name]))})
        if len(environments) == 1 or self.default_environment not in environments:
            return environments[0] if environments else self.default_environment
        return self.default_environment

    def _deployment(self, key: Key) -> tuple[str, str]:
        """(namespace, Deployment) that runs a service: the catalogue's, else the service's
        name in its environment's namespace (``FLOTILLA_KUBERNETES_NAMESPACES``, else the
        environment's name)."""
        environment, name = key
        declared = self.catalogue.get(environment, name)
        namespace = (declared.namespace if declared else None) or self.namespaces.get(environment, environment)
        return namespace, declared.deployment if declared else name

    def deployment_of(self, environment: str, name: str) -> tuple[str, str]:
        """(namespace, Deployment) that runs a service (the catalogue's, else by name)."""
        return self._deployment((environment, name))

    def _replicas(self, services: Iterable[Key]) -> dict[Key, int]:
        """Replicas of each service's Deployment, where Prometheus has a count."""
        deployments = {self._deployment(k): k for k in services}  # (namespace, Deployment) -> service
        if not deployments:  # no service in scope (no p95 yet): nothing to ask, not a query about none
            return {}
        found = {}
        for r in self._query("replicas", deployments=sorted({d for _, d in deployments})):
            where = (r.labels.get(self.labels.namespace, ""), r.labels.get(self.labels.deployment, ""))
            if where in deployments:
                found[deployments[where]] = int(r.value)
        return found

    def replicas(self, environment: str, name: str) -> int | None:
        """Replicas of one service's Deployment now, or None when Prometheus has no count."""
        return self._replicas([(environment, name)]).get((environment, name))
