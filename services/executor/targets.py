"""Where the executor's actions land: the sim, or a Deployment in Kubernetes.

Both targets do the two things the executor relies on *at the target*, not only in its
own database:

- an idempotency key: applying the same key twice has one effect, and the second call
  returns the first result marked ``replayed``; ``lookup`` answers "did this key apply?"
  after a crash between acting and recording;
- a fencing token (the executor's lease epoch for the resource): the target remembers
  the newest token it has seen per resource and refuses a lower one, so an executor
  that was paused while its lease moved on cannot act.

Errors say what the caller may do next: :class:`StaleFencingToken` (stop; a newer
holder owns the resource), :class:`TargetRejected` (this request will never succeed),
:class:`TargetUnavailable` (try again with the *same* key: the action may or may not
have been applied, and a retry or ``lookup`` tells which).
"""

from __future__ import annotations

import json
import logging
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol, runtime_checkable
from urllib.parse import quote

import httpx

from services.executor.namespaces import EnvironmentNamespaces, OutsideTheMap, Placement

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ActionResult:
    """What the target did for one idempotency key."""

    idempotency_key: str
    action: str
    resource: str
    status: str  # "applied"
    before: dict[str, Any]
    after: dict[str, Any]
    applied_at: datetime
    replayed: bool  # True: recorded earlier, nothing was done by this call
    duration_ms: int

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> ActionResult:
        """From the sim's wire shape (camelCase), which the Kubernetes target reuses."""
        return cls(
            idempotency_key=str(body["idempotencyKey"]),
            action=str(body["action"]),
            resource=str(body["resource"]),
            status=str(body["status"]),
            before=dict(body["before"]),
            after=dict(body["after"]),
            applied_at=datetime.fromisoformat(str(body["appliedAt"])),
            replayed=bool(body["replayed"]),
            duration_ms=int(body["durationMs"]),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "idempotencyKey": self.idempotency_key,
            "action": self.action,
            "resource": self.resource,
            "status": self.status,
            "before": self.before,
            "after": self.after,
            "appliedAt": self.applied_at.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "replayed": self.replayed,
            "durationMs": self.duration_ms,
        }


class TargetError(Exception):
    retryable = False


class StaleFencingToken(TargetError):
    """The target has seen a newer fencing token for the resource; nothing was applied."""

    def __init__(self, token: int, newest: int) -> None:
        super().__init__(f"fencing token {token} is stale: the target has seen {newest}")
        self.token = token
        self.newest = newest


class TargetRejected(TargetError):
    """The target refused the request as such (unknown resource, bad params, an action it
    cannot do); retrying it unchanged cannot succeed."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class TargetUnavailable(TargetError):
    """The target could not be reached or failed (network, timeout, 5xx, 429). The action
    may have been applied; retry with the same idempotency key or ``lookup`` it."""

    retryable = True


@runtime_checkable
class ActionTarget(Protocol):
    def apply(
        self,
        action: str,
        resource: str,
        params: Mapping[str, Any],
        idempotency_key: str,
        fencing_token: int,
        holder: str,
    ) -> ActionResult: ...

    def lookup(self, idempotency_key: str) -> ActionResult | None: ...


def _message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:200] or response.reason_phrase
    if isinstance(body, dict):
        return str(body.get("error") or body.get("message") or body)
    return str(body)


def _failure(response: httpx.Response, what: str) -> TargetError:
    """The exception for a non-2xx answer other than the caller's special cases."""
    message = f"{what}: HTTP {response.status_code}: {_message(response)}"
    if response.status_code >= 500 or response.status_code in (408, 429):
        return TargetUnavailable(message)
    return TargetRejected(message, response.status_code)


def _now() -> datetime:
    """Now, to the millisecond: what the recorded (JSON) result can hold, so a result
    and its replay compare equal."""
    now = datetime.now(UTC)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


