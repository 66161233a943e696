"""The executor's actions on a Deployment, through the Kubernetes API.

What each action writes, and every check before it, is planned by
:func:`flotilla.actions.kubernetes.planned_write`, the one function the policy service's
preview uses too (so what a person is shown is what is written). This target adds what
only the executor has: the fencing token, the record of the result, the resourceVersion
precondition, and, when the command carries the change a person approved, a dry run of the
exact write that must show that change before the write is sent.
"""

from __future__ import annotations

import json
import logging
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar
from urllib.parse import quote

import httpx

from flotilla.actions.kubernetes import NO_WRITE, WRITES, PlannedWrite, Refused, checked, planned_write
from services.executor.namespaces import EnvironmentNamespaces, OutsideTheMap, Placement
from services.executor.targets.base import (
    ActionResult,
    StaleFencingToken,
    TargetRejected,
    TargetUnavailable,
    failure,
    now_ms,
)

log = logging.getLogger(__name__)


def _shown(value: Any) -> str:
    return ", ".join(map(str, value)) or "(none)" if isinstance(value, list) else str(value)


class _Conflict(Exception):
    """409 from the API server: the object changed since it was read."""


@dataclass(frozen=True)
class Step:
    """One attempt at one action: the Deployment as read, and the checked params."""

    action: str
    place: Placement
    deployment: dict[str, Any]
    params: Mapping[str, Any]
    key: str
    token: int
    started: float

    @property
    def annotations(self) -> dict[str, str]:
        annotations: dict[str, str] = self.deployment["metadata"].get("annotations") or {}
        return annotations

    @property
    def resource_version(self) -> str:
        return str(self.deployment["metadata"]["resourceVersion"])


