"""The executor's actions on a Deployment, through the Kubernetes API.

One entry per action in :data:`KubernetesTarget.HANDLERS`: the check of its params
(before any call to the API server) and the method that acts on the Deployment as read.
Adding an action is one check, one method and one row.
"""

from __future__ import annotations

import copy
import json
import logging
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar
from urllib.parse import quote

import httpx

from services.executor.namespaces import EnvironmentNamespaces, OutsideTheMap, Placement
from services.executor.targets.base import (
    ActionResult,
    StaleFencingToken,
    TargetRejected,
    TargetUnavailable,
    failure,
    now_ms,
)
from services.executor.targets.quantity import format_bytes, parse_bytes

log = logging.getLogger(__name__)

REVISION = "deployment.kubernetes.io/revision"
TEMPLATE_HASH = "pod-template-hash"
ROLLBACK_FORBIDDEN = "flotilla.dev/rollback-forbidden"
MAX_REPLICAS_CEILING = "flotilla.dev/max-replicas-ceiling"
MAX_MEMORY_LIMIT = "flotilla.dev/max-memory-limit"


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

    @property
    def template(self) -> dict[str, Any]:
        template: dict[str, Any] = self.deployment.get("spec", {}).get("template") or {}
        return template


@dataclass(frozen=True)
class Handler:
    """An action of the target: ``check`` refuses bad params before any call (and returns
    them normalised); ``act`` makes one attempt and raises ``_Conflict`` to read again."""

    check: Callable[[Mapping[str, Any]], dict[str, Any]]
    act: Callable[[KubernetesTarget, Step], ActionResult]


@dataclass(frozen=True)
class Autoscaler:
    """An autoscaler kind the target may raise: where it lives and its ceiling field."""

    api: str  # the group/version path, e.g. "/apis/autoscaling/v2"
    plural: str
    ceiling: str  # the spec field of the maximum
    default_ceiling: int | None  # the value when the field is absent (KEDA's documented default)
    default_target_kind: str | None  # scaleTargetRef.kind when absent

    def url(self, namespace: str, name: str) -> str:
        return f"{self.api}/namespaces/{quote(namespace, safe='')}/{self.plural}/{quote(name, safe='')}"


AUTOSCALERS = {
    "HorizontalPodAutoscaler": Autoscaler(
        "/apis/autoscaling/v2", "horizontalpodautoscalers", "maxReplicas", None, None
    ),
    "ScaledObject": Autoscaler("/apis/keda.sh/v1alpha1", "scaledobjects", "maxReplicaCount", 100, "Deployment"),
}


# -- the params of each action, checked before any call -------------------------------


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _takes(action: str, params: Mapping[str, Any], required: set[str], optional: frozenset[str] = frozenset()) -> None:
    if not required <= set(params) <= required | optional:
        fields = ", ".join(sorted(required)) + (f" (and optionally {', '.join(sorted(optional))})" if optional else "")
        raise TargetRejected(f"{action} takes params {fields}, got {dict(params)!r}")


def check_scale(params: Mapping[str, Any]) -> dict[str, Any]:
    replicas = params.get("replicas")
    if set(params) != {"replicas"} or not isinstance(replicas, int) or isinstance(replicas, bool):
        raise TargetRejected(f"scale takes params {{'replicas': int}}, got {dict(params)!r}")
    if replicas < 0:
        raise TargetRejected(f"replicas must not be negative, got {replicas}")
    return {"replicas": replicas}


def check_restart(params: Mapping[str, Any]) -> dict[str, Any]:
    if set(params) != {"rolling"} or not isinstance(params["rolling"], bool):
        raise TargetRejected(f"restart takes params {{'rolling': bool}}, got {dict(params)!r}")
    if not params["rolling"]:
        raise TargetRejected(
            "restart with rolling=false is not supported: a Deployment restarts per its rollout strategy"
        )
    return {"rolling": True}


