"""The series a real instrumented estate publishes to Prometheus, synthesized from the model.

The agents should observe the sim only the way they observe a real estate: through
Prometheus. So beside its own ``sim_*`` gauges the sim publishes what OpenTelemetry HTTP
instrumentation, Tempo's service graph, kube-state-metrics and an SLO rule would, under
their names; a Prometheus scraping the sim cannot tell it from an estate.

The histograms are made up, but they hold up to PromQL: each series keeps cumulative
bucket counts that grow at the service's load, spread over the buckets so that
``histogram_quantile(0.95, rate(..._bucket[w]))`` over a window in which the model's p95
did not change gives that p95 exactly (:func:`bucket_shares`). A window spanning a change
mixes old and new observations, as a real service's would.

No clock here: time is an argument (the app reads its clock under the sim's lock, so
scrapes advance in order). :class:`EstateTelemetry` is not thread-safe; the app advances
it inside ``SimState.read``, under the lock that guards the model, and renders the
readings it returns (:func:`render`) outside the lock.
"""

from __future__ import annotations

import bisect
import functools
import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from services.sim.model import Latency, Service

# OpenTelemetry's default explicit bounds (seconds), plus 30 and 60 s: the sim's p95 can
# be large, and a p95 beyond the largest bound cannot be read back.
BUCKETS: tuple[float, ...] = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    30.0,
    60.0,
)
QUANTILE = 0.95

SERVER_DURATION = "http_server_request_duration_seconds"
CLIENT_DURATION = "http_client_request_duration_seconds"
GRAPH_REQUESTS = "traces_service_graph_request_total"
GRAPH_SERVER_DURATION = "traces_service_graph_request_server_seconds"
SLO_THRESHOLD = "slo_latency_p95_threshold_seconds"
SPEC_REPLICAS = "kube_deployment_spec_replicas"
AVAILABLE_REPLICAS = "kube_deployment_status_replicas_available"
SPEC_PAUSED = "kube_deployment_spec_paused"
# kube-state-metrics' annotations series, with flotilla.dev/rollback-forbidden allowlisted
# (--metric-annotations-allowlist): the annotation as a label, its value the reason.
ANNOTATIONS = "kube_deployment_annotations"
FORBIDDEN_LABEL = "annotation_flotilla_dev_rollback_forbidden"
TARGET_INFO = "target_info"
ACTIVE_REQUESTS = "http_server_active_requests"
POOL_SLOTS = "worker_pool_slots"


def bucket_shares(p95: float) -> tuple[float, ...]:
    """The share of observations in each bucket (``BUCKETS``, then +Inf) whose 0.95
    quantile, as histogram_quantile interpolates it, is ``p95`` seconds.

    histogram_quantile finds the bucket (lo, hi] where the cumulative count reaches 0.95
    of the total and interpolates linearly inside it, so the shares put exactly the right
    mass below lo and inside (lo, hi]."""
    shares = [0.0] * (len(BUCKETS) + 1)
    i = bisect.bisect_left(BUCKETS, p95)  # BUCKETS[i - 1] < p95 <= BUCKETS[i]
    if i == 0:
        # (0, 5 ms] has no bucket below to balance against: everything goes in it, and
        # histogram_quantile reads 4.75 ms whatever the p95 (the first bucket's resolution).
        shares[0] = 1.0
        return tuple(shares)
    if i == len(BUCKETS):
        # Beyond the largest finite bound: everything in +Inf, and histogram_quantile can
        # only answer that bound (60 s), as it would for a real service this slow.
        shares[-1] = 1.0
        return tuple(shares)
    lo, hi = BUCKETS[i - 1], BUCKETS[i]
    frac = (p95 - lo) / (hi - lo)
    if frac >= 0.5:
        below = QUANTILE - 0.1 * frac
        shares[i] = 0.1
        shares[i + 1] = max(0.0, 0.1 * frac - (1.0 - QUANTILE))  # the bucket above (+Inf after 60 s)
    else:
        below = (QUANTILE - frac) / (1.0 - frac)
        shares[i] = 1.0 - below
    shares[i - 1] = below
    return tuple(shares)


@functools.lru_cache(maxsize=4096)
def _distribution(p95: float) -> tuple[tuple[float, ...], float]:
    """Cumulative shares per bucket (exactly 1.0 from the last occupied bucket on) and a
    plausible mean for ``_sum``; an estate has few distinct p95s, so this is cached."""
    shares = bucket_shares(p95)
    last = max(i for i, share in enumerate(shares) if share > 0)
    cumulative = [1.0 if i >= last else c for i, c in enumerate(itertools.accumulate(shares))]
    middles = [(lo + hi) / 2 for lo, hi in zip((0.0, *BUCKETS), BUCKETS, strict=False)] + [max(p95, BUCKETS[-1])]
    return tuple(cumulative), sum(s * m for s, m in zip(shares, middles, strict=True))


