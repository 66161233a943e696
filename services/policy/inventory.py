"""What the platform says about a target: whether it exists, and how many replicas run.

The 2x rule compares a scale command's target with what runs now. The proposal cannot
be trusted for that number (a model could understate it to slip under the limit), so
the policy service asks the platform itself: the sim's API locally (the sim is the
executor's target there: its own word on its replicas), the estate's Prometheus
(kube-state-metrics) and catalogue in production, a static table in tests. An unknown
count never guesses: the guard ``unknown-capacity-needs-human`` then asks a person.

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

import httpx
from flotilla_evidence import EvidenceUnavailable, PrometheusEvidence

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


def missing(inventory: Inventory, targets: tuple[Target, ...]) -> list[Target]:
    """The targets the platform definitely does not have (an unanswered look-up is not one)."""
    return [t for t in targets if inventory.exists(t) is False]
