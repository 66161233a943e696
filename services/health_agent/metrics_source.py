"""Where the health agent reads every watched service's latency, each tick.

- :class:`PromQLMetrics` (the default): Prometheus' query API through
  :class:`flotilla_evidence.PrometheusEvidence` — each service's p95 from its
  request-duration histogram against its threshold (catalogue or threshold query), the
  same PromQL a team can override for its estate. A service is watched when both exist.
- :class:`SimMetrics`: the sim's own ``/metrics`` gauges read directly
  (``sim_latency_p95_ms``, ``sim_latency_threshold_ms``), the path before Prometheus,
  kept only so a benchmark can measure what Prometheus adds (``FLOTILLA_HEALTH_SOURCE=scrape``).

Either raises :class:`ScrapeError` for an answer it cannot use, whole or in part: the
agent then opens nothing and keeps its state until a whole answer comes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import httpx
from flotilla_evidence import EvidenceUnavailable, PrometheusEvidence
from prometheus_client.parser import text_string_to_metric_families

P95 = "sim_latency_p95_ms"
THRESHOLD = "sim_latency_threshold_ms"


@dataclass(frozen=True)
class Sample:
    service: str
    environment: str
    p95_ms: float
    threshold_ms: float

    @property
    def key(self) -> tuple[str, str]:
        return (self.environment, self.service)


class ScrapeError(Exception):
    """The metrics could not be read or parsed."""


class MetricsSource(Protocol):
    name: str

    def scrape(self) -> list[Sample]:
        """Every watched service's reading now; raises :class:`ScrapeError`."""
        ...


class PromQLMetrics:
    """Readings from Prometheus (two instant queries a tick: p95 and thresholds)."""

    def __init__(self, evidence: PrometheusEvidence) -> None:
        self._evidence = evidence
        self.name = evidence.name

    def scrape(self) -> list[Sample]:
        try:
            readings = self._evidence.latency_readings()
        except EvidenceUnavailable as exc:
            raise ScrapeError(str(exc)) from exc
        if not readings:
            # Not an estate with nothing in it: a Prometheus just restarted answers with no
            # rate for anyone until its window holds new samples (seconds), and wrong queries
            # or labels read nothing for ever. Either way nothing can be judged.
            raise ScrapeError(
                f"{self.name} has no latency reading for any service (restarted, or the queries match nothing)"
            )
        return [Sample(r.service, r.environment, r.p95_ms, r.threshold_ms) for r in readings]


def parse(text: str, default_environment: str) -> list[Sample]:
    """Samples from Prometheus text; services lacking either series are left out. Only the
    two families' lines are parsed: the sim publishes an estate's worth of histograms
    beside them (12 MB for 2,000 services), which would take seconds to parse."""
    p95: dict[tuple[str, str], float] = {}
    thresholds: dict[tuple[str, str], float] = {}
    wanted = "\n".join(
        line for line in text.splitlines() if line.startswith((P95, THRESHOLD, f"# TYPE {P95}", f"# TYPE {THRESHOLD}"))
    )
    if f"\n{P95}" not in f"\n{wanted}":
        raise ScrapeError(f"no {P95} series: not the sim's metrics ({text[:80]!r})")
    try:
        families = list(text_string_to_metric_families(wanted + "\n"))
    except ValueError as exc:
        raise ScrapeError(f"metrics are not Prometheus text: {exc}") from exc
    for family in families:
        for sample in family.samples:
            target = p95 if sample.name == P95 else thresholds if sample.name == THRESHOLD else None
            service = sample.labels.get("service")
            if target is None or not service or math.isnan(sample.value):
                continue
            target[(sample.labels.get("environment") or default_environment, service)] = float(sample.value)
    return [
        Sample(service=service, environment=env, p95_ms=p95[(env, service)], threshold_ms=thresholds[(env, service)])
        for env, service in sorted(p95.keys() & thresholds.keys())
    ]


class SimMetrics:
    """Scrapes ``<sim>/metrics``."""

    def __init__(self, base_url: str, *, timeout: float, default_environment: str) -> None:
        self._url = base_url.rstrip("/") + "/metrics"
        self.name = self._url
        self._timeout = timeout
        self._default_environment = default_environment
        self._client = httpx.Client(timeout=timeout)  # reused: a new client costs ~25 ms

    def scrape(self) -> list[Sample]:
        try:
            response = self._client.get(self._url)
            response.raise_for_status()
        except httpx.HTTPError as exc:
            raise ScrapeError(f"GET {self._url}: {exc}") from exc
        return parse(response.text, self._default_environment)
