"""A typed client for the fleet's HTTP APIs (policy approvals, audit, DLQ, executor).

One place knows the paths, the auth headers and how a refusal looks, so the CLI and
the web console cannot drift apart. Every non-2xx answer becomes a
:class:`FleetApiError` carrying the status and the service's own explanation; a
service that cannot be reached becomes one too (status 0), naming the URL.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import httpx
from pydantic_settings import BaseSettings, SettingsConfigDict

from flotilla.fleet import AUDIT, DLQ_RECONCILER, EXECUTOR, POLICY, SIM, url


class FleetEndpoints(BaseSettings):
    """Where each service answers: ``FLOTILLA_POLICY_URL`` and friends (compose and
    Kubernetes set them to service names; the defaults are the local fleet)."""

    model_config = SettingsConfigDict(env_prefix="FLOTILLA_", extra="ignore")

    policy_url: str = url(POLICY)
    audit_url: str = url(AUDIT)
    dlq_url: str = url(DLQ_RECONCILER)
    executor_url: str = url(EXECUTOR)
    sim_url: str = url(SIM)

    def service_of(self, target: str) -> str:
        """Which service a URL (a :attr:`FleetApiError.url`) belongs to, in words."""
        names = (
            (self.policy_url, "policy service"),
            (self.audit_url, "audit service"),
            (self.dlq_url, "DLQ reconciler"),
            (self.executor_url, "executor"),
            (self.sim_url, "sim"),
        )
        for base, name in names:
            if target.startswith(base.rstrip("/")):
                return name
        return target


class FleetApiError(Exception):
    """A refusal or failure from one of the fleet's services."""

    def __init__(self, status: int, detail: Any, url: str) -> None:
        self.status = status
        self.detail = detail
        self.url = url
        super().__init__(f"{status or 'unreachable'} from {url}: {_describe(detail)}")

    @property
    def message(self) -> str:
        return _describe(self.detail)


def _describe(detail: Any) -> str:
    """The human part of a FastAPI error body (``detail`` may be a string, a dict
    with ``error``, or a list of validation problems)."""
    if isinstance(detail, dict):
        if "detail" in detail:
            return _describe(detail["detail"])
        if "error" in detail:
            return str(detail["error"])
    if isinstance(detail, list):
        return "; ".join(_describe(d.get("msg", d)) if isinstance(d, dict) else str(d) for d in detail)
    return str(detail)


def person_label(user: str, roles: Sequence[str]) -> str:
    """How a person is shown, CLI and console alike: ``alice (approver)``."""
    return f"{user} ({', '.join(roles) or 'no roles'})"


def _segment(value: str) -> str:
    """``value`` as one path segment: every reserved character percent-encoded (``/``,
    ``?``, ``#``, ``%`` included), and the dot segments ``.`` and ``..`` too (a client
    would resolve them away), so an id a person typed or a record carried can never
    reach another path of the service."""
    if not value:
        raise ValueError("an empty path segment names nothing")
    quoted = quote(value, safe="")
    return quoted.replace(".", "%2E") if quoted.strip(".") == "" else quoted