class SyntheticHistogram:
    """One histogram series: cumulative counts per bucket (+Inf last; the count is the
    +Inf bucket), a sum, and when it was last advanced. Counts only grow."""

    __slots__ = ("buckets", "last", "p95", "rate", "sum")

    def __init__(self) -> None:
        self.buckets: list[float] = [0.0] * (len(BUCKETS) + 1)
        self.sum = 0.0
        self.last: float | None = None  # None: not observed yet, or paused
        self.rate = 0.0  # of the last advance, for pause()
        self.p95 = 0.0

    def advance(self, now: float, rate: float, p95: float) -> None:
        """Observations at ``rate`` per second since the last advance, distributed for a
        p95 of ``p95`` seconds (the model's now: a change since the last advance counts
        from it). The first advance, and the first after :meth:`pause`, only starts the
        clock: a series appears at its old counts, without a burst."""
        self.rate, self.p95 = rate, p95
        if self.last is None:
            self.last = now
            return
        if now <= self.last:
            return
        cumulative, mean = _distribution(p95)
        n = rate * (now - self.last)
        # a new list each time: a reading holding the old one is never changed under it
        self.buckets = [count + n * share for count, share in zip(self.buckets, cumulative, strict=True)]
        self.sum += n * mean
        self.last = now

    def pause(self, now: float) -> None:
        """The series left the estate (its caller failed over away from it): it takes the
        calls up to ``now`` as it last saw them, then stops; if it comes back it resumes
        from its counts, with nothing observed meanwhile."""
        if self.last is not None:
            self.advance(now, self.rate, self.p95)
            self.last = None


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class _Edge:
    """A caller's calls to the target it uses for a dependency: the client histogram and
    Tempo's service-graph edge share one set of observations."""

    __slots__ = ("client_labels", "graph_labels", "histogram")

    def __init__(self, labels: str, client: str, server: str) -> None:
        self.client_labels = f'{labels},server_address="{_escape(server)}"'
        self.graph_labels = f'client="{_escape(client)}",server="{_escape(server)}",connection_type=""'
        self.histogram = SyntheticHistogram()


class _ServiceSeries:
    __slots__ = ("edges", "labels", "server")

    def __init__(self, name: str, environment: str) -> None:
        self.labels = f'service_name="{_escape(name)}",deployment_environment_name="{_escape(environment)}"'
        self.server = SyntheticHistogram()
        self.edges: dict[str, _Edge] = {}  # target service -> edge


@dataclass(frozen=True, slots=True)
class ServiceReading:
    """One service's values at a scrape, taken under the lock, rendered outside it."""

    name: str
    environment: str
    labels: str
    replicas: int
    revision: str
    threshold_seconds: float
    demand: float
    slots: float
    buckets: list[float]  # never changed after the reading (SyntheticHistogram.advance)
    sum: float
    edges: list[tuple[_Edge, list[float], float]]  # edge, its buckets and sum
    paused: bool = False
    rollback_forbidden: str | None = None  # why its running release may not be rolled back


class EstateTelemetry:
    """The histograms' state across scrapes, per service and per (caller, target)."""

    def __init__(self) -> None:
        self._series: dict[tuple[str, str], _ServiceSeries] = {}

    def advance(
        self, rows: Iterable[tuple[Service, Latency]], now: float, forbidden: Mapping[str, str] | None = None
    ) -> list[ServiceReading]:
        """Advance the series of the services in ``rows`` to ``now`` (seconds, any clock
        that does not go back) and read them. Only those services' series change, so a
        scrape of a few services costs what they do. ``forbidden``: service -> why its
        running release may not be rolled back (published as the Deployment's annotation)."""
        forbidden = forbidden or {}
        readings = []
        for service, latency in rows:
            key = (service.name, service.environment)
            series = self._series.get(key)
            if series is None:
                series = self._series[key] = _ServiceSeries(*key)
            series.server.advance(now, service.load_rps, latency.p95_ms / 1000.0)
            # Calls per request to each active target; two dependencies failed over to one
            # standby make one edge with both calls.
            calls: dict[str, tuple[int, float]] = {}
            for dep, p95_ms in latency.dependencies_ms.items():
                target = service.active[dep]
                calls[target] = (calls.get(target, (0, 0.0))[0] + 1, p95_ms / 1000.0)
            for target, edge in series.edges.items():
                if target not in calls:
                    edge.histogram.pause(now)
            edges = []
            for target, (count, p95) in calls.items():
                if target not in series.edges:
                    series.edges[target] = _Edge(series.labels, service.name, target)
                edge = series.edges[target]
                edge.histogram.advance(now, service.load_rps * count, p95)
                edges.append((edge, edge.histogram.buckets, edge.histogram.sum))
            readings.append(
                ServiceReading(
                    name=service.name,
                    environment=service.environment,
                    labels=series.labels,
                    replicas=service.replicas,
                    revision=service.revision,
                    threshold_seconds=service.threshold_ms / 1000.0,
                    demand=latency.demand,
                    slots=latency.slots,
                    buckets=series.server.buckets,
                    sum=series.server.sum,
                    edges=edges,
                    paused=service.paused,
                    rollback_forbidden=forbidden.get(service.name),
                )
            )
        return readings