class KubernetesTarget:
    """Act on a Deployment through the Kubernetes API: :data:`WRITES` lists the actions,
    :func:`flotilla.actions.kubernetes.planned_write` plans each (its checks and its patch).

    Idempotency and fencing live on the Deployment itself, in annotations, so they hold
    whichever executor process acts:

    - ``flotilla.dev/fencing-token``: the newest token that has acted on the Deployment;
    - ``flotilla.dev/last-idempotency-key``: the key of the last action applied;
    - ``flotilla.dev/actions``: the results of the last ``HISTORY`` actions (JSON), which
      replays and ``lookup`` read.

    Every write carries the ``resourceVersion`` it was based on, so the API server
    refuses it (409) if anyone wrote in between; the target then reads again, and a
    newer token found there means this holder is stale.

    - ``restart``, ``pause``, ``rollback`` and ``raise-memory`` change the Deployment
      itself, so each is ONE write that carries the change, the token and the record: no
      window between acting and recording. Restart sets the pod template annotation
      ``kubectl.kubernetes.io/restartedAt`` (as ``kubectl rollout restart``); pause sets
      ``spec.paused``; raise-memory one container's ``resources.limits.memory``;
      rollback replaces the whole pod template (a JSON Patch ``replace`` of
      ``/spec/template``, so labels, annotations and env of the newer template do not
      survive, as a merge patch would let them).
    - ``scale`` goes through the ``scale`` subresource and ``raise-ceiling`` writes an
      autoscaler, so each takes three writes: the token is raised on the Deployment
      first (the claim), then the other object is written, then the result is recorded
      on the Deployment. The scale shares the Deployment's resourceVersion, so a stale
      holder's scale always conflicts. An autoscaler has its own: its write carries the
      autoscaler's resourceVersion as read before the claim, so a newer holder that
      *wrote* it in between makes the older one's write conflict, read again and find
      itself stale. The token and the record stay on the Deployment (not the
      autoscaler) because the resource the commands, leases and ``lookup`` name is the
      Deployment: one place per resource holds its newest token and its history, whatever
      object an action writes. What is left: a newer holder that has claimed the
      Deployment but not yet written the autoscaler can still be overtaken by the older
      one's autoscaler write; the newer then finds the ceiling changed since its plan and
      is refused (a person decides), so nothing is applied twice. A crash between acting
      and recording leaves the key unrecorded; a retry with the same key sets the same
      absolute replica count again (scale), or finds the ceiling already at the wanted
      value and records it without writing again (raise-ceiling: its ``before`` is then
      the plan's "from" value, which the target can no longer read; a person who set
      the same value meanwhile is indistinguishable from the lost write).

    A resource ``<environment>/<name>`` (the commands-topic key) names the Deployment
    ``<name>`` in the namespace configured for ``<environment>``
    (:class:`~services.executor.namespaces.EnvironmentNamespaces`), and only there. A
    resource without an environment, or of an environment the target does not serve, is
    refused before any call to the API server. A recorded result counts only where it
    belongs: on the Deployment of its own resource, in its own environment's namespace,
    so a record left (or forged) on production's Deployment for ``dev/<name>`` is never
    taken as ``production/<name>``'s, nor the other way round.

    Refused (:class:`TargetRejected`, with the reason): failover ("fail a dependency over"
    is application or mesh configuration Kubernetes knows nothing about); a rollback whose
    Deployment no longer runs the "from" revision, whose "to" revision is gone, not owned
    by the Deployment (by owner uid: labels are never trusted) or not the template the
    plan names, that an annotation ``flotilla.dev/rollback-forbidden`` forbids, or whose
    Deployment is paused (as ``kubectl rollout undo``: the template would wait unrolled);
    a raise whose current value is not its "from" value, above twice it or above the
    declared maximum (``flotilla.dev/max-replicas-ceiling`` on the autoscaler,
    ``flotilla.dev/max-memory-limit`` on the Deployment), or of an autoscaler that does not
    scale this Deployment.
    """

    TOKEN = "flotilla.dev/fencing-token"
    LAST_KEY = "flotilla.dev/last-idempotency-key"
    ACTIONS = "flotilla.dev/actions"
    RESTARTED_AT = "kubectl.kubernetes.io/restartedAt"
    HISTORY = 20
    MERGE_PATCH = "application/merge-patch+json"
    JSON_PATCH = "application/json-patch+json"

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
        expected_change: str | None = None,
    ) -> ActionResult:
        """``expected_change``: the digest of the change a person approved (the command's
        signed ``expectedChange``). When set, the write is first sent with ``dryRun=All``
        and refused unless the API server's answer shows exactly that change."""
        if action in NO_WRITE:
            raise TargetRejected(f"{action} is not supported on Kubernetes: {NO_WRITE[action]}")
        if action not in self.WRITES:
            raise TargetRejected(f"unknown action {action!r}: Kubernetes does {', '.join(self.WRITES)}")
        try:
            params = checked(action, params)  # before any call to the API server
        except Refused as exc:
            raise TargetRejected(str(exc)) from None
        place = self._place(resource)
        started = time.monotonic()
        for _ in range(self.conflict_retries):
            deployment = self._get_deployment(place)
            annotations: dict[str, str] = deployment.get("metadata", {}).get("annotations") or {}
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
            step = Step(action, place, deployment, params, idempotency_key, fencing_token, started)
            try:
                write = planned_write(action, params, namespace=place.namespace, deployment=deployment, read=self._read)
            except Refused as exc:
                raise TargetRejected(str(exc), exc.status) from None
            if write is None:  # not reached: WRITES are the actions with a write
                raise TargetRejected(f"{action} makes no write on Kubernetes")
            try:
                return self._act(step, write, expected_change)
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

    # -- the write -------------------------------------------------------------------

    WRITES: ClassVar[tuple[str, ...]] = WRITES  # the actions with a write (the planning module's)

    def _act(self, step: Step, write: PlannedWrite, expected_change: str | None) -> ActionResult:
        """One attempt: the planned write with the token, the record and the
        resourceVersion it was based on; a 409 (``_Conflict``) makes the caller read again
        and plan from the top."""
        result = self._result(step, dict(write.before), dict(write.after))
        if write.path == self._deployment_url(step.place):
            # The Deployment itself: ONE write carries the change, the token and the record.
            body = self._with_record(step, write, result)
            self._check_change(step, write, body, expected_change)
            self._send(step, write, body)
            return result
        # Another object (the scale subresource, an autoscaler): claim, write, record.
        self._check_change(step, write, self._on_version(write, write.resource_version), expected_change)
        claimed = self._claim(step)
        if not write.done:
            shares = write.path == self._deployment_url(step.place) + "/scale"  # the Deployment's version
            version = claimed["metadata"]["resourceVersion"] if shares else write.resource_version
            self._send(step, write, self._on_version(write, version))
        self._record(step.place, result)
        return result

    def _check_change(self, step: Step, write: PlannedWrite, body: Any, expected: str | None) -> None:
        """The write, with ``dryRun=All``: refused unless the API server's answer is the
        change a person approved (nothing is persisted either way)."""
        if expected is None:
            return
        answer = self._call(
            write.method,
            write.path,
            what=f"dry run of {step.action} {step.place.deployment}",
            params={"dryRun": "All"},
            content=json.dumps(body),
            headers={"Content-Type": write.content_type},
        ).json()
        change = write.change(answer)
        if change.digest != expected:
            now = "; ".join(f"{k}: {_shown(v)}" for k, v in sorted(change.after.items()) if change.before.get(k) == v)
            raise TargetRejected(
                f"the change differs from what was approved: {'; '.join(change.lines())} (and unchanged: {now}); "
                f"approved {expected}, the dry run now gives {change.digest}: a person decides again"
            )

    def _with_record(self, step: Step, write: PlannedWrite, result: ActionResult) -> Any:
        """The planned write of the Deployment with the token, the record and the
        resourceVersion it was based on (the API server refuses it, 409, if the Deployment
        changed since)."""
        annotations = self._record_annotations(step, result)
        if write.content_type == self.JSON_PATCH:
            # The annotations are written whole (``add`` replaces the map), which the
            # resourceVersion precondition makes safe.
            return [
                {"op": "replace", "path": "/metadata/resourceVersion", "value": step.resource_version},
                *write.body,
                {"op": "add", "path": "/metadata/annotations", "value": {**step.annotations, **annotations}},
            ]
        return {**write.body, "metadata": {"resourceVersion": step.resource_version, "annotations": annotations}}

    @staticmethod
    def _on_version(write: PlannedWrite, version: str) -> dict[str, Any]:
        body: dict[str, Any] = write.body
        return {**body, "metadata": {"resourceVersion": version}}

    def _send(self, step: Step, write: PlannedWrite, body: Any) -> None:
        self._call(
            write.method,
            write.path,
            what=f"{step.action} {step.place.deployment}",
            content=json.dumps(body),
            headers={"Content-Type": write.content_type},
        )

    # -- writes --------------------------------------------------------------------

    def _claim(self, step: Step) -> dict[str, Any]:
        """Raise the token on the Deployment, on the resourceVersion read: the first of the
        three writes of an action on another object (see the class)."""
        return self._patch(
            self._deployment_url(step.place),
            {"metadata": {"resourceVersion": step.resource_version, "annotations": {self.TOKEN: str(step.token)}}},
            what=f"claim {step.place.deployment}",
        )

    def _record_annotations(self, step: Step, result: ActionResult) -> dict[str, str]:
        return {self.TOKEN: str(step.token), **self._recorded(step.annotations, result)}

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
    def _result(step: Step, before: dict[str, Any], after: dict[str, Any]) -> ActionResult:
        return ActionResult(
            idempotency_key=step.key,
            action=step.action,
            resource=step.place.resource,
            status="applied",
            before=before,
            after=after,
            applied_at=now_ms(),
            replayed=False,
            duration_ms=round((time.monotonic() - step.started) * 1000),
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

    def _read(self, path: str, **params: str) -> dict[str, Any] | None:
        """What the planner reads besides the Deployment (ReplicaSets, an autoscaler);
        None for a 404."""
        try:
            response = self._call("GET", path, what=f"get {path}", params=params or None)
        except TargetRejected as exc:
            if exc.status == 404:
                return None
            raise
        body: dict[str, Any] = response.json()
        return body

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
            raise failure(response, what)
        return response