def check_rollback(params: Mapping[str, Any]) -> dict[str, Any]:
    optional = frozenset({"fromRevision", "fromTemplateHash", "toTemplateHash", "fromImages", "toImages"})
    _takes("rollback", params, {"toRevision"}, optional)
    if params.get("fromRevision") is None:
        raise TargetRejected(
            "a rollback must name the revision it rolls back from (fromRevision): without it the target "
            "cannot tell whether the Deployment still runs what the plan saw"
        )
    for field in ("toRevision", "fromRevision"):
        value = params[field]
        if not isinstance(value, str) or not value.isdigit():
            raise TargetRejected(f"rollback {field} is a ReplicaSet revision number as text (e.g. '3'), got {value!r}")
    to_revision, from_revision = str(int(params["toRevision"])), str(int(params["fromRevision"]))
    if to_revision == from_revision:
        raise TargetRejected(f"rollback from revision {from_revision} to itself changes nothing")
    for field in ("fromTemplateHash", "toTemplateHash"):
        value = params.get(field)
        if value is not None and (not isinstance(value, str) or not value):
            raise TargetRejected(f"rollback {field} is a pod-template-hash or null, got {value!r}")
    for field in ("fromImages", "toImages"):
        images = params.get(field) or []
        if not isinstance(images, list | tuple) or not all(isinstance(i, str) and "=" in i for i in images):
            raise TargetRejected(f"rollback {field} lists 'container=image' texts, got {images!r}")
    return {
        "toRevision": to_revision,
        "fromRevision": from_revision,
        "fromTemplateHash": params.get("fromTemplateHash"),
        "toTemplateHash": params.get("toTemplateHash"),
        "fromImages": list(params.get("fromImages") or []),
        "toImages": list(params.get("toImages") or []),
    }


def check_pause(params: Mapping[str, Any]) -> dict[str, Any]:
    if set(params) != {"paused"} or not isinstance(params["paused"], bool):
        raise TargetRejected(f"pause takes params {{'paused': bool}}, got {dict(params)!r}")
    return {"paused": params["paused"]}


def _check_raise(action: str, unit: str, before: object, after: object) -> None:
    """A raise is above the value it raises from, and at most twice it (the policy bounds
    it too; the target is the last line)."""
    if not (_is_int(before) and _is_int(after)) or not isinstance(before, int) or not isinstance(after, int):
        raise TargetRejected(f"{action} takes whole {unit}, got from {before!r} to {after!r}")
    if before <= 0:
        raise TargetRejected(f"{action} raises from a positive number of {unit}, got {before}")
    if after <= before:
        raise TargetRejected(f"{action} from {before} to {after} {unit} is not a raise")
    if after > 2 * before:
        raise TargetRejected(f"{action} to {after} {unit} is more than twice the {before} it raises from")


def check_raise_ceiling(params: Mapping[str, Any]) -> dict[str, Any]:
    _takes("raise-ceiling", params, {"autoscalerKind", "autoscaler", "fromMaxReplicas", "maxReplicas"})
    if params["autoscalerKind"] not in AUTOSCALERS:
        raise TargetRejected(f"raise-ceiling acts on {' or '.join(AUTOSCALERS)}, not {params['autoscalerKind']!r}")
    if not isinstance(params["autoscaler"], str) or not params["autoscaler"]:
        raise TargetRejected(f"raise-ceiling names its autoscaler, got {params['autoscaler']!r}")
    _check_raise("raise-ceiling", "replicas", params["fromMaxReplicas"], params["maxReplicas"])
    return dict(params)


def check_raise_memory(params: Mapping[str, Any]) -> dict[str, Any]:
    _takes("raise-memory", params, {"container", "fromMemoryLimitBytes", "memoryLimitBytes"})
    if not isinstance(params["container"], str) or not params["container"]:
        raise TargetRejected(f"raise-memory names its container, got {params['container']!r}")
    _check_raise("raise-memory", "bytes", params["fromMemoryLimitBytes"], params["memoryLimitBytes"])
    return dict(params)


# -- what a ReplicaSet says -------------------------------------------------------------