def _bearer(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


class FleetApi:
    """Synchronous calls to the running fleet. Reuse one instance: it keeps one
    connection pool (a new HTTP client costs tens of milliseconds)."""

    def __init__(
        self,
        endpoints: FleetEndpoints | None = None,
        *,
        timeout: float = 10.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        """``transport`` replaces the network (tests pass an ``httpx.MockTransport``)."""
        self.endpoints = endpoints or FleetEndpoints()
        self._http = httpx.Client(timeout=timeout, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> FleetApi:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, base: str, path: str, *, token: str | None = None, **kwargs: Any) -> Any:
        target = f"{base.rstrip('/')}{path}"
        try:
            answer = self._http.request(method, target, headers=_bearer(token), **kwargs)
        except httpx.HTTPError as exc:
            raise FleetApiError(0, f"{type(exc).__name__}: {exc}", target) from exc
        try:
            body = answer.json()
        except ValueError:
            body = answer.text
        if answer.status_code >= 400:
            raise FleetApiError(answer.status_code, body, target)
        return body

    # policy service: approvals -------------------------------------------------
    def whoami(self, token: str) -> dict[str, Any]:
        """The person and roles the policy service maps ``token`` to (401 when none)."""
        found: dict[str, Any] = self._call("GET", self.endpoints.policy_url, "/me", token=token)
        return found

    def approvals(self, token: str, status: str = "pending") -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self._call(
            "GET", self.endpoints.policy_url, "/approvals", token=token, params={"status": status}
        )
        return found

    def approval(self, token: str, proposal_id: str) -> dict[str, Any]:
        found: dict[str, Any] = self._call(
            "GET", self.endpoints.policy_url, f"/approvals/{_segment(proposal_id)}", token=token
        )
        return found

    def decide(
        self,
        token: str,
        proposal_id: str,
        *,
        approve: bool,
        digest: str,
        reason: str | None = None,
        change_digest: str | None = None,
    ) -> dict[str, Any]:
        """Approve or reject ``proposal_id``; ``digest`` must be the one the person saw, and
        ``change_digest`` that of the changes they were shown (when the proposal has one)."""
        verb = "approve" if approve else "reject"
        body: dict[str, Any] = {"digest": digest}
        if change_digest is not None:
            body["changeDigest"] = change_digest
        if reason:
            body["reason"] = reason
        decided: dict[str, Any] = self._call(
            "POST", self.endpoints.policy_url, f"/approvals/{_segment(proposal_id)}/{verb}", token=token, json=body
        )
        return decided

    # audit ----------------------------------------------------------------------
    def incidents(self, limit: int = 200) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self._call(
            "GET", self.endpoints.audit_url, "/incidents", params={"limit": limit}
        )["incidents"]
        return found

    def timeline(self, incident_id: str, *, limit: int | None = None, after: int | None = None) -> dict[str, Any]:
        """One page of an incident's timeline: the records after log position ``after`` (at most
        ``limit``; the audit service's default page without it). ``page.nextAfter`` is the next
        page's ``after``, None on the last."""
        params = {name: value for name, value in (("limit", limit), ("after", after)) if value is not None}
        found: dict[str, Any] = self._call(
            "GET", self.endpoints.audit_url, f"/incidents/{_segment(incident_id)}/timeline", params=params
        )
        return found

    def verify_audit(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", self.endpoints.audit_url, "/verify")
        return result

    # DLQ reconciler ---------------------------------------------------------------
    def quarantine(self, **filters: str | int | None) -> list[dict[str, Any]]:
        """Quarantined dead letters; filters: status, reason, origin, incident, limit."""
        params = {k: v for k, v in filters.items() if v is not None}
        found: list[dict[str, Any]] = self._call("GET", self.endpoints.dlq_url, "/quarantine", params=params)["entries"]
        return found

    def quarantined(self, entry_id: str) -> dict[str, Any]:
        found: dict[str, Any] = self._call("GET", self.endpoints.dlq_url, f"/quarantine/{_segment(entry_id)}")
        return found

    def requeue(self, token: str, entry_id: str, value: dict[str, Any] | None = None) -> dict[str, Any]:
        """Re-queue a quarantined record to its origin, optionally with a sanitized value."""
        done: dict[str, Any] = self._call(
            "POST",
            self.endpoints.dlq_url,
            f"/quarantine/{_segment(entry_id)}/requeue",
            token=token,
            json={"value": value} if value is not None else {},
        )
        return done

    # executor ---------------------------------------------------------------------
    def execution(self, idempotency_key: str) -> dict[str, Any]:
        found: dict[str, Any] = self._call(
            "GET", self.endpoints.executor_url, f"/executions/{_segment(idempotency_key)}"
        )
        return found

    def leases(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self._call("GET", self.endpoints.executor_url, "/leases")
        return found
