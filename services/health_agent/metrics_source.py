"""Reading the watched services' latency from the sim's Prometheus ``/metrics``.

The sim exposes, per service, ``sim_latency_p95_ms{service=...}`` and
``sim_latency_threshold_ms{service=...}`` (see docs/design/fleet-contracts.md). A
service is watched when both are present; an ``environment`` label is honoured when
the source has one, otherwise the configured default applies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import httpx
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


def parse(text: str, default_environment: str) -> list[Sample]:
    """Samples from Prometheus text; services lacking either series are left out."""
    p95: dict[tuple[str, str], float] = {}
    thresholds: dict[tuple[str, str], float] = {}
    try:
        families = list(text_string_to_metric_families(text))
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