class SimTarget:
    """The sim's ``/actions`` API (see docs/design/fleet-contracts.md).

    The sim admits only the holder of its action token (``FLOTILLA_SIM_ACTION_TOKEN``),
    sent as a bearer token with every call; a wrong one is refused (401), which is a
    :class:`TargetRejected`: retrying cannot fix configuration.
    """

    def __init__(
        self,
        base_url: str,
        action_token: str,
        timeout: float = 5.0,
        *,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if not action_token:
            raise ValueError("the sim's action token is required: the sim refuses actions without it")
        self._client = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {action_token}"},
            timeout=timeout,
            transport=transport,
        )

    def apply(
        self,
        action: str,
        resource: str,
        params: Mapping[str, Any],
        idempotency_key: str,
        fencing_token: int,
        holder: str,
    ) -> ActionResult:
        body = {
            "resource": resource,
            "params": dict(params),
            "idempotencyKey": idempotency_key,
            "fencingToken": fencing_token,
            "holder": holder,
        }
        response = self._request("POST", f"/actions/{quote(action, safe='')}", json=body)
        if response.status_code == 409:
            detail = response.json()
            raise StaleFencingToken(int(detail.get("fencingToken", fencing_token)), int(detail["newestToken"]))
        if response.status_code != 200:
            raise _failure(response, f"{action} {resource}")
        return self._result(response)

    def lookup(self, idempotency_key: str) -> ActionResult | None:
        response = self._request("GET", f"/actions/{quote(idempotency_key, safe='')}")
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise _failure(response, f"lookup {idempotency_key}")
        return self._result(response)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> SimTarget:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._client.request(method, url, **kwargs)
        except httpx.TransportError as exc:
            raise TargetUnavailable(f"sim unreachable: {exc!r}") from exc

    @staticmethod
    def _result(response: httpx.Response) -> ActionResult:
        try:
            return ActionResult.from_json(response.json())
        except (ValueError, KeyError, TypeError) as exc:
            # the action may have been applied: a retry with the same key tells
            raise TargetUnavailable(f"unreadable answer from the sim: {response.text[:200]!r}") from exc


class _Conflict(Exception):
    """409 from the API server: the Deployment changed since it was read."""


