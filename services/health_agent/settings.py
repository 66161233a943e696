"""The health agent's settings (``FLOTILLA_*`` variables over the stack env file)."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from flotilla_evidence import EvidenceSettings, promql_seconds
from pydantic import Field, field_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from flotilla.bearer import DEMO_ALERT_TOKEN_DIGEST, BearerTokens
from flotilla.fleet import HEALTH, SIM, url

Opener = Literal["metrics", "alerts"]


class HealthSettings(EvidenceSettings):
    model_config = SettingsConfigDict(env_prefix="FLOTILLA_", extra="ignore")

    service_name: str = HEALTH.name
    service_database: str = HEALTH.database or "flotilla_health"
    http_port: int = HEALTH.http_port

    # Where latency is read: Prometheus (FLOTILLA_PROMETHEUS_URL and the PromQL of
    # flotilla_evidence), or `scrape`: the sim's own /metrics gauges read directly, the
    # path before Prometheus, kept only to measure what Prometheus adds (benchmarks).
    health_source: Literal["prometheus", "scrape"] = "prometheus"
    sim_url: str = url(SIM)  # FLOTILLA_SIM_URL: scraped only with health_source=scrape
    health_scrape_seconds: float = 1.0  # FLOTILLA_HEALTH_SCRAPE_SECONDS: how often latency is read
    health_scrape_timeout_seconds: float = 2.0
    health_breach_scrapes: int = 3  # K: consecutive breaching readings that open an incident
    health_clear_scrapes: int = 3  # M: consecutive healthy readings that end a breach
    health_verify_seconds: float = 5.0  # FLOTILLA_HEALTH_VERIFY_SECONDS: verification window
    # How old the newest request a reading covers can be: a p95 over a rate window still
    # counts requests from before a recovery ran, so verification looks only at readings
    # this long after it. Unset: the PromQL window (0 with health_source=scrape).
    health_metrics_lag_seconds: float | None = Field(None, ge=0)
    # What may open an incident: the agent's own readings, Alertmanager's alerts, or both.
    # Readings are taken either way (they know the estate and verify recoveries).
    health_open_from: Annotated[frozenset[Opener], NoDecode] = frozenset({"metrics", "alerts"})
    incidents_topic: str = "incidents"

    # Alertmanager's webhook (POST /alerts): who may send (JSON list of lower-case hex
    # SHA-256 digests of bearer tokens, or {"name", "sha256"} entries: the same scheme as
    # the DLQ reconciler's operators). Unset: the demo token's digest in the demo profile.
    alert_tokens: Annotated[list[str | dict[str, str]] | None, NoDecode] = None
    # Which alert labels name the service and its environment, first found wins.
    alert_service_labels: Annotated[tuple[str, ...], NoDecode] = ("service_name", "service", "job")
    alert_environment_labels: Annotated[tuple[str, ...], NoDecode] = (
        "deployment_environment_name",
        "environment",
        "env",
        "namespace",
    )
    # The largest webhook body taken (413 over it, read only after the sender's token is
    # checked): 5000 alerts (the most one delivery may hold) of ~3 KiB each, twice the
    # size of the estate rule's alerts as Alertmanager sends them (~1.3 KiB, most of it
    # the generatorURL). Each alert's own bounds are in services/health_agent/alerts.py.
    alert_max_body_bytes: int = Field(16 * 1024 * 1024, gt=0)
    # How long after a recovery's window an alert may still be reported firing before the
    # recovery counts as failed: Alertmanager reports a resolution only after its rule is
    # evaluated and its group_interval (5 min by default) has passed.
    health_alert_resolve_grace_seconds: float = Field(330.0, ge=0)
    # At most this many incidents per service in any hour, alerts and readings together (0:
    # no cap). Past it a breach or alert opens nothing: counted, logged, and the first one in
    # the hour escalated to people at once (services/health_agent/incidents.py).
    health_incidents_per_hour: int = Field(12, ge=0)

    @field_validator("health_open_from", mode="before")
    @classmethod
    def _openers(cls, value: Any) -> Any:
        if isinstance(value, str):
            chosen = {part.strip() for part in value.split(",") if part.strip()}
            if not chosen:
                raise ValueError("FLOTILLA_HEALTH_OPEN_FROM names nothing: metrics, alerts, or both")
            return frozenset(chosen)
        return value

    @field_validator("alert_tokens", mode="before")
    @classmethod
    def _json_tokens(cls, value: Any) -> Any:
        if isinstance(value, str):
            return json.loads(value) if value.strip() else None
        return value

    @field_validator("alert_service_labels", "alert_environment_labels", mode="before")
    @classmethod
    def _names(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    def metrics_lag_seconds(self) -> float:
        if self.health_metrics_lag_seconds is not None:
            return self.health_metrics_lag_seconds
        return 0.0 if self.health_source == "scrape" else promql_seconds(self.promql_window)

    def alert_senders(self) -> tuple[BearerTokens, bool]:
        """Who may deliver alerts, and whether that is the demo token (see alert_tokens)."""
        if self.alert_tokens is None:
            self.allow_demo_credentials("FLOTILLA_ALERT_TOKENS")
            return BearerTokens([DEMO_ALERT_TOKEN_DIGEST], kind="alert sender"), True
        if not self.alert_tokens:
            raise ValueError("FLOTILLA_ALERT_TOKENS names no sender: configure at least one token digest")
        return BearerTokens(self.alert_tokens, kind="alert sender"), False
