"""A client of Prometheus' HTTP query API (``/api/v1/query``, ``/api/v1/query_range``).

The same API is served by Thanos Query, Grafana Mimir, Cortex and VictoriaMetrics, so one
client serves them all: a bearer token or basic auth, a CA file for a private PKI, and
Mimir's tenant header. Anything that is not a successful answer of the documented shape
(refused, timed out, 4xx/5xx, not JSON, an error status, or *partial* data — Prometheus'
``warnings``, which Thanos uses for a store that did not answer) raises
:class:`PrometheusUnavailable`: an agent never decides, and the health agent never opens
an incident, on part of an answer.
"""

from __future__ import annotations

import logging
import math
import ssl
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from flotilla_evidence.base import EvidenceUnavailable

log = logging.getLogger(__name__)


class PrometheusUnavailable(EvidenceUnavailable):
    """Prometheus (or what stands at its URL) did not give a whole, well-formed answer."""


@dataclass(frozen=True)
class Reading:
    """One series of an instant vector: its labels and its value."""

    labels: dict[str, str]
    value: float


@dataclass(frozen=True)
class RangeSeries:
    """One series of a range query: its labels and its finite points, oldest first."""

    labels: dict[str, str]
    points: tuple[tuple[datetime, float], ...]


@dataclass(frozen=True)
class Credentials:
    """How to authenticate: a bearer token, or basic auth (not both); a tenant for Mimir."""

    bearer_token: str | None = None
    username: str | None = None
    password: str | None = None
    tenant: str | None = None

    def __post_init__(self) -> None:
        if self.bearer_token and self.username:
            raise ValueError("Prometheus: a bearer token or basic auth, not both")
        if (self.username is None) != (self.password is None):
            raise ValueError("Prometheus: basic auth needs both a username and a password")

    def headers(self) -> dict[str, str]:
        found = {}
        if self.bearer_token:
            found["Authorization"] = f"Bearer {self.bearer_token}"
        if self.tenant:
            found["X-Scope-OrgID"] = self.tenant
        return found

    def auth(self) -> httpx.BasicAuth | None:
        if self.username is None or self.password is None:
            return None
        return httpx.BasicAuth(self.username, self.password)


def _number(text: Any) -> float | None:
    """A sample value ("1.5", "NaN", "+Inf") as a finite float, else None: NaN means no
    data (a quantile over no requests) and infinities are not a reading."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


class PrometheusClient:
    """Instant and range queries over one long-lived HTTP client (a new client per call
    costs ~25 ms, its TLS context); thread-safe, as httpx's client is."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float = 5.0,
        credentials: Credentials | None = None,
        ca_file: Path | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        credentials = credentials or Credentials()
        verify: ssl.SSLContext | bool = True
        if ca_file is not None:
            verify = ssl.create_default_context(cafile=str(ca_file))
        self._client = httpx.Client(
            base_url=self.base_url,
            timeout=timeout,
            headers=credentials.headers(),
            auth=credentials.auth(),
            verify=verify,
            transport=transport,
        )

    def close(self) -> None:
        self._client.close()

    def _call(self, path: str, form: dict[str, str]) -> dict[str, Any]:
        what = f"{self.base_url}{path} {form.get('query', '')[:200]!r}"
        try:
            # POST with a form body: the documented alternative to GET, for queries too
            # long for a URL (a neighbourhood's regex of service names).
            response = self._client.post(path, data=form)
        except httpx.HTTPError as exc:
            raise PrometheusUnavailable(f"{what}: {exc.__class__.__name__}: {exc}") from exc
        try:
            body = response.json()
        except ValueError:
            raise PrometheusUnavailable(
                f"{what}: HTTP {response.status_code}, not a Prometheus answer (not JSON): {response.text[:200]!r}"
            ) from None
        if not isinstance(body, dict) or body.get("status") != "success":
            error = body.get("error") if isinstance(body, dict) else None
            kind = body.get("errorType") if isinstance(body, dict) else None
            said = error if error else repr(body)[:200]
            raise PrometheusUnavailable(f"{what}: HTTP {response.status_code}, {kind or 'error'}: {said}")
        if body.get("warnings"):
            raise PrometheusUnavailable(f"{what}: partial answer, refused: {'; '.join(map(str, body['warnings']))}")
        data = body.get("data")
        if not isinstance(data, dict) or "resultType" not in data or not isinstance(data.get("result"), list):
            raise PrometheusUnavailable(f"{what}: the answer has no data.resultType/result")
        return data

    def query(self, promql: str, at: datetime | None = None) -> list[Reading]:
        """An instant query; the result must be a vector (or a scalar, as one unlabelled reading)."""
        form = {"query": promql}
        if at is not None:
            form["time"] = f"{at.timestamp():.3f}"
        data = self._call("/api/v1/query", form)
        if data["resultType"] == "scalar":
            value = _number(data["result"][1]) if len(data["result"]) == 2 else None
            return [] if value is None else [Reading({}, value)]
        if data["resultType"] != "vector":
            raise PrometheusUnavailable(f"{promql[:200]!r}: expected a vector, got {data['resultType']}")
        found = []
        for item in data["result"]:
            try:
                labels, (_, raw) = dict(item["metric"]), item["value"]
            except (KeyError, TypeError, ValueError) as exc:
                raise PrometheusUnavailable(f"{promql[:200]!r}: a sample is not the documented shape: {exc!r}") from exc
            value = _number(raw)
            if value is not None:
                found.append(Reading({str(k): str(v) for k, v in labels.items()}, value))
        return found

    def query_range(self, promql: str, *, start: datetime, end: datetime, step: timedelta) -> list[RangeSeries]:
        """A range query; the result must be a matrix."""
        form = {
            "query": promql,
            "start": f"{start.timestamp():.3f}",
            "end": f"{end.timestamp():.3f}",
            "step": f"{max(step.total_seconds(), 0.001):g}",
        }
        data = self._call("/api/v1/query_range", form)
        if data["resultType"] != "matrix":
            raise PrometheusUnavailable(f"{promql[:200]!r}: expected a matrix, got {data['resultType']}")
        found = []
        for item in data["result"]:
            try:
                labels, values = dict(item["metric"]), item["values"]
                points = tuple(
                    (datetime.fromtimestamp(float(t), UTC), v) for t, raw in values if (v := _number(raw)) is not None
                )
            except (KeyError, TypeError, ValueError) as exc:
                raise PrometheusUnavailable(f"{promql[:200]!r}: a series is not the documented shape: {exc!r}") from exc
            found.append(RangeSeries({str(k): str(v) for k, v in labels.items()}, points))
        return found
