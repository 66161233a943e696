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

Names come from telemetry, which any workload can write into (security review 3, H2): a
service, environment, dependency or revision label value that is not a name a record can
carry (over 253 characters, or with control characters: :func:`flotilla.bounds.name_problem`)
is left out of the reading, logged once and counted in
``flotilla_evidence_names_left_out_total{label}``; it never reaches a record.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, TypeVar

from prometheus_client import Counter

from flotilla.bounds import name_problem, shown
from flotilla_evidence.base import EvidenceUnavailable
from flotilla_evidence.catalogue import Catalogue
from flotilla_evidence.coalesce import Coalescer
from flotilla_evidence.model import Series, ServiceView, Topology, named_revisions
from flotilla_evidence.prometheus import PrometheusClient, RangeSeries, Reading
from flotilla_evidence.queries import Labels, Queries, askable_scope

log = logging.getLogger(__name__)

NAMES_LEFT_OUT = Counter(
    "flotilla_evidence_names_left_out_total",
    "Label values read from telemetry (service, environment, dependency, revision) left out "
    "because no record may carry them as a name (over 253 characters, or control characters).",
    ["label"],
)
# How many distinct refused names are logged (each once); more are only counted.
_WARNED_MAX = 1000

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
    images: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # version -> "container=image"


def _image_of(labels: Mapping[str, str], service: str) -> str | None:
    """``container=image:tag`` from OpenTelemetry's container resource attributes on
    ``target_info`` (``container_image_name``, ``container_image_tags``; the container is
    ``k8s_container_name``, else the service); None where the series has no image. A
    list of tags, as an exporter renders an array attribute, gives its first."""
    name = labels.get("container_image_name")
    if not name:
        return None
    tags = labels.get("container_image_tags", "").strip("[]").replace('"', "").split(",")[0].strip()
    container = labels.get("k8s_container_name") or service
    return f"{container}={name}:{tags}" if tags else f"{container}={name}"


# Threads for the readings of concurrent snapshots: two requests each (its instant and its
# range readings) for an agent's worker threads, and an estate's own queries beside them.
SNAPSHOT_THREADS = 16