def _revision(rs: Mapping[str, Any]) -> str | None:
    return (rs["metadata"].get("annotations") or {}).get(REVISION)


def _hash(rs: Mapping[str, Any]) -> str | None:
    return (rs["metadata"].get("labels") or {}).get(TEMPLATE_HASH)


def _revision_number(rs: Mapping[str, Any]) -> int:
    revision = _revision(rs)
    return int(revision) if revision and revision.isdigit() else -1


def images_of(template: Mapping[str, Any]) -> list[str]:
    """``container=image`` for each container, in order (the contract's ``images``)."""
    return [f"{c.get('name')}={c.get('image')}" for c in template.get("spec", {}).get("containers") or []]


def _unhashed(template: Mapping[str, Any]) -> dict[str, Any]:
    """A ReplicaSet's pod template as the Deployment would hold it: without the
    pod-template-hash label the controller added (what ``kubectl rollout undo`` drops)."""
    unhashed: dict[str, Any] = copy.deepcopy(dict(template))
    labels = unhashed.setdefault("metadata", {}).get("labels") or {}
    labels.pop(TEMPLATE_HASH, None)
    return unhashed


def _owned_by(rs: Mapping[str, Any], uid: str | None) -> bool:
    return bool(uid) and any(ref.get("uid") == uid for ref in rs["metadata"].get("ownerReferences") or [])


def _owners(rs: Mapping[str, Any]) -> str:
    refs = rs["metadata"].get("ownerReferences") or []
    return ", ".join(f"{r.get('kind')}/{r.get('name')} (uid {r.get('uid')})" for r in refs) or "no owner"


