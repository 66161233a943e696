"""Where the running replica count of a service comes from.

The 2x rule compares a scale command's target with what runs now. The proposal cannot
be trusted for that number (a model could understate it to slip under the limit), so
the policy service asks the platform itself: the sim's API locally, a static table in
tests. An unknown count never guesses: the guard ``unknown-capacity-needs-human`` then
asks a person.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Protocol

import httpx

from services.policy.decide import Target

log = logging.getLogger(__name__)


class Inventory(Protocol):
    def current_replicas(self, target: Target) -> int | None:
        """Replicas running now, or None when unknown."""
        ...


class NoInventory:
    def current_replicas(self, target: Target) -> int | None:
        return None


class StaticInventory:
    """Replica counts by ``<environment>/<name>`` (tests, fixed environments)."""

    def __init__(self, replicas: Mapping[str, int]) -> None:
        self._replicas = dict(replicas)

    def current_replicas(self, target: Target) -> int | None:
        return self._replicas.get(target.key)


class SimInventory:
    """``GET {sim}/services/{name}``: its ``replicas`` when its environment matches."""

    def __init__(self, base_url: str, timeout: float = 1.0) -> None:
        self._base = base_url.rstrip("/")
        self._timeout = timeout
        # One long-lived client: creating one costs ~25 ms (its TLS context), per proposal.
        self._client = httpx.Client(timeout=timeout)

    def current_replicas(self, target: Target) -> int | None:
        try:
            response = self._client.get(f"{self._base}/services/{target.name}")
            if response.status_code != 200:
                return None
            body = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            log.warning("inventory: no replica count for %s: %s", target.key, exc)
            return None
        if not isinstance(body, dict) or body.get("environment") != target.environment:
            return None
        replicas = body.get("replicas")
        return replicas if isinstance(replicas, int) and not isinstance(replicas, bool) else None
