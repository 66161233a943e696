"""The PromQL Flotilla runs, and how an estate overrides it.

The defaults follow OpenTelemetry's HTTP semantic conventions as Prometheus stores them
(``http.server.request.duration`` → ``http_server_request_duration_seconds``, resource
attributes ``service.name`` → ``service_name`` and ``deployment.environment.name`` →
``deployment_environment_name``), the service-graph metrics of the OpenTelemetry
Collector's servicegraph connector and Tempo's metrics generator, and kube-state-metrics.
Every query returns milliseconds where it returns a duration.

Each can be replaced per estate (``FLOTILLA_PROMQL_<NAME>``, e.g.
``FLOTILLA_PROMQL_SERVICE_P95``), keeping its placeholders: ``$services`` (a regex of
the service names asked about, ``.+`` for the whole estate), ``$deployments`` (the same
for Deployment names) and ``$window`` (the rate window, ``FLOTILLA_PROMQL_WINDOW``).
The labels the results are read by are settings too (``FLOTILLA_PROMETHEUS_*_LABEL``).
An empty query turns that reading off (utilization is off unless an estate says how).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields, replace
from string import Template

DEFAULTS = {
    # p95 of each service's own requests (server side), ms
    "service_p95": (
        "histogram_quantile(0.95, sum by (le, service_name, deployment_environment_name) "
        '(rate(http_server_request_duration_seconds_bucket{service_name=~"$services"}[$window])))'
        " * 1000"
    ),
    # p95 each caller sees per dependency (client side), ms
    "dependency_p95": (
        "histogram_quantile(0.95, sum by (le, service_name, server_address) "
        '(rate(http_client_request_duration_seconds_bucket{service_name=~"$services"}[$window])))'
        " * 1000"
    ),
    # who calls whom (requests/s per edge), from the servicegraph connector / Tempo
    "edges": 'sum by (client, server) (rate(traces_service_graph_request_total{client=~"$services"}[$window]))',
    # p95 per edge as the server saw it, ms: the dependency latency where no client histogram has it
    "edge_p95": (
        "histogram_quantile(0.95, sum by (le, client, server) "
        '(rate(traces_service_graph_request_server_seconds_bucket{client=~"$services"}[$window]))) * 1000'
    ),
    # each service's p95 threshold, ms (a catalogue's latency_threshold_ms wins). Gauges are
    # read as their last value over the window, not at the instant: one failed scrape marks
    # every series of its target stale, and an instant query then has no threshold for a
    # service whose p95 (a rate over the window) it still has. A long chaos soak escalated 30
    # diagnoses in one second that way ("not in the topology").
    "threshold": (
        "max by (service_name, deployment_environment_name) "
        '(last_over_time(slo_latency_p95_threshold_seconds{service_name=~"$services"}[$window])) * 1000'
    ),
    # replicas wanted, per Deployment (kube-state-metrics), last over the window as above
    "replicas": (
        'max by (namespace, deployment) (last_over_time(kube_deployment_spec_replicas{deployment=~"$deployments"}'
        "[$window]))"
    ),
    # the running version, over the look-back (a range query: before and after a change)
    "versions": (
        'max by (service_name, deployment_environment_name, service_version) (target_info{service_name=~"$services"})'
    ),
    # worker-slot demand over slots per service; no convention exists, so off by default
    "utilization": "",
}


# The result label (a Labels field) each default query's $services or $deployments selects
# on: a reader of a merged request keeps the series of its own names by it
# (flotilla_evidence.coalesce). An estate's own query may scope any label: it is asked alone.
SCOPED_BY = {
    "service_p95": "service",
    "dependency_p95": "service",
    "edges": "client",
    "edge_p95": "client",
    "threshold": "service",
    "replicas": "deployment",
    "versions": "service",
}


@dataclass(frozen=True)
class Labels:
    """Which result labels name what."""

    service: str = "service_name"
    environment: str = "deployment_environment_name"
    dependency: str = "server_address"  # on the client histogram: the peer
    client: str = "client"  # on the service graph
    server: str = "server"
    namespace: str = "namespace"
    deployment: str = "deployment"
    version: str = "service_version"


@dataclass(frozen=True)
class Queries:
    service_p95: str = DEFAULTS["service_p95"]
    dependency_p95: str = DEFAULTS["dependency_p95"]
    edges: str = DEFAULTS["edges"]
    edge_p95: str = DEFAULTS["edge_p95"]
    threshold: str = DEFAULTS["threshold"]
    replicas: str = DEFAULTS["replicas"]
    versions: str = DEFAULTS["versions"]
    utilization: str = DEFAULTS["utilization"]
    window: str = "2m"

    @classmethod
    def with_overrides(cls, overrides: dict[str, str | None], window: str) -> Queries:
        """The defaults, with each override that is set (None: keep the default)."""
        unknown = set(overrides) - {f.name for f in fields(cls)} - {"window"}
        if unknown:
            raise ValueError(f"no PromQL query named {', '.join(sorted(unknown))}")
        chosen = {name: query for name, query in overrides.items() if query is not None}
        return replace(cls(window=window), **chosen)

    def scoped_label(self, name: str) -> str | None:
        """The Labels field query ``name`` selects its scope on, if it is the default query
        (None for an estate's override: where its placeholder goes is unknown)."""
        return SCOPED_BY.get(name) if getattr(self, name) == DEFAULTS[name] else None

    def render(
        self, name: str, *, services: Iterable[str] | None = None, deployments: Iterable[str] | None = None
    ) -> str:
        """Query ``name`` for ``services`` (None: every service), placeholders filled."""
        template: str = getattr(self, name)
        return Template(template).safe_substitute(
            services=name_regex(services), deployments=name_regex(deployments), window=self.window
        )


def name_regex(names: Iterable[str] | None) -> str:
    """An RE2 alternation matching exactly ``names`` inside a PromQL string literal
    (``.+``: anything). Regex metacharacters are escaped once for RE2 and once more for
    the string literal that carries the regex."""
    if names is None:
        return ".+"
    chosen = sorted(set(names))
    if not chosen:
        raise ValueError("a query about no service at all")  # "" would match series without the label

    def escaped(name: str) -> str:
        return "".join(c if c.isalnum() or c in "_-:/" else "\\\\" + c for c in name)

    return "|".join(escaped(n) for n in chosen)
