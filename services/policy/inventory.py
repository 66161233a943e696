"""What the platform says about a target: whether it exists, and how many replicas run.

The 2x rule compares a scale command's target with what runs now. The proposal cannot
be trusted for that number (a model could understate it to slip under the limit), so
the policy service asks the platform itself: the sim's API locally (the sim is the
executor's target there: its own word on its replicas), the Kubernetes API server where
the executor acts on Deployments (the object it scales: :class:`KubernetesInventory`),
the estate's Prometheus (kube-state-metrics) and catalogue where there is nothing better,
a static table in tests. An unknown count never guesses: the guard
``unknown-capacity-needs-human`` then asks a person.

Prometheus is the weakest of these: ``kube_deployment_spec_replicas`` is a series like any
other, and whatever can push series with the same labels into the Prometheus the policy
reads can raise the count the 2x rule compares with (security review 3, M2;
docs/security/threat-model.md, "Telemetry is a trust root"). The API server's count is the
one the executor will change, written only by whoever may write the Deployment.

Whether a target exists matters for what waits for a person: a proposal whose target
has left the estate (a service removed, renamed, moved to another environment) can only
become a command the executor refuses, so the policy service withdraws it instead of
leaving it for an approver to trip over (:func:`services.policy.approvals.withdraw`).
Only a definite "no such service" counts: an inventory that cannot answer says None,
and the proposal waits as before.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol
from urllib.parse import quote

import httpx
from flotilla_evidence import Catalogue, EvidenceSettings, EvidenceUnavailable, PrometheusEvidence
from flotilla_evidence.kubernetes import KubernetesApi

from services.policy.decide import Target

log = logging.getLogger(__name__)


class Inventory(Protocol):
    def current_replicas(self, target: Target) -> int | None:
        """Replicas running now, or None when unknown."""
        ...

    def exists(self, target: Target) -> bool | None:
        """Whether the platform has ``target`` (in its environment); None when it cannot say."""
        ...


class NoInventory:
    def current_replicas(self, target: Target) -> int | None:
        return None

    def exists(self, target: Target) -> bool | None:
        return None


class StaticInventory:
    """Replica counts by ``<environment>/<name>`` (tests, fixed environments): a target
    the table does not name does not exist."""

    def __init__(self, replicas: Mapping[str, int]) -> None:
        self._replicas = dict(replicas)

    def current_replicas(self, target: Target) -> int | None:
        return self._replicas.get(target.key)

    def exists(self, target: Target) -> bool | None:
        return target.key in self._replicas


class SimInventory:
    """``GET {sim}/services/{name}``: its ``replicas`` when its environment matches; a
    404, or the name in another environment, is a target that does not exist."""

    def __init__(self, base_url: str, timeout: float = 1.0) -> None:
        self._base = base_url.rstrip("/")
        self._timeout = timeout
        # One long-lived client: creating one costs ~25 ms (its TLS context), per proposal.
        self._client = httpx.Client(timeout=timeout)

    def _describe(self, target: Target) -> tuple[bool | None, dict[str, Any] | None]:
        """(exists, the service's description when it does)."""
        try:
            response = self._client.get(f"{self._base}/services/{target.name}")
            if response.status_code == 404:
                return False, None
            if response.status_code != 200:
                return None, None
            body = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            log.warning("inventory: cannot look up %s: %s", target.key, exc)
            return None, None
        if not isinstance(body, dict) or "environment" not in body:
            return None, None
        if body["environment"] != target.environment:
            return False, None
        return True, body

    def current_replicas(self, target: Target) -> int | None:
        _, body = self._describe(target)
        replicas = None if body is None else body.get("replicas")
        return replicas if isinstance(replicas, int) and not isinstance(replicas, bool) else None

    def exists(self, target: Target) -> bool | None:
        return self._describe(target)[0]


class EstateInventory:
    """The estate's evidence: replicas from Prometheus (``kube_deployment_spec_replicas``,
    or the estate's own query), existence from its catalogue only. Telemetry that stops is
    not proof that a service is gone (a scrape target down looks the same), so without a
    catalogue whether a target exists stays unknown."""

    def __init__(self, evidence: PrometheusEvidence) -> None:
        self._evidence = evidence

    def current_replicas(self, target: Target) -> int | None:
        try:
            return self._evidence.replicas(target.environment, target.name)
        except EvidenceUnavailable as exc:
            log.warning("inventory: no replica count for %s: %s", target.key, exc)
            return None

    def exists(self, target: Target) -> bool | None:
        catalogue = self._evidence.catalogue
        if not len(catalogue):
            return None
        return catalogue.get(target.environment, target.name) is not None


def kubernetes_client(
    settings: EvidenceSettings, setting: str, *, timeout: float
) -> tuple[KubernetesApi, dict[str, str]]:
    """The API server's client with the policy service's token, and the map from environment
    to namespace the executor acts by; ``setting`` (what asked for them) is named when the
    map is missing or the token cannot be read."""
    if not settings.kubernetes_namespaces:
        raise ValueError(
            f"{setting} needs FLOTILLA_KUBERNETES_NAMESPACES: which namespace holds each environment's "
            'Deployments, as the executor has it (e.g. {"production": "apps"})'
        )
    return settings.kubernetes_api(setting, timeout=timeout), dict(settings.kubernetes_namespaces)


class KubernetesInventory:
    """The API server's word: ``spec.replicas`` of the Deployment named after the service,
    in the namespace its environment maps to (``FLOTILLA_KUBERNETES_NAMESPACES``, the map
    the executor acts by), read with the policy service's own token (``get deployments``
    there, nothing else: overlays/production/policy-rbac.yaml). The client is the one the
    diagnostic agent reads Deployments with (flotilla_evidence.kubernetes.KubernetesApi).

    A Deployment the API server says is not there (404) does not exist, whatever telemetry
    says: the executor could not act on it. An environment the map does not place, or an
    API server that refuses or does not answer: the count is unknown (a person decides;
    never Prometheus' figure instead), and whether it exists is the catalogue's to say."""

    def __init__(self, api: KubernetesApi, namespaces: Mapping[str, str], catalogue: Catalogue | None = None) -> None:
        self._api = api
        self._namespaces = dict(namespaces)
        self._catalogue = catalogue

    @classmethod
    def from_settings(cls, settings: EvidenceSettings, *, timeout: float) -> KubernetesInventory:
        api, namespaces = kubernetes_client(settings, "FLOTILLA_POLICY_INVENTORY=kubernetes", timeout=timeout)
        return cls(api, namespaces, settings.catalogue())

    def _deployment(self, target: Target) -> tuple[bool | None, dict[str, Any] | None]:
        """(exists, the Deployment when it does); (None, None) when the API server cannot say."""
        namespace = self._namespaces.get(target.environment)
        if namespace is None:
            return None, None
        path = f"/apis/apps/v1/namespaces/{quote(namespace, safe='')}/deployments/{quote(target.name, safe='')}"
        try:
            found = self._api.get(path)
        except EvidenceUnavailable as exc:
            log.warning("inventory: no replica count for %s from the API server: %s", target.key, exc)
            return None, None
        return found is not None, found

    def current_replicas(self, target: Target) -> int | None:
        _, found = self._deployment(target)
        replicas = None if found is None else found.get("spec", {}).get("replicas")
        return replicas if isinstance(replicas, int) and not isinstance(replicas, bool) else None

    def exists(self, target: Target) -> bool | None:
        known, _ = self._deployment(target)
        if known is not None:
            return known
        if self._catalogue is None or not len(self._catalogue):
            return None
        return self._catalogue.get(target.environment, target.name) is not None


def missing(inventory: Inventory, targets: tuple[Target, ...]) -> list[Target]:
    """The targets the platform definitely does not have (an unanswered look-up is not one)."""
    return [t for t in targets if inventory.exists(t) is False]