class KubernetesTarget:
    """Act on a Deployment through the Kubernetes API: :data:`HANDLERS` lists the actions.

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
    ) -> ActionResult:
        if action in self.REFUSED:
            raise TargetRejected(f"{action} is not supported on Kubernetes: {self.REFUSED[action]}")
        handler = self.HANDLERS.get(action)
        if handler is None:
            raise TargetRejected(f"unknown action {action!r}: Kubernetes does {', '.join(sorted(self.HANDLERS))}")
        checked = handler.check(params)
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
            step = Step(action, place, deployment, checked, idempotency_key, fencing_token, started)
            try:
                return handler.act(self, step)
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

    # -- the actions -----------------------------------------------------------------

    def _scale(self, step: Step) -> ActionResult:
        place = step.place
        before = {"replicas": int(step.deployment.get("spec", {}).get("replicas", 1))}
        claimed = self._claim(step)
        scaled = self._patch(
            self._deployment_url(place) + "/scale",
            {
                "metadata": {"resourceVersion": claimed["metadata"]["resourceVersion"]},
                "spec": {"replicas": step.params["replicas"]},
            },
            what=f"scale {place.deployment}",
        )
        after = {"replicas": int(scaled.get("spec", {}).get("replicas", step.params["replicas"]))}
        result = self._result(step, before, after)
        self._record(place, result)
        return result

    def _restart(self, step: Step) -> ActionResult:
        template_annotations = step.template.get("metadata", {}).get("annotations") or {}
        now = now_ms().isoformat(timespec="seconds").replace("+00:00", "Z")
        before = {"restartedAt": template_annotations.get(self.RESTARTED_AT)}
        result = self._result(step, before, {"restartedAt": now})
        self._write_with_record(step, result, {"template": {"metadata": {"annotations": {self.RESTARTED_AT: now}}}})
        return result

    def _pause(self, step: Step) -> ActionResult:
        paused = step.params["paused"]
        before = {"paused": bool(step.deployment.get("spec", {}).get("paused", False))}
        result = self._result(step, before, {"paused": paused})
        self._write_with_record(step, result, {"paused": paused})
        return result

    def _rollback(self, step: Step) -> ActionResult:
        """Write the "to" ReplicaSet's pod template into the Deployment, if it still runs
        the "from" one (what ``kubectl rollout undo --to-revision`` does client-side, with
        every check the plan's approval rests on)."""
        params, name = step.params, step.place.deployment
        from_revision, to_revision = params["fromRevision"], params["toRevision"]
        template_annotations = step.template.get("metadata", {}).get("annotations") or {}
        forbidden = step.annotations.get(ROLLBACK_FORBIDDEN) or template_annotations.get(ROLLBACK_FORBIDDEN)
        if forbidden is not None:
            where = "" if ROLLBACK_FORBIDDEN in step.annotations else " (in its running pod template)"
            raise TargetRejected(f"rollback of {name} is forbidden by {ROLLBACK_FORBIDDEN}{where}: {forbidden}")
        if step.deployment.get("spec", {}).get("paused"):
            raise TargetRejected(
                f"{name} is paused: resume it before a rollback (the written template would wait unrolled; "
                "kubectl rollout undo refuses a paused Deployment too)"
            )
        listed = self._replica_sets(step)
        uid = step.deployment["metadata"].get("uid")
        owned = [rs for rs in listed if _owned_by(rs, uid)]
        current = step.template
        running = max(
            (rs for rs in owned if _unhashed(rs["spec"]["template"]) == current), key=_revision_number, default=None
        )
        if running is None:
            raise TargetRejected(
                f"{name} runs a pod template none of its ReplicaSets has yet (a new rollout is starting): it "
                f"changed since the plan, which rolls back from revision {from_revision}"
            )
        if _revision(running) != from_revision:
            raise TargetRejected(
                f"{name} no longer runs revision {from_revision}: it runs revision {_revision(running)} "
                f"({', '.join(images_of(current))}); someone changed it since the plan"
            )
        if params["fromTemplateHash"] is not None and _hash(running) != params["fromTemplateHash"]:
            raise TargetRejected(
                f"{name} runs revision {from_revision} with pod-template-hash {_hash(running)}, not the "
                f"{params['fromTemplateHash']} of the plan: it is not the template the plan saw"
            )
        if params["fromImages"] and images_of(current) != params["fromImages"]:
            raise TargetRejected(
                f"{name} runs {', '.join(images_of(current))}, not {', '.join(params['fromImages'])} as the plan "
                "saw: it is not the template the plan saw"
            )
        wanted = self._rollback_source(step, listed, owned)
        images = images_of(wanted["spec"]["template"])
        if params["toImages"] and images != params["toImages"]:
            raise TargetRejected(
                f"revision {to_revision} of {name} runs {', '.join(images)}, not {', '.join(params['toImages'])} "
                "as the plan says"
            )
        before = {"revision": from_revision, "templateHash": _hash(running), "images": images_of(current)}
        after = {"revision": to_revision, "templateHash": _hash(wanted), "images": images}
        result = self._result(step, before, after)
        self._json_patch(
            step,
            [{"op": "replace", "path": "/spec/template", "value": _unhashed(wanted["spec"]["template"])}],
            result,
        )
        return result

    def _rollback_source(self, step: Step, listed: list[dict[str, Any]], owned: list[dict[str, Any]]) -> dict[str, Any]:
        """The "to" ReplicaSet: owned by the Deployment (by uid), of the plan's revision
        and hash; otherwise the reason it is not there."""
        params, name = step.params, step.place.deployment
        to_revision, to_hash = params["toRevision"], params["toTemplateHash"]
        found = [rs for rs in owned if _revision(rs) == to_revision]
        if not found:
            strangers = [
                rs
                for rs in listed
                if rs not in owned and (_revision(rs) == to_revision or (to_hash is not None and _hash(rs) == to_hash))
            ]
            if strangers:
                rs = strangers[0]
                raise TargetRejected(
                    f"revision {to_revision} of {name} is not owned by it: ReplicaSet {rs['metadata']['name']} "
                    f"matches its labels but belongs to {_owners(rs)}; a rollback takes a template only from "
                    "a ReplicaSet the Deployment owns"
                )
            kept = sorted({r for r in map(_revision, owned) if r}, key=int)
            raise TargetRejected(
                f"revision {to_revision} of {name} is gone: none of its ReplicaSets has it (it keeps revisions "
                f"{', '.join(kept) or 'none'}; revisionHistoryLimit or a person removed it)"
            )
        if len(found) > 1:
            names = ", ".join(rs["metadata"]["name"] for rs in found)
            raise TargetRejected(f"revision {to_revision} of {name} is claimed by several ReplicaSets: {names}")
        (wanted,) = found
        if to_hash is not None and _hash(wanted) != to_hash:
            raise TargetRejected(
                f"revision {to_revision} of {name} has pod-template-hash {_hash(wanted)}, not the {to_hash} of "
                "the plan: it is not the template the plan names"
            )
        return wanted

    def _raise_ceiling(self, step: Step) -> ActionResult:
        params, place = step.params, step.place
        kind = AUTOSCALERS[params["autoscalerKind"]]
        label = f"{params['autoscalerKind']} {place.namespace}/{params['autoscaler']}"
        url = kind.url(place.namespace, params["autoscaler"])
        scaler: dict[str, Any] = self._call("GET", url, what=f"get {label}").json()
        spec = scaler.get("spec", {})
        ref = spec.get("scaleTargetRef") or {}
        ref_kind = ref.get("kind", kind.default_target_kind)
        if ref_kind != "Deployment" or ref.get("name") != place.name or ref.get("apiVersion", "apps/v1") != "apps/v1":
            raise TargetRejected(
                f"{label} scales {ref_kind}/{ref.get('name')}, not Deployment {place.name}: "
                "a command may raise only the ceiling of its own resource"
            )
        current = spec.get(kind.ceiling, kind.default_ceiling)
        # Already at the wanted ceiling: this key's own earlier write whose record was
        # lost (a crash between the write and the record), retried with the same key:
        # claimed and recorded, not written again.
        done = current == params["maxReplicas"]
        if current != params["fromMaxReplicas"] and not done:
            raise TargetRejected(
                f"{label} has {kind.ceiling} {current}, not the {params['fromMaxReplicas']} the plan raises from: "
                "someone changed it since the plan"
            )
        declared = (scaler["metadata"].get("annotations") or {}).get(MAX_REPLICAS_CEILING)
        if declared is not None:
            if not declared.strip().isdigit():
                raise TargetRejected(f"{label} declares an unreadable {MAX_REPLICAS_CEILING}: {declared!r}")
            if params["maxReplicas"] > int(declared):
                raise TargetRejected(
                    f"{label}: {params['maxReplicas']} is above its declared maximum "
                    f"({MAX_REPLICAS_CEILING}: {declared.strip()})"
                )
        self._claim(step)
        if not done:
            written = self._patch(
                url,
                {
                    "metadata": {"resourceVersion": scaler["metadata"]["resourceVersion"]},
                    "spec": {kind.ceiling: params["maxReplicas"]},
                },
                what=f"raise {label}",
            )
            current = written["spec"].get(kind.ceiling, params["maxReplicas"])
        result = self._result(step, {"maxReplicas": params["fromMaxReplicas"]}, {"maxReplicas": int(current)})
        self._record(place, result)
        return result

    def _raise_memory(self, step: Step) -> ActionResult:
        params, name = step.params, step.place.deployment
        container = params["container"]
        containers = step.template.get("spec", {}).get("containers") or []
        index = next((i for i, c in enumerate(containers) if c.get("name") == container), None)
        if index is None:
            have = ", ".join(str(c.get("name")) for c in containers)
            raise TargetRejected(f"{name} has no container {container!r} (it has {have})")
        limit = ((containers[index].get("resources") or {}).get("limits") or {}).get("memory")
        if limit is None:
            raise TargetRejected(
                f"container {container!r} of {name} has no memory limit: raise-memory raises one, it does not set one"
            )
        try:
            current = parse_bytes(str(limit))
        except ValueError:
            raise TargetRejected(
                f"container {container!r} of {name} has an unreadable memory limit {limit!r}"
            ) from None
        if current != params["fromMemoryLimitBytes"]:
            raise TargetRejected(
                f"container {container!r} of {name} has memory limit {limit} ({current} bytes), not the "
                f"{params['fromMemoryLimitBytes']} bytes the plan raises from: someone changed it since the plan"
            )
        declared = step.annotations.get(MAX_MEMORY_LIMIT)
        if declared is not None:
            try:
                ceiling = parse_bytes(declared)
            except ValueError:
                raise TargetRejected(f"{name} declares an unreadable {MAX_MEMORY_LIMIT}: {declared!r}") from None
            if params["memoryLimitBytes"] > ceiling:
                raise TargetRejected(
                    f"{name}: a memory limit of {format_bytes(params['memoryLimitBytes'])} is above its declared "
                    f"maximum ({MAX_MEMORY_LIMIT}: {declared})"
                )
        before = {"memoryLimitBytes": current, "container": container}
        result = self._result(step, before, {"memoryLimitBytes": params["memoryLimitBytes"], "container": container})
        path = f"/spec/template/spec/containers/{index}/resources/limits/memory"
        self._json_patch(
            step, [{"op": "replace", "path": path, "value": format_bytes(params["memoryLimitBytes"])}], result
        )
        return result

    HANDLERS: ClassVar[Mapping[str, Handler]] = {
        "scale": Handler(check_scale, _scale),
        "restart": Handler(check_restart, _restart),
        "rollback": Handler(check_rollback, _rollback),
        "pause": Handler(check_pause, _pause),
        "raise-ceiling": Handler(check_raise_ceiling, _raise_ceiling),
        "raise-memory": Handler(check_raise_memory, _raise_memory),
    }
    # Actions of the fleet this target never does, and why (a command of one is refused
    # before any call to the API server).
    REFUSED: ClassVar[Mapping[str, str]] = {
        "failover": "a dependency's failover target is application or mesh configuration, not a Deployment",
    }

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

    def _write_with_record(self, step: Step, result: ActionResult, spec: dict[str, Any]) -> None:
        """One merge patch: ``spec`` (merged into the Deployment's), the token and the record."""
        self._patch(
            self._deployment_url(step.place),
            {
                "metadata": {
                    "resourceVersion": step.resource_version,
                    "annotations": self._record_annotations(step, result),
                },
                "spec": spec,
            },
            what=f"{step.action} {step.place.deployment}",
        )

    def _json_patch(self, step: Step, ops: list[dict[str, Any]], result: ActionResult) -> None:
        """One JSON Patch: ``ops``, the token and the record, on the resourceVersion read.

        Setting ``/metadata/resourceVersion`` to the one read makes the API server refuse
        the patch (409) if the Deployment changed since; the annotations are written whole
        (``add`` replaces the map), which that precondition makes safe.
        """
        annotations = {**step.annotations, **self._record_annotations(step, result)}
        patch = [
            {"op": "replace", "path": "/metadata/resourceVersion", "value": step.resource_version},
            *ops,
            {"op": "add", "path": "/metadata/annotations", "value": annotations},
        ]
        self._call(
            "PATCH",
            self._deployment_url(step.place),
            what=f"{step.action} {step.place.deployment}",
            content=json.dumps(patch),
            headers={"Content-Type": self.JSON_PATCH},
        )

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

    def _replica_sets(self, step: Step) -> list[dict[str, Any]]:
        """The namespace's ReplicaSets, narrowed by the Deployment's ``matchLabels`` (only to
        list fewer: ownership is decided by owner uid, never by labels)."""
        match = step.deployment.get("spec", {}).get("selector", {}).get("matchLabels") or {}
        selector = ",".join(f"{k}={v}" for k, v in sorted(match.items()))
        listed = self._call(
            "GET",
            f"/apis/apps/v1/namespaces/{quote(step.place.namespace, safe='')}/replicasets",
            what=f"list the ReplicaSets of {step.place.deployment}",
            params={"labelSelector": selector} if selector else None,
        )
        items: list[dict[str, Any]] = listed.json().get("items") or []
        return items

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
