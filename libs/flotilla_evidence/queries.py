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

Every selector of the defaults starts with ``${trusted}``: nothing, or with
``FLOTILLA_PROMETHEUS_TRUSTED_JOBS`` set ``job=~"<those jobs>",``, so that only series
Prometheus scraped from those jobs count (telemetry is a trust root: any series carrying a
service's labels adds to its p95 otherwise). An estate's own query may place it too.
"""

from __future__ import annotations

import logging
import string
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, replace
from string import Template

from flotilla.bounds import NAME_MAX
from flotilla_evidence.base import EvidenceUnavailable

log = logging.getLogger(__name__)

DEFAULTS = {
    # p95 of each service's own requests (server side), ms
    "service_p95": (
        "histogram_quantile(0.95, sum by (le, service_name, deployment_environment_name) "
        '(rate(http_server_request_duration_seconds_bucket{${trusted}service_name=~"$services"}[$window])))'
        " * 1000"
    ),
    # p95 each caller sees per dependency (client side), ms
    "dependency_p95": (
        "histogram_quantile(0.95, sum by (le, service_name, server_address) "
        '(rate(http_client_request_duration_seconds_bucket{${trusted}service_name=~"$services"}[$window])))'
        " * 1000"
    ),
    # who calls whom (requests/s per edge), from the servicegraph connector / Tempo
    "edges": (
        'sum by (client, server) (rate(traces_service_graph_request_total{${trusted}client=~"$services"}[$window]))'
    ),
    # p95 per edge as the server saw it, ms: the dependency latency where no client histogram has it
    "edge_p95": (
        "histogram_quantile(0.95, sum by (le, client, server) "
        '(rate(traces_service_graph_request_server_seconds_bucket{${trusted}client=~"$services"}[$window]))) * 1000'
    ),
    # each service's p95 threshold, ms (a catalogue's latency_threshold_ms wins). Gauges are
    # read as their last value over the window, not at the instant: one failed scrape marks
    # every series of its target stale, and an instant query then has no threshold for a
    # service whose p95 (a rate over the window) it still has. A long chaos soak escalated 30
    # diagnoses in one second that way ("not in the topology").
    "threshold": (
        "max by (service_name, deployment_environment_name) "
        '(last_over_time(slo_latency_p95_threshold_seconds{${trusted}service_name=~"$services"}[$window])) * 1000'
    ),
    # replicas wanted, per Deployment (kube-state-metrics), last over the window as above
    "replicas": (
        "max by (namespace, deployment) "
        '(last_over_time(kube_deployment_spec_replicas{${trusted}deployment=~"$deployments"}[$window]))'
    ),
    # whether a Deployment's rollout is paused (kube-state-metrics), last over the window
    "paused": (
        "max by (namespace, deployment) "
        '(last_over_time(kube_deployment_spec_paused{${trusted}deployment=~"$deployments"}[$window]))'
    ),
    # why a Deployment may not be rolled back: its flotilla.dev/rollback-forbidden annotation,
    # which kube-state-metrics exposes once allowlisted (--metric-annotations-allowlist=
    # deployments=[flotilla.dev/rollback-forbidden]). Last over the window: a missed scrape
    # errs on the side of refusing.
    "rollback_forbidden": (
        "max by (namespace, deployment, annotation_flotilla_dev_rollback_forbidden) "
        '(last_over_time(kube_deployment_annotations{${trusted}deployment=~"$deployments",'
        'annotation_flotilla_dev_rollback_forbidden!=""}[$window]))'
    ),
    # the running version, over the look-back (a range query: before and after a change)
    "versions": (
        "max by (service_name, deployment_environment_name, service_version, k8s_container_name, "
        "container_image_name, container_image_tags) "
        '(target_info{${trusted}service_name=~"$services"})'
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
    "paused": "deployment",
    "rollback_forbidden": "deployment",
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
    rollback_forbidden: str = "annotation_flotilla_dev_rollback_forbidden"


@dataclass(frozen=True)
class Queries:
    service_p95: str = DEFAULTS["service_p95"]
    dependency_p95: str = DEFAULTS["dependency_p95"]
    edges: str = DEFAULTS["edges"]
    edge_p95: str = DEFAULTS["edge_p95"]
    threshold: str = DEFAULTS["threshold"]
    replicas: str = DEFAULTS["replicas"]
    paused: str = DEFAULTS["paused"]
    rollback_forbidden: str = DEFAULTS["rollback_forbidden"]
    versions: str = DEFAULTS["versions"]
    utilization: str = DEFAULTS["utilization"]
    window: str = "2m"
    # The scrape jobs whose series are believed (``${trusted}``); empty: every series is.
    trusted_jobs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        refused = {job: why for job in self.trusted_jobs if (why := unaskable(job))}
        if refused:
            raise ValueError(f"trusted jobs that cannot be asked about: {refused}")

    @classmethod
    def with_overrides(cls, overrides: dict[str, str | None], window: str, trusted_jobs: Iterable[str] = ()) -> Queries:
        """The defaults, with each override that is set (None: keep the default)."""
        unknown = set(overrides) - set(DEFAULTS)
        if unknown:
            raise ValueError(f"no PromQL query named {', '.join(sorted(unknown))}")
        chosen = {name: query for name, query in overrides.items() if query is not None}
        return replace(cls(window=window), **chosen, trusted_jobs=tuple(sorted(set(trusted_jobs))))

    def scoped_label(self, name: str) -> str | None:
        """The Labels field query ``name`` selects its scope on, if it is the default query
        (None for an estate's override: where its placeholder goes is unknown)."""
        return SCOPED_BY.get(name) if getattr(self, name) == DEFAULTS[name] else None

    def render(
        self, name: str, *, services: Iterable[str] | None = None, deployments: Iterable[str] | None = None
    ) -> str:
        """Query ``name`` for ``services`` (None: every service), placeholders filled."""
        template: str = getattr(self, name)
        trusted = f'job=~"{name_regex(self.trusted_jobs)}",' if self.trusted_jobs else ""
        return Template(template).safe_substitute(
            services=name_regex(services), deployments=name_regex(deployments), window=self.window, trusted=trusted
        )


class UnaskableName(EvidenceUnavailable):
    """Every name a read is about is one no query can ask for (not a label value, or not a
    name of the estate's); its reader alone fails, never a request it would have joined."""


def unaskable(name: str) -> str | None:
    """Why ``name`` cannot be asked about (None: it can). Prometheus' label values are UTF-8
    text; a Python string from JSON can hold lone surrogates, which no request can carry."""
    if not name:
        return "an empty name"  # as a regex it would match series without the label
    if len(name) > NAME_MAX:
        return f"longer than {NAME_MAX} characters"
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "not valid UTF-8"
    return None


def askable(names: Iterable[str], what: str = "query") -> list[str]:
    """``names`` that can be asked about, sorted; the others are left out, each logged with
    why (one such name from telemetry must not fail a request other readers share). Raises
    :class:`UnaskableName` when none is left, ValueError when there were none at all."""
    chosen = sorted(set(names))
    if not chosen:
        raise ValueError(f"a {what} about no service at all")  # "" would match series without the label
    refused = {name: why for name in chosen if (why := unaskable(name))}
    for name, why in refused.items():
        log.warning("%s: %.80r left out: %s", what, name, why)
    kept = [name for name in chosen if name not in refused]
    if not kept:
        said = "; ".join(f"{name!r:.80}: {why}" for name, why in refused.items())
        raise UnaskableName(f"no {what} can ask about {said}")
    return kept


def askable_scope(scope: frozenset[tuple[str, str]]) -> frozenset[tuple[str, str]]:
    """A read's ``(placeholder, name)`` pairs that can be asked about (:func:`askable`, per
    placeholder: none of its queries is left about no name): what it may add to a merged
    request (flotilla_evidence.coalesce)."""
    kept: set[tuple[str, str]] = set()
    for placeholder in {p for p, _ in scope}:
        names = askable((n for p, n in scope if p == placeholder), f"read of ${placeholder}")
        kept.update((placeholder, name) for name in names)
    return frozenset(kept)


# Punctuation RE2 reads as syntax (or might): each gets a backslash. RE2 refuses a backslash
# before anything else but ASCII punctuation (``\·`` is an error, ``\m`` unknown), so letters,
# digits and every non-ASCII character stay as they are. ``_-:/`` mean nothing outside a
# character class; left bare, the common names read as themselves.
_RE2_SYNTAX = frozenset(string.punctuation) - frozenset("_-:/")


def re2_literal(name: str) -> str:
    """An RE2 pattern matching exactly ``name`` (Prometheus anchors its matchers)."""
    return "".join("\\" + c if c in _RE2_SYNTAX else c for c in name)


def promql_string(text: str) -> str:
    """``text`` as the inside of a PromQL double-quoted string literal. The lexer ends the
    literal at ``"``, reads ``\\`` as an escape, refuses a raw newline and reads U+FFFD as an
    invalid rune: those and every control character are written as escapes (``\\u`` makes
    UTF-8, where ``\\x`` would make a raw byte)."""
    out = []
    for c in text:
        if c in '\\"':
            out.append("\\" + c)
        elif unicodedata.category(c) == "Cc" or c == "\ufffd":
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(c)
    return "".join(out)


def name_regex(names: Iterable[str] | None, what: str = "query") -> str:
    """The inside of a PromQL string literal holding an RE2 alternation that matches exactly
    ``names`` (``.+``: anything). Escaped in two steps that know nothing of each other: each
    name for RE2, then the whole pattern for the string literal. A name no query can ask for
    is left out (:func:`askable`)."""
    if names is None:
        return ".+"
    return promql_string("|".join(re2_literal(name) for name in askable(names, what)))