_HELP = {
    SERVER_DURATION: ("histogram", "Duration of HTTP server requests."),
    CLIENT_DURATION: ("histogram", "Duration of HTTP client requests, by the server called."),
    GRAPH_REQUESTS: ("counter", "Requests between two services of the service graph."),
    GRAPH_SERVER_DURATION: ("histogram", "Duration of requests between two services, as the server saw them."),
    SLO_THRESHOLD: ("gauge", "The p95 latency above which the service breaches its objective, seconds."),
    SPEC_REPLICAS: ("gauge", "Desired replicas of the deployment."),
    AVAILABLE_REPLICAS: ("gauge", "Available replicas of the deployment."),
    SPEC_PAUSED: ("gauge", "Whether the deployment is paused and will not be processed by the deployment controller."),
    ANNOTATIONS: ("gauge", "Kubernetes annotations converted to Prometheus labels."),
    TARGET_INFO: ("gauge", "The service's resource attributes."),
    ACTIVE_REQUESTS: ("gauge", "HTTP server requests in flight, those waiting for a worker slot included."),
    POOL_SLOTS: ("gauge", "Worker slots (threads, connections) of the service; requests beyond them wait."),
}
# the middle of a bucket line, between a series' labels and its count
_LE = [*(f',le="{bound!r}"}} ' for bound in BUCKETS), ',le="+Inf"} ']


def _family(out: list[str], name: str) -> None:
    kind, text = _HELP[name]
    out.append(f"# HELP {name} {text}\n# TYPE {name} {kind}\n")


def _values(counts: list[float]) -> list[str]:
    """Each count as exposition text (with its newline); a cumulative histogram repeats
    most of its counts, and formatting floats is most of the rendering time."""
    text: dict[float, str] = {}
    return [text[c] if c in text else text.setdefault(c, f"{c!r}\n") for c in counts]


def _histogram(out: list[str], name: str, labels: str, values: list[str], total: float) -> None:
    head = f"{name}_bucket{{{labels}"
    out.extend([head + le + value for le, value in zip(_LE, values, strict=True)])
    out.append(f"{name}_sum{{{labels}}} {total!r}\n{name}_count{{{labels}}} {values[-1]}")


def render(readings: list[ServiceReading]) -> str:
    """Prometheus text (format 0.0.4) for the readings, one family at a time."""
    out: list[str] = []
    _family(out, SERVER_DURATION)
    for r in readings:
        _histogram(out, SERVER_DURATION, r.labels, _values(r.buckets), r.sum)
    # formatted once for the three families an edge appears in
    edges = [(edge, _values(buckets), total) for r in readings for edge, buckets, total in r.edges]
    _family(out, CLIENT_DURATION)
    for edge, values, total in edges:
        _histogram(out, CLIENT_DURATION, edge.client_labels, values, total)
    _family(out, GRAPH_REQUESTS)
    out.extend(f"{GRAPH_REQUESTS}{{{edge.graph_labels}}} {values[-1]}" for edge, values, _ in edges)
    _family(out, GRAPH_SERVER_DURATION)
    for edge, values, total in edges:
        _histogram(out, GRAPH_SERVER_DURATION, edge.graph_labels, values, total)
    _family(out, SLO_THRESHOLD)
    out.extend(f"{SLO_THRESHOLD}{{{r.labels}}} {r.threshold_seconds!r}\n" for r in readings)
    _family(out, ACTIVE_REQUESTS)
    out.extend(f"{ACTIVE_REQUESTS}{{{r.labels}}} {r.demand!r}\n" for r in readings)
    _family(out, POOL_SLOTS)
    out.extend(f"{POOL_SLOTS}{{{r.labels}}} {r.slots!r}\n" for r in readings)
    for name in (SPEC_REPLICAS, AVAILABLE_REPLICAS):
        _family(out, name)
        out.extend(
            f'{name}{{namespace="{_escape(r.environment)}",deployment="{_escape(r.name)}"}} {r.replicas}\n'
            for r in readings
        )
    _family(out, SPEC_PAUSED)
    out.extend(
        f'{SPEC_PAUSED}{{namespace="{_escape(r.environment)}",deployment="{_escape(r.name)}"}} {int(r.paused)}\n'
        for r in readings
    )
    _family(out, ANNOTATIONS)  # only the Deployments that carry the annotation
    out.extend(
        f'{ANNOTATIONS}{{namespace="{_escape(r.environment)}",deployment="{_escape(r.name)}",'
        f'{FORBIDDEN_LABEL}="{_escape(r.rollback_forbidden)}"}} 1\n'
        for r in readings
        if r.rollback_forbidden is not None
    )
    _family(out, TARGET_INFO)
    # the running release's image as OpenTelemetry's container resource attributes name it
    # (container.image.name, container.image.tags): a rollback is shown with the images
    out.extend(
        f'{TARGET_INFO}{{{r.labels},service_version="{_escape(r.revision)}",'
        f'container_image_name="{_escape(r.name)}",container_image_tags="{_escape(r.revision)}"}} 1\n'
        for r in readings
    )
    return "".join(out)
