"""Where the estate's evidence comes from: ``FLOTILLA_PROMETHEUS_*``, ``FLOTILLA_PROMQL_*``
and ``FLOTILLA_ESTATE_*`` (the stack env file sets the local stack's Prometheus)."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from flotilla import ServiceSettings
from flotilla_evidence.base import EvidenceSource
from flotilla_evidence.catalogue import Catalogue, load_catalogue
from flotilla_evidence.estate import Graph, PrometheusEvidence
from flotilla_evidence.kubernetes import KubernetesApi, KubernetesEvidence
from flotilla_evidence.prometheus import Credentials, PrometheusClient
from flotilla_evidence.queries import DEFAULTS, Labels, Queries

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def promql_seconds(duration: str) -> float:
    """A PromQL duration (``5s``, ``2m``, ``1m30s``) in seconds."""
    parts = _DURATION.findall(duration)
    if not parts or "".join(n + u for n, u in parts) != duration:
        raise ValueError(f"{duration!r} is not a PromQL duration such as 30s, 2m or 1m30s")
    return sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)


def _secret(value: SecretStr | None, file: Path | None, what: str) -> str | None:
    if value is not None and file is not None:
        raise ValueError(f"{what}: set the value or the file, not both")
    if file is not None:
        return file.read_text().strip()
    return None if value is None else value.get_secret_value()


class EvidenceSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="FLOTILLA_", extra="ignore")

    # The Prometheus HTTP API (Prometheus, Thanos Query, Mimir, VictoriaMetrics, ...).
    prometheus_url: str = "http://127.0.0.1:18120"
    prometheus_timeout_seconds: float = Field(5.0, gt=0)
    prometheus_bearer_token: SecretStr | None = None
    prometheus_bearer_token_file: Path | None = None
    prometheus_username: str | None = None
    prometheus_password: SecretStr | None = None
    prometheus_password_file: Path | None = None
    prometheus_ca_file: Path | None = None  # PEM bundle of a private CA
    prometheus_tenant: str | None = None  # X-Scope-OrgID (Mimir, Cortex)

    # The rate window of the default queries, and how far back history reaches.
    promql_window: str = "2m"
    evidence_lookback_seconds: float = Field(900.0, gt=0)
    evidence_step_seconds: float = Field(30.0, gt=0)
    # Overrides of the default queries (flotilla_evidence.queries); unset keeps the default.
    promql_service_p95: str | None = None
    promql_dependency_p95: str | None = None
    promql_edges: str | None = None
    promql_edge_p95: str | None = None
    promql_threshold: str | None = None
    promql_replicas: str | None = None
    promql_paused: str | None = None
    promql_rollback_forbidden: str | None = None
    promql_versions: str | None = None
    promql_utilization: str | None = None
    # The scrape jobs whose series every default query believes (comma-separated; each
    # selector gets job=~"<them>"). Empty: every series carrying a service's labels counts,
    # whoever wrote it (docs/operations/estate.md, "Which series are believed").
    prometheus_trusted_jobs: Annotated[tuple[str, ...], NoDecode] = ()
    # Result labels, when an estate's differ from OpenTelemetry's names.
    prometheus_service_label: str = "service_name"
    prometheus_environment_label: str = "deployment_environment_name"
    prometheus_dependency_label: str = "server_address"
    prometheus_version_label: str = "service_version"

    # The declared side: a catalogue file (flotilla_evidence.catalogue), and which graph.
    estate_catalogue_file: Path | None = None
    estate_graph: Graph = "both"
    estate_default_environment: str = "production"  # for series without an environment label
    # Environment -> Kubernetes namespace (the executor's setting of the same name).
    kubernetes_namespaces: Annotated[dict[str, str], NoDecode] = Field(default_factory=dict)
    # The Kubernetes API as one more source (flotilla_evidence.kubernetes): replicas,
    # rollouts and events of each service's Deployment, read with the pod's own token.
    kubernetes_evidence: bool = False
    kubernetes_api_url: str = "https://kubernetes.default.svc"
    kubernetes_token_file: Path = SERVICE_ACCOUNT / "token"
    kubernetes_ca_file: Path | None = SERVICE_ACCOUNT / "ca.crt"

    @field_validator("kubernetes_namespaces", mode="before")
    @classmethod
    def _json_map(cls, value: Any) -> Any:
        if isinstance(value, str):
            return json.loads(value) if value.strip() else {}
        return value

    @field_validator("prometheus_trusted_jobs", mode="before")
    @classmethod
    def _job_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(job.strip() for job in value.split(",") if job.strip())
        return value

    @field_validator("promql_window")
    @classmethod
    def _duration(cls, value: str) -> str:
        promql_seconds(value)
        return value

    @field_validator("estate_catalogue_file", "prometheus_ca_file", "kubernetes_ca_file", mode="before")
    @classmethod
    def _blank_path(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value

    def promql_queries(self) -> Queries:
        overrides = {name: getattr(self, f"promql_{name}") for name in DEFAULTS}
        return Queries.with_overrides(overrides, self.promql_window, self.prometheus_trusted_jobs)

    def prometheus_client(self) -> PrometheusClient:
        password = _secret(self.prometheus_password, self.prometheus_password_file, "FLOTILLA_PROMETHEUS_PASSWORD")
        credentials = Credentials(
            bearer_token=_secret(
                self.prometheus_bearer_token, self.prometheus_bearer_token_file, "FLOTILLA_PROMETHEUS_BEARER_TOKEN"
            ),
            username=self.prometheus_username,
            password=password,
            tenant=self.prometheus_tenant,
        )
        return PrometheusClient(
            self.prometheus_url,
            timeout=self.prometheus_timeout_seconds,
            credentials=credentials,
            ca_file=self.prometheus_ca_file,
        )

    def catalogue(self) -> Catalogue:
        """The catalogue, validated now: a mistake in it stops the service at start-up."""
        return load_catalogue(self.estate_catalogue_file, default_environment=self.estate_default_environment)

    def evidence(self) -> PrometheusEvidence:
        return PrometheusEvidence(
            self.prometheus_client(),
            queries=self.promql_queries(),
            labels=Labels(
                service=self.prometheus_service_label,
                environment=self.prometheus_environment_label,
                dependency=self.prometheus_dependency_label,
                version=self.prometheus_version_label,
            ),
            catalogue=self.catalogue(),
            graph=self.estate_graph,
            default_environment=self.estate_default_environment,
            namespaces=self.kubernetes_namespaces,
            lookback=timedelta(seconds=self.evidence_lookback_seconds),
            step=timedelta(seconds=self.evidence_step_seconds),
        )

    def workload_evidence(self) -> EvidenceSource:
        """:meth:`evidence`, with each Deployment's replicas, rollouts and events from the
        Kubernetes API when ``FLOTILLA_KUBERNETES_EVIDENCE`` is on (the diagnostic agent's)."""
        evidence = self.evidence()
        if not self.kubernetes_evidence:
            return evidence
        api = self.kubernetes_api("FLOTILLA_KUBERNETES_EVIDENCE is on")
        return KubernetesEvidence(evidence, api, evidence.deployment_of)

    def kubernetes_api(self, why: str, *, timeout: float = 5.0) -> KubernetesApi:
        """A read client of the API server these settings name, with the token read now;
        ``why`` says which setting asked for it when the token file cannot be read."""
        try:
            token = self.kubernetes_token_file.read_text().strip()
        except OSError as exc:
            raise ValueError(
                f"{why} but FLOTILLA_KUBERNETES_TOKEN_FILE ({self.kubernetes_token_file}) cannot be read: {exc}"
            ) from exc
        return KubernetesApi(self.kubernetes_api_url, token, ca_file=self.kubernetes_ca_file, timeout=timeout)