class KubernetesTarget:
    """Scale or restart a Deployment through the Kubernetes API (apps/v1).

    Idempotency and fencing live on the Deployment itself, in annotations, so they hold
    whichever executor process acts:

    - ``flotilla.dev/fencing-token``: the newest token that has acted on the Deployment;
    - ``flotilla.dev/last-idempotency-key``: the key of the last action applied;
    - ``flotilla.dev/actions``: the results of the last ``HISTORY`` actions (JSON), which
      replays and ``lookup`` read.

    Every write carries the ``resourceVersion`` it was based on, so the API server
    refuses it (409) if anyone wrote in between; the target then reads again, and a
    newer token found there means this holder is stale. Scaling goes through the
    ``scale`` subresource, so it takes two writes: first the token is raised on the
    Deployment (the claim), then the scale is patched on the resourceVersion the claim
    produced, so a stale holder's scale always conflicts. The result is recorded last: a
    crash between scaling and recording leaves the key unrecorded, and a retry sets the
    same absolute replica count again, which changes nothing. A restart is one write
    (pod template annotation ``kubectl.kubernetes.io/restartedAt``, as ``kubectl rollout
    restart`` does, plus the annotations), so it has no such window.

    A resource ``<environment>/<name>`` (the commands-topic key) names the Deployment
    ``<name>`` in the namespace configured for ``<environment>``
    (:class:`~services.executor.namespaces.EnvironmentNamespaces`), and only there. A
    resource without an environment, or of an environment the target does not serve, is
    refused before any call to the API server. A recorded result counts only where it
    belongs: on the Deployment of its own resource, in its own environment's namespace,
    so a record left (or forged) on production's Deployment for ``dev/<name>`` is never
    taken as ``production/<name>``'s, nor the other way round.

    Rollback and failover are refused (:class:`TargetRejected`): apps/v1 has no rollback
    call (``kubectl rollout undo`` copies an old ReplicaSet's pod template client-side,
    which would need the ReplicaSet history read and trusted), and "fail a dependency
    over" is application or mesh configuration Kubernetes knows nothing about.
    """

    TOKEN = "flotilla.dev/fencing-token"
    LAST_KEY = "flotilla.dev/last-idempotency-key"
    ACTIONS = "flotilla.dev/actions"
    RESTARTED_AT = "kubectl.kubernetes.io/restartedAt"
    HISTORY = 20
    MERGE_PATCH = "application/merge-patch+json"

    def __init__(
        self,
        api_url: str,
        token: str,
        namespaces: Mapping[str, str],
        verify: bool | str | ssl.SSLContext = True,
        *,
        timeout: float = 10.0,
        conflict_retries: int = 5,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if isinstance(verify, str):
            verify = ssl.create_default_context(cafile=verify)
        self.namespaces = (
            namespaces if isinstance(namespaces, EnvironmentNamespaces) else EnvironmentNamespaces(namespaces)
        )
        self.conflict_retries = conflict_retries
        self._client = httpx.Client(
            base_url=api_url.rstrip("/"),
            headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
            verify=verify,
            timeout=timeout,
            transport=transport,
        )

    # -- ActionTarget --------------------------------------------------------------

    def apply(
        self,
        action: str,
        resource: str,
        params: Mapping[str, Any],
        idempotency_key: str,
        fencing_token: int,
        holder: str,
    ) -> ActionResult:
        if action in ("rollback", "failover"):
            raise TargetRejected(
                f"{action} is not supported on Kubernetes: "
                + (
                    "apps/v1 has no rollback call; kubectl rollout undo rewrites the pod template client-side"
                    if action == "rollback"
                    else "a dependency's failover target is application or mesh configuration, not a Deployment"
                )
            )
        if action == "scale":
            replicas = params.get("replicas")
            if set(params) != {"replicas"} or not isinstance(replicas, int) or isinstance(replicas, bool):
                raise TargetRejected(f"scale takes params {{'replicas': int}}, got {dict(params)!r}")
            if replicas < 0:
                raise TargetRejected(f"replicas must not be negative, got {replicas}")
        elif action == "restart":
            if set(params) != {"rolling"} or not isinstance(params["rolling"], bool):
                raise TargetRejected(f"restart takes params {{'rolling': bool}}, got {dict(params)!r}")
            if not params["rolling"]:
                raise TargetRejected(
                    "restart with rolling=false is not supported: a Deployment restarts per its rollout strategy"
                )
        else:
            raise TargetRejected(f"unknown action {action!r}")

        place = self._place(resource)
        started = time.monotonic()
        for _ in range(self.conflict_retries):
            deployment = self._get_deployment(place)
            meta = deployment.get("metadata", {})
            annotations: dict[str, str] = meta.get("annotations") or {}
            recorded = self._find(annotations, idempotency_key)
            if recorded is not None:
                if recorded.get("resource") != resource:
                    raise TargetRejected(
                        f"idempotency key {idempotency_key!r} is recorded on {place.deployment} "
                        f"for {recorded.get('resource')!r}, not {resource!r}: a key names one action on one resource"
                    )
                return ActionResult.from_json({**recorded, "replayed": True})
            newest = int(annotations.get(self.TOKEN, "0"))
            if fencing_token < newest:
                raise StaleFencingToken(fencing_token, newest)
            try:
                if action == "scale":
                    return self._scale(deployment, place, params, idempotency_key, fencing_token, started)
                return self._restart(deployment, place, idempotency_key, fencing_token, started)
            except _Conflict:
                continue  # someone wrote in between: read again (a newer token there makes us stale)
        raise TargetUnavailable(
            f"{action} {resource}: the Deployment kept changing ({self.conflict_retries} conflicts)"
        )

    def lookup(self, idempotency_key: str) -> ActionResult | None:
        """Search the served namespaces' Deployments for the key's recorded result.

        A record counts only on the Deployment of its own resource in its environment's
        namespace: one found elsewhere (a ``dev/<name>`` result on production's
        Deployment, from a target that ignored environments, or written by hand) says
        nothing about whether the key applied here, and is skipped with a warning.
        """
        for environment, namespace in self.namespaces.items():
            listing = self._call("GET", self._deployments_url(namespace), what=f"list deployments in {namespace}")
            for item in listing.json().get("items", []):
                meta = item.get("metadata", {})
                recorded = self._find(meta.get("annotations") or {}, idempotency_key)
                if recorded is None:
                    continue
                belongs = f"{environment}/{meta.get('name')}"
                if recorded.get("resource") != belongs:
                    log.warning(
                        "ignoring the record of %s on %s/%s: it is for %r, and only %r can be recorded there",
                        idempotency_key,
                        namespace,
                        meta.get("name"),
                        recorded.get("resource"),
                        belongs,
                    )
                    continue
                return ActionResult.from_json({**recorded, "replayed": False})
        return None

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> KubernetesTarget:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the two actions -----------------------------------------------------------

    def _scale(
        self,
        deployment: dict[str, Any],
        place: Placement,
        params: Mapping[str, Any],
        key: str,
        token: int,
        started: float,
    ) -> ActionResult:
        before = {"replicas": int(deployment.get("spec", {}).get("replicas", 1))}
        claimed = self._patch(
            self._deployment_url(place),
            {
                "metadata": {
                    "resourceVersion": deployment["metadata"]["resourceVersion"],
                    "annotations": {self.TOKEN: str(token)},
                }
            },
            what=f"claim {place.deployment}",
        )
        scaled = self._patch(
            self._deployment_url(place) + "/scale",
            {
                "metadata": {"resourceVersion": claimed["metadata"]["resourceVersion"]},
                "spec": {"replicas": params["replicas"]},
            },
            what=f"scale {place.deployment}",
        )
        after = {"replicas": int(scaled.get("spec", {}).get("replicas", params["replicas"]))}
        result = self._result(key, "scale", place.resource, before, after, started)
        self._record(place, result)
        return result

    def _restart(
        self, deployment: dict[str, Any], place: Placement, key: str, token: int, started: float
    ) -> ActionResult:
        template_annotations = (
            deployment.get("spec", {}).get("template", {}).get("metadata", {}).get("annotations") or {}
        )
        now = _now().isoformat(timespec="seconds").replace("+00:00", "Z")
        before = {"restartedAt": template_annotations.get(self.RESTARTED_AT)}
        result = self._result(key, "restart", place.resource, before, {"restartedAt": now}, started)
        annotations = deployment["metadata"].get("annotations") or {}
        self._patch(
            self._deployment_url(place),
            {
                "metadata": {
                    "resourceVersion": deployment["metadata"]["resourceVersion"],
                    "annotations": {self.TOKEN: str(token), **self._recorded(annotations, result)},
                },
                "spec": {"template": {"metadata": {"annotations": {self.RESTARTED_AT: now}}}},
            },
            what=f"restart {place.deployment}",
        )
        return result

    # -- the record in the annotations ---------------------------------------------

    @classmethod
    def _history(cls, annotations: Mapping[str, str]) -> list[dict[str, Any]]:
        try:
            history = json.loads(annotations.get(cls.ACTIONS, "[]"))
        except ValueError:
            return []
        return [h for h in history if isinstance(h, dict)] if isinstance(history, list) else []

    @classmethod
    def _find(cls, annotations: Mapping[str, str], key: str) -> dict[str, Any] | None:
        return next((h for h in cls._history(annotations) if h.get("idempotencyKey") == key), None)

    @classmethod
    def _recorded(cls, annotations: Mapping[str, str], result: ActionResult) -> dict[str, str]:
        """The annotations that record ``result`` on top of what is there."""
        history = [h for h in cls._history(annotations) if h.get("idempotencyKey") != result.idempotency_key]
        history.append(result.to_json())
        return {
            cls.LAST_KEY: result.idempotency_key,
            cls.ACTIONS: json.dumps(history[-cls.HISTORY :], separators=(",", ":")),
        }

    def _record(self, place: Placement, result: ActionResult) -> None:
        """Record an applied result; it happened, so conflicts are retried, not fenced."""
        for _ in range(self.conflict_retries * 2):
            deployment = self._get_deployment(place)
            meta = deployment["metadata"]
            try:
                self._patch(
                    self._deployment_url(place),
                    {
                        "metadata": {
                            "resourceVersion": meta["resourceVersion"],
                            "annotations": self._recorded(meta.get("annotations") or {}, result),
                        }
                    },
                    what=f"record {result.idempotency_key} on {place.deployment}",
                )
                return
            except _Conflict:
                continue
        raise TargetUnavailable(
            f"{result.action} of {place.deployment} applied but not recorded (the Deployment kept changing)"
        )

    @staticmethod
    def _result(
        key: str, action: str, resource: str, before: dict[str, Any], after: dict[str, Any], started: float
    ) -> ActionResult:
        return ActionResult(
            idempotency_key=key,
            action=action,
            resource=resource,
            status="applied",
            before=before,
            after=after,
            applied_at=_now(),
            replayed=False,
            duration_ms=round((time.monotonic() - started) * 1000),
        )

    # -- HTTP ----------------------------------------------------------------------

    def _place(self, resource: str) -> Placement:
        try:
            return self.namespaces.place(resource)
        except OutsideTheMap as exc:
            raise TargetRejected(str(exc)) from None

    @staticmethod
    def _deployments_url(namespace: str) -> str:
        return f"/apis/apps/v1/namespaces/{quote(namespace, safe='')}/deployments"

    def _deployment_url(self, place: Placement) -> str:
        return f"{self._deployments_url(place.namespace)}/{quote(place.name, safe='')}"

    def _get_deployment(self, place: Placement) -> dict[str, Any]:
        what = f"get {place.deployment}"
        deployment: dict[str, Any] = self._call("GET", self._deployment_url(place), what=what).json()
        return deployment

    def _patch(self, url: str, patch: dict[str, Any], *, what: str) -> dict[str, Any]:
        response = self._call(
            "PATCH", url, what=what, content=json.dumps(patch), headers={"Content-Type": self.MERGE_PATCH}
        )
        body: dict[str, Any] = response.json()
        return body

    def _call(self, method: str, url: str, *, what: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._client.request(method, url, **kwargs)
        except httpx.TransportError as exc:
            raise TargetUnavailable(f"{what}: Kubernetes API unreachable: {exc!r}") from exc
        if response.status_code == 409:
            raise _Conflict(what)
        if not response.is_success:
            raise _failure(response, what)
        return response