R = TypeVar("R", Reading, RangeSeries)
# What one read asks: the placeholder its names fill ("services" or "deployments") and the
# names (None: the whole estate).
Scope = tuple[str, frozenset[str] | None]
# The label a bundled request tags each query's series with (never one of an estate's).
BUNDLE_LABEL = "flotilla_reading"


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
        # Concurrent snapshots' reads of one query merged into one request (coalesce.py);
        # a name no request can carry is left out of it (queries.askable_scope).
        self._readings: Coalescer[tuple[str, str], Reading] = Coalescer(askable_scope)
        self._series: Coalescer[tuple[str, str], RangeSeries] = Coalescer(askable_scope)
        self._warned: set[tuple[str, str]] = set()

    # ------------------------------------------------------------- readings

    def _query(
        self, name: str, *, services: Iterable[str] | None = None, deployments: Iterable[str] | None = None
    ) -> list[Reading]:
        """One instant reading (merged with concurrent snapshots' reads of it)."""
        if not getattr(self.queries, name):
            return []
        placeholder, names = ("services", services) if deployments is None else ("deployments", deployments)
        scope = None if names is None else frozenset(names)
        return self._readings_of({name: (placeholder, scope)})[name]

    def _readings_of(self, reads: Mapping[str, Scope]) -> dict[str, list[Reading]]:
        """Instant readings, each query for its scope, in as few requests as they can go."""
        return self._asked(reads, self._readings, self.client.query)

    def _series_of(self, reads: Mapping[str, Scope], now: datetime) -> dict[str, list[RangeSeries]]:
        """Range readings over the look-back up to ``now`` (a merged request spans the one
        of the read that opened it: at most one request's time earlier than this one's)."""

        def ask(promql: str) -> list[RangeSeries]:
            return self.client.query_range(promql, start=now - self.lookback, end=now, step=self.step)

        return self._asked(reads, self._series, ask)

    def _asked(
        self, reads: Mapping[str, Scope], coalescer: Coalescer[tuple[str, str], R], ask: Callable[[str], list[R]]
    ) -> dict[str, list[R]]:
        """The default queries among ``reads`` as one request (each tagged with its name in
        ``BUNDLE_LABEL``, joined with ``or``), merged with concurrent snapshots' identical
        requests and cut back to each scope; an estate's own queries asked alone. Per
        request Prometheus spends more than it does evaluating a neighbourhood's query
        (≈1.5 ms against ≈0.2 ms): a storm's incidents asked it 18 requests each before."""
        found: dict[str, list[R]] = {name: [] for name in reads}
        bundled: dict[str, Scope] = {}
        for name, (placeholder, names) in reads.items():
            if not getattr(self.queries, name) or (names is not None and not names):
                continue
            if self.queries.scoped_label(name) is None:
                found[name] = ask(self.queries.render(name, **{placeholder: names}))
            else:
                bundled[name] = (placeholder, names)
        if not bundled:
            return found

        def bundle(scopes: Mapping[str, Iterable[str] | None]) -> list[R]:
            parts = [
                f'label_replace({self.queries.render(name, **{placeholder: scopes[name]})}, "{BUNDLE_LABEL}", '
                f'"{name}", "", "")'
                for name, (placeholder, _) in sorted(bundled.items())
            ]
            return ask(" or ".join(parts))

        if any(names is None for _, names in bundled.values()):  # the whole estate: nothing to merge or cut
            answer = bundle({name: names for name, (_, names) in bundled.items()})
        else:
            wanted = frozenset((p, n) for p, names in bundled.values() for n in names or ())
            answer = coalescer.read(
                tuple(sorted(bundled)),
                wanted,
                lambda union: bundle({name: {n for q, n in union if q == p} for name, (p, _) in bundled.items()}),
            )
        # the result label each bundled query is scoped by, once per request, not per series
        fields = {name: getattr(self.labels, self.queries.scoped_label(name) or "") for name in bundled}
        for r in answer:
            name = r.labels.get(BUNDLE_LABEL, "")
            if name not in bundled:
                continue
            names = bundled[name][1]
            if names is None or r.labels.get(fields[name]) in names:
                found[name].append(replace(r, labels={k: v for k, v in r.labels.items() if k != BUNDLE_LABEL}))
        return found

    def _name(self, labels: Mapping[str, str], label: str) -> str | None:
        """``labels[label]`` when it is a name a record may carry; None when absent or
        empty, and when it is not (left out: logged once, counted)."""
        value = labels.get(label)
        if not value:
            return None
        why = name_problem(value)
        if why is None:
            return value
        NAMES_LEFT_OUT.labels(label).inc()
        if (label, value) not in self._warned and len(self._warned) < _WARNED_MAX:
            self._warned.add((label, value))
            log.warning("%s: %s %s left out of the reading: it %s", self.name, label, shown(value), why)
        return None

    def _environment_of(self, labels: Mapping[str, str]) -> str | None:
        """The series' environment (the default one without the label); None: its label
        is not a name (the series is left out)."""
        if not labels.get(self.labels.environment):
            return self.default_environment
        return self._name(labels, self.labels.environment)

    def _key_of(self, labels: Mapping[str, str]) -> Key | None:
        """(environment, service) a series is about; None without a service, or when
        either is not a name a record may carry."""
        service = self._name(labels, self.labels.service)
        environment = None if service is None else self._environment_of(labels)
        return None if service is None or environment is None else (environment, service)

    def _per_service(self, readings: list[Reading]) -> dict[Key, float]:
        found: dict[Key, float] = {}
        for r in readings:
            key = self._key_of(r.labels)
            if key is not None:
                found[key] = r.value
        return found

    def _thresholds(self, services: Iterable[str] | None) -> dict[Key, float]:
        return self._thresholds_from(self._query("threshold", services=services), services)

    def _thresholds_from(self, readings: list[Reading], services: Iterable[str] | None) -> dict[Key, float]:
        """From the threshold query, then the catalogue's over it."""
        found = self._per_service(readings)
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
        return {} if self.graph == "catalogue" else self._edges_from(self._query("edges", services=clients))

    def _edges_from(self, readings: list[Reading]) -> dict[tuple[str, str], float]:
        found = {}
        for r in readings:
            client, server = self._name(r.labels, self.labels.client), self._name(r.labels, self.labels.server)
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

    def _versions_from(self, series: list[RangeSeries]) -> dict[Key, _Versions]:
        seen: dict[Key, list[tuple[datetime, datetime, str]]] = defaultdict(list)
        images: dict[Key, dict[str, tuple[str, ...]]] = defaultdict(dict)
        for s in series:
            key, version = self._key_of(s.labels), self._name(s.labels, self.labels.version)
            if key and version and s.points:
                seen[key].append((s.points[0][0], s.points[-1][0], version))
                image = _image_of(s.labels, key[1])
                if image is not None:
                    images[key][version] = (image,)
        found = {}
        for key, spans in seen.items():
            spans.sort(key=lambda span: (span[1], span[0]))  # by last seen, then first seen
            current = spans[-1]
            before = [span for span in spans[:-1] if span[2] != current[2]]
            previous = before[-1][2] if before else None
            found[key] = _Versions(current[2], previous, current[0] if before else None, images.get(key, {}))
        return found

    def _history_from(self, series: list[RangeSeries], environment: str) -> dict[str, Series]:
        return {key[1]: s.points for s in series if (key := self._key_of(s.labels)) and key[0] == environment}

    def snapshot(self, around: str | None = None, *, environment: str | None = None) -> Topology:
        now = self._clock()
        if around is not None and environment is None:
            environment = self._environment_running(around)
        names = None if around is None or environment is None else self._names_around(around, environment)
        # Once the names are known every reading is independent of the others: the instant
        # ones go as one request and the range ones as another, at once (an incident reads
        # two neighbourhoods on its way to a recovery). Replicas and history are asked for
        # every name, a superset of the services they are kept for below.
        keys = None if names is None or environment is None else {(environment, n) for n in names}
        scope = None if names is None else frozenset(names)
        instant: dict[str, Scope] = {
            q: ("services", scope) for q in ("service_p95", "threshold", "utilization", "edge_p95", "dependency_p95")
        }
        if self.graph != "catalogue":
            instant["edges"] = ("services", scope)
        deployments = {} if keys is None else {self._deployment(k): k for k in keys}
        if deployments:
            for query in ("replicas", "paused", "rollback_forbidden"):
                instant[query] = ("deployments", frozenset(d for _, d in deployments))
        ranges: dict[str, Scope] = {"versions": ("services", scope)}
        if scope is not None and environment is not None:
            ranges["service_p95"] = ("services", scope)  # the history of each name
        found = self._together(instant=lambda: self._readings_of(instant), ranges=lambda: self._series_of(ranges, now))
        read: dict[str, list[Reading]] = found["instant"]
        series: dict[str, list[RangeSeries]] = found["ranges"]
        p95 = self._per_service(read["service_p95"])
        thresholds = self._thresholds_from(read["threshold"], names)
        edges = self._edges_from(read.get("edges", []))
        versions = self._versions_from(series["versions"])
        in_scope = {k for k in p95 if environment is None or k[0] == environment}
        if around is not None and (environment, around) not in in_scope:
            raise EvidenceUnavailable(
                f"{self.name} has no p95 for {environment}/{around} now (no requests in the last "
                f"{self.queries.window}, or its metrics are not scraped)"
            )
        known = {name for _, name in in_scope} | {s for _, s in edges}
        replicas = self._replicas_from(read.get("replicas", []), deployments) if keys else self._replicas(in_scope)
        utilization = {k[1]: v for k, v in self._per_service(read["utilization"]).items() if k in in_scope}
        paused = {k: v > 0 for k, v in self._per_deployment(read.get("paused", []), deployments).items()}
        forbidden = self._forbidden_from(read.get("rollback_forbidden", []), deployments)

        services: dict[str, ServiceView] = {}
        dependency_p95: dict[tuple[str, str], float] = {}
        edge_p95 = {
            (r.labels.get(self.labels.client, ""), r.labels.get(self.labels.server, "")): r.value
            for r in read["edge_p95"]
        }
        client_p95 = {
            (
                r.labels.get(self.labels.service, ""),
                self._peer(r.labels.get(self.labels.dependency, ""), known),
            ): r.value
            for r in read["dependency_p95"]
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
            running, candidate = (
                named_revisions(None, None)
                if version is None
                else named_revisions(version.current, version.previous, version.images)
            )
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
                # The sim's rollback names revisions by the version it reports; on Kubernetes
                # flotilla_evidence.kubernetes replaces these with the ReplicaSets' facts.
                running=running,
                rollback_candidate=candidate,
                rollback_forbidden=forbidden.get(key),
                paused=paused.get(key) if keys else None,
            )
        history: dict[str, Series] = {}
        if around is not None and around in services:
            kept = {around, *services[around].active_dependencies.values()}
            assert environment is not None
            history = {
                name: points
                for name, points in self._history_from(series.get("service_p95", []), environment).items()
                if name in kept
            }
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
        return self._replicas_from(self._query("replicas", deployments={d for _, d in deployments}), deployments)

    def _replicas_from(self, readings: list[Reading], deployments: Mapping[tuple[str, str], Key]) -> dict[Key, int]:
        return {key: int(value) for key, value in self._per_deployment(readings, deployments).items()}

    def _per_deployment(self, readings: list[Reading], deployments: Mapping[tuple[str, str], Key]) -> dict[Key, float]:
        found = {}
        for r in readings:
            where = (r.labels.get(self.labels.namespace, ""), r.labels.get(self.labels.deployment, ""))
            if where in deployments:
                found[deployments[where]] = r.value
        return found

    def _forbidden_from(self, readings: list[Reading], deployments: Mapping[tuple[str, str], Key]) -> dict[Key, str]:
        """Each Deployment's rollback-forbidden reason (the annotation's text, bounded by
        ServiceView); with several series (the text changed within the window) the first by
        text, so a snapshot is the same whichever order Prometheus answered in."""
        found: dict[Key, str] = {}
        for r in sorted(readings, key=lambda r: r.labels.get(self.labels.rollback_forbidden, "")):
            where = (r.labels.get(self.labels.namespace, ""), r.labels.get(self.labels.deployment, ""))
            reason = r.labels.get(self.labels.rollback_forbidden, "").strip()
            if where in deployments and reason:
                found.setdefault(deployments[where], reason)
        return found

    def replicas(self, environment: str, name: str) -> int | None:
        """Replicas of one service's Deployment now, or None when Prometheus has no count."""
        return self._replicas([(environment, name)]).get((environment, name))
