"""Evidence from the sim: the dependency graph (``GET /services``) and the latencies
(``GET /metrics``), read into one :class:`Topology`.

The HTTP API is the one in docs/design/fleet-contracts.md. Anything that is not that API
(connection refused, a 5xx, a body that is not the documented shape) raises
:class:`SimUnavailable`: the diagnostic agent then retries later through a job instead of
dead-lettering the request.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from flotilla_reasoning.model import ServiceView, Topology

DEPENDENCY_P95 = "sim_dependency_latency_p95_ms"
SERVICE_P95 = "sim_latency_p95_ms"
UTILIZATION = "sim_pool_utilization_ratio"  # not in the spec doc yet; used when present


class SimUnavailable(Exception):
    """The sim did not answer, or not with its documented API."""


def parse_services(body: Any) -> dict[str, ServiceView]:
    if not isinstance(body, list):
        raise SimUnavailable(f"GET /services: expected a JSON list, got {type(body).__name__}")
    services: dict[str, ServiceView] = {}
    for item in body:
        try:
            view = ServiceView(
                name=str(item["name"]),
                environment=str(item["environment"]),
                replicas=int(item["replicas"]),
                p95_ms=float(item["p95Ms"]),
                threshold_ms=float(item["thresholdMs"]),
                dependencies=tuple(str(d) for d in item.get("dependencies") or ()),
                revision=_text(item.get("revision")),
                previous_revision=_text(item.get("previousRevision")),
                failover_targets={str(k): str(v) for k, v in (item.get("failoverTargets") or {}).items()},
                active_dependencies={str(k): str(v) for k, v in (item.get("activeDependencies") or {}).items()},
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise SimUnavailable(f"GET /services: a service entry is not the documented shape: {exc!r}") from exc
        services[view.name] = view
    return services


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


@dataclass(frozen=True)
class Metrics:
    dependency_p95: dict[tuple[str, str], float]
    service_p95: dict[str, float]
    utilization: dict[str, float]


def parse_metrics(text: str) -> Metrics:
    """The series the agents read, from Prometheus text (others are ignored)."""
    found = Metrics({}, {}, {})
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as exc:
        raise SimUnavailable(f"GET /metrics: not Prometheus text: {exc}") from exc
    for family in families:
        for sample in family.samples:
            labels = sample.labels
            if sample.name == DEPENDENCY_P95 and "service" in labels and "dependency" in labels:
                found.dependency_p95[(labels["service"], labels["dependency"])] = float(sample.value)
            elif sample.name == SERVICE_P95 and "service" in labels:
                found.service_p95[labels["service"]] = float(sample.value)
            elif sample.name == UTILIZATION and "service" in labels:
                found.utilization[labels["service"]] = float(sample.value)
    return found


class SimClient:
    """Reads the sim over one long-lived HTTP client (creating an httpx client costs
    ~25 ms — its TLS context — which would be paid on every hop)."""

    def __init__(self, base_url: str, *, timeout: float = 5.0, transport: httpx.BaseTransport | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self._timeout = timeout
        self._client = httpx.Client(base_url=self.base_url, timeout=timeout, transport=transport)

    def _get(self, path: str, params: dict[str, list[str]] | None = None) -> httpx.Response:
        try:
            response = self._client.get(path, params=params)
            response.raise_for_status()
        except httpx.HTTPError as exc:
            raise SimUnavailable(f"GET {self.base_url}{path}: {exc.__class__.__name__}: {exc}") from exc
        return response

    def _services(self, names: list[str] | None = None) -> dict[str, ServiceView]:
        response = self._get("/services", None if names is None else {"name": names})
        try:
            body = response.json()
        except ValueError as exc:
            raise SimUnavailable(f"GET /services: not JSON: {exc}") from exc
        return parse_services(body)

    def snapshot(self, around: str | None = None) -> Topology:
        """The whole estate, or with ``around`` the neighbourhood of that service: itself,
        its dependencies and the targets it fails them over to — everything a diagnosis
        or a plan for it reads or names. A storm over a large estate made the whole-estate
        read most of the agents' (and the sim's) CPU; an LLM's prompt is smaller too.

        A sim that ignores the filters answers with everything, which is still right."""
        if around is None:
            services = self._services()
            metrics = self._get("/metrics")
        else:
            services = self._services([around])
            centre = services.get(around.rpartition("/")[2])  # the sim also takes <environment>/<name>
            neighbours = sorted(neighbourhood(centre) - services.keys()) if centre is not None else []
            if neighbours:
                services.update(self._services(neighbours))
            metrics = self._get("/metrics", {"service": sorted(services)})
        # /services is authoritative for a service's own p95; /metrics adds what each
        # caller observes per dependency, and pool utilization.
        parsed = parse_metrics(metrics.text)
        return Topology(
            services=services,
            dependency_p95=parsed.dependency_p95,
            utilization=parsed.utilization,
            observed_at=datetime.now(UTC),
            source=self.base_url,
        )


def neighbourhood(service: ServiceView) -> set[str]:
    """The services a diagnosis or a plan for ``service`` may read or name."""
    return {
        service.name,
        *service.dependencies,
        *service.failover_targets.values(),
        *service.active_dependencies.values(),
    }
