"""The executor's writes on Kubernetes, planned without a call: one function for the
preview and the write.

:func:`planned_write` takes a step's action and params, the Deployment as read and a way to
read more (ReplicaSets, an autoscaler), checks everything the target checks, and returns
the write it would make (method, API path, JSON body, content type) and how the API
server's answer to that write reads as the :class:`~flotilla.actions.Change` a person
approves. The policy service sends it with ``dryRun=All`` before a person is asked
(services/policy/preview_kubernetes.py); the executor (KubernetesTarget) adds its fencing
token, its record and its resourceVersion precondition to the same body, dry-runs it when
the command carries an approved change and refuses another result, then sends it for
real. Both call this one function, so what is shown is what is written.

The change is read from what the API server answers, never from what was planned: the
facts a person checks (images, env, replicas, paused, memory limits, an autoscaler's
ceiling) and ``templateDigest``, a hash of the whole pod template, so a change in a field
not listed (a command, a volume, a security context) still changes the digest. It leaves
out what differs between two dry runs of the same step on an unchanged cluster: the
executor's annotations, resourceVersion, generation, timestamps, the restart time.

Pure: no HTTP here (``read`` is the caller's); raises :class:`Refused` with the reason.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol
from urllib.parse import quote

from flotilla.actions import Change, UnknownAction, by_action
from flotilla.actions.quantity import format_bytes, parse_bytes

__all__ = [
    "AUTOSCALERS",
    "MAX_MEMORY_LIMIT",
    "MAX_REPLICAS_CEILING",
    "RESTARTED_AT",
    "ROLLBACK_FORBIDDEN",
    "WRITES",
    "Autoscaler",
    "PlannedWrite",
    "Read",
    "Refused",
    "checked",
    "deployment_facts",
    "images_of",
    "planned_write",
    "template_digest",
]

REVISION = "deployment.kubernetes.io/revision"
TEMPLATE_HASH = "pod-template-hash"
RESTARTED_AT = "kubectl.kubernetes.io/restartedAt"
ROLLBACK_FORBIDDEN = "flotilla.dev/rollback-forbidden"
MAX_REPLICAS_CEILING = "flotilla.dev/max-replicas-ceiling"
MAX_MEMORY_LIMIT = "flotilla.dev/max-memory-limit"
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"

# What a person is shown of env, bounded so one huge value or a hundred variables cannot
# bury the rest (the template digest still covers every byte of them).
ENV_VALUE_CHARS = 80
ENV_ENTRIES = 40


class Refused(Exception):
    """The target would refuse this step (and why): bad params, or the cluster is not as
    the plan says. ``status``: the API server's answer it rests on, e.g. 404 for an
    object that is not there."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class Read(Protocol):
    def __call__(self, path: str, **params: str) -> dict[str, Any] | None:
        """The object or list at ``path`` (query ``params``); None when it does not exist."""
        ...


@dataclass(frozen=True)
class Autoscaler:
    """An autoscaler kind a raise-ceiling may write: where it lives and its ceiling field."""

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


@dataclass(frozen=True)
class PlannedWrite:
    """One write of the executor, before its fencing token, record and resourceVersion.

    ``written`` is the object as read that the write is based on (the Deployment, or the
    autoscaler; its resourceVersion is the write's precondition); ``before``/``after`` are
    the action's result as planned (the contract's keys: ``replicas``, ``revision``, ...).
    ``done``: a raise-ceiling already at the wanted value, this plan's own earlier write
    whose record was lost; the target records it without writing again.
    """

    method: str
    path: str
    body: Any
    content_type: str
    written: Mapping[str, Any]
    before: Mapping[str, Any]
    after: Mapping[str, Any]
    shown: Mapping[str, Any] = field(repr=False)  # the facts of what was read: Change.before
    facts: Callable[[Mapping[str, Any]], dict[str, Any]] = field(repr=False)  # of an answer: Change.after
    done: bool = False

    @property
    def resource_version(self) -> str:
        return str(self.written["metadata"]["resourceVersion"])

    def change(self, answer: Mapping[str, Any]) -> Change:
        """The change a person approves: the facts read, and those of the API server's
        answer to this write (a dry run's, or the write's own)."""
        return Change(dict(self.shown), self.facts(answer))


# -- the facts a person checks -------------------------------------------------------------


def _containers(template: Mapping[str, Any]) -> list[dict[str, Any]]:
    containers: list[dict[str, Any]] = (template.get("spec") or {}).get("containers") or []
    return containers


def images_of(template: Mapping[str, Any]) -> list[str]:
    """``container=image`` for each container, in order (the contract's ``images``)."""
    return [f"{c.get('name')}={c.get('image')}" for c in _containers(template)]


def _env_value(variable: Mapping[str, Any]) -> str:
    if "value" in variable:
        value = str(variable["value"])
    else:  # a reference: where from, never the value (a Secret's is not this page's to show)
        source = variable.get("valueFrom") or {}
        kind, ref = next(iter(source.items()), ("", {}))
        where = "/".join(str(v) for v in (ref or {}).values()) if isinstance(ref, dict) else str(ref)
        value = f"<{kind} {where}>".replace(" >", ">")
    return value if len(value) <= ENV_VALUE_CHARS else value[: ENV_VALUE_CHARS - 1] + "…"


def _env_of(template: Mapping[str, Any]) -> list[str]:
    entries = [
        f"{c.get('name')}: {v.get('name')}={_env_value(v)}" for c in _containers(template) for v in c.get("env") or []
    ]
    if len(entries) > ENV_ENTRIES:
        return [*entries[:ENV_ENTRIES], f"… and {len(entries) - ENV_ENTRIES} more"]
    return entries


def _memory_limits(template: Mapping[str, Any]) -> list[str]:
    return [
        f"{c.get('name')}={((c.get('resources') or {}).get('limits') or {}).get('memory', 'none')}"
        for c in _containers(template)
    ]


def _unhashed(template: Mapping[str, Any]) -> dict[str, Any]:
    """A ReplicaSet's pod template as the Deployment would hold it: without the
    pod-template-hash label the controller added (what ``kubectl rollout undo`` drops)."""
    unhashed: dict[str, Any] = copy.deepcopy(dict(template))
    labels = unhashed.setdefault("metadata", {}).get("labels") or {}
    labels.pop(TEMPLATE_HASH, None)
    return unhashed


def template_digest(template: Mapping[str, Any]) -> str:
    """``sha256:`` of the canonical pod template, without what differs between two writes
    of the same template: the controller's pod-template-hash label, the restart time
    (``kubectl.kubernetes.io/restartedAt``: a restart's preview and its write are a
    moment apart) and a null creationTimestamp; empty label and annotation maps count as
    none."""
    canonical = _unhashed(template)
    metadata = canonical["metadata"]
    metadata.pop("creationTimestamp", None)
    annotations = metadata.get("annotations") or {}
    annotations.pop(RESTARTED_AT, None)
    for key in ("labels", "annotations"):
        if not metadata.get(key):
            metadata.pop(key, None)
    body = json.dumps(canonical, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(body.encode()).hexdigest()


def _restarted(template: Mapping[str, Any]) -> str | None:
    value = ((template.get("metadata") or {}).get("annotations") or {}).get(RESTARTED_AT)
    return None if value is None else str(value)


def deployment_facts(deployment: Mapping[str, Any]) -> dict[str, Any]:
    """What a person checks of a Deployment, as JSON values."""
    spec = deployment.get("spec") or {}
    template = spec.get("template") or {}
    return {
        "images": images_of(template),
        "env": _env_of(template),
        "replicas": int(spec.get("replicas", 1)),
        "paused": bool(spec.get("paused", False)),
        "memoryLimits": _memory_limits(template),
        "restartedAt": _restarted(template),
        "templateDigest": template_digest(template),
    }


def _deployment_change_facts(read: Mapping[str, Any]) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
    """The facts of an answer to a write of the Deployment ``read``: a restart time the
    write set is shown as such, not as the clock's value, so the preview and the
    executor's dry run a moment later show the same change."""
    restarted = _restarted((read.get("spec") or {}).get("template") or {})

    def facts(answer: Mapping[str, Any]) -> dict[str, Any]:
        found = deployment_facts(answer)
        if found["restartedAt"] != restarted:
            found["restartedAt"] = "at the write"
        return found

    return facts


def _scale_facts(answer: Mapping[str, Any]) -> dict[str, Any]:
    return {"replicas": int((answer.get("spec") or {}).get("replicas", 0))}


def _autoscaler_facts(label: str, kind: Autoscaler) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
    def facts(scaler: Mapping[str, Any]) -> dict[str, Any]:
        return {"autoscaler": label, "maxReplicas": (scaler.get("spec") or {}).get(kind.ceiling, kind.default_ceiling)}

    return facts


# -- the params of each action, checked before any call -------------------------------------


def _check_raise(action: str, unit: str, before: int, after: int) -> None:
    """A raise is above the value it raises from, and at most twice it (the policy bounds
    it too; the target is the last line)."""
    if after <= before:
        raise Refused(f"{action} from {before} to {after} {unit} is not a raise")
    if after > 2 * before:
        raise Refused(f"{action} to {after} {unit} is more than twice the {before} it raises from")


def _check_rollback(params: dict[str, Any]) -> dict[str, Any]:
    if params.get("fromRevision") is None:
        raise Refused(
            "a rollback must name the revision it rolls back from (fromRevision): without it the target "
            "cannot tell whether the Deployment still runs what the plan saw"
        )
    for name in ("toRevision", "fromRevision"):
        if not params[name].isdigit():
            raise Refused(f"rollback {name} is a ReplicaSet revision number as text (e.g. '3'), got {params[name]!r}")
        params[name] = str(int(params[name]))
    if params["toRevision"] == params["fromRevision"]:
        raise Refused(f"rollback from revision {params['fromRevision']} to itself changes nothing")
    for name in ("fromTemplateHash", "toTemplateHash"):
        if params[name] is not None and not params[name]:
            raise Refused(f"rollback {name} is a pod-template-hash or null, got {params[name]!r}")
    for name in ("fromImages", "toImages"):
        if not all("=" in image for image in params[name]):
            raise Refused(f"rollback {name} lists 'container=image' texts, got {params[name]!r}")
        params[name] = list(params[name])
    return params


def checked(action: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` checked by the kind's spec and what Kubernetes adds, defaults filled;
    Refused before any call to the API server."""
    try:
        spec = by_action(action)
    except UnknownAction as exc:
        raise Refused(str(exc.args[0])) from None
    problems = spec.problems(params)
    if problems:
        raise Refused(f"{action}: {'; '.join(problems)}")
    found = spec.params_of(params)
    if action == "restart" and not found["rolling"]:
        raise Refused("restart with rolling=false is not supported: a Deployment restarts per its rollout strategy")
    if action == "rollback":
        return _check_rollback(found)
    if action == "raise-ceiling":
        _check_raise(action, "replicas", found["fromMaxReplicas"], found["maxReplicas"])
    if action == "raise-memory":
        _check_raise(action, "bytes", found["fromMemoryLimitBytes"], found["memoryLimitBytes"])
    return found


# -- the writes -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Read:
    """The Deployment as read, and where it is."""

    namespace: str
    deployment: Mapping[str, Any]
    read: Read

    @property
    def name(self) -> str:
        return str(self.deployment["metadata"]["name"])

    @property
    def label(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def url(self) -> str:
        return f"/apis/apps/v1/namespaces/{quote(self.namespace, safe='')}/deployments/{quote(self.name, safe='')}"

    @property
    def annotations(self) -> dict[str, str]:
        annotations: dict[str, str] = self.deployment["metadata"].get("annotations") or {}
        return annotations

    @property
    def spec(self) -> Mapping[str, Any]:
        spec: Mapping[str, Any] = self.deployment.get("spec") or {}
        return spec

    @property
    def template(self) -> dict[str, Any]:
        template: dict[str, Any] = self.spec.get("template") or {}
        return template

    def write(self, body: Any, content_type: str, before: Mapping[str, Any], after: Mapping[str, Any]) -> PlannedWrite:
        """A write of the Deployment itself, shown as its facts."""
        return PlannedWrite(
            "PATCH",
            self.url,
            body,
            content_type,
            self.deployment,
            before,
            after,
            deployment_facts(self.deployment),
            _deployment_change_facts(self.deployment),
        )


def _scale(at: _Read, params: Mapping[str, Any]) -> PlannedWrite:
    replicas = int(at.spec.get("replicas", 1))
    return PlannedWrite(
        "PATCH",
        at.url + "/scale",
        {"spec": {"replicas": params["replicas"]}},
        MERGE_PATCH,
        at.deployment,  # the scale shares the Deployment's resourceVersion
        {"replicas": replicas},
        {"replicas": params["replicas"]},
        {"replicas": replicas},
        _scale_facts,
    )


def _restart(at: _Read, params: Mapping[str, Any]) -> PlannedWrite:
    now = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    body = {"spec": {"template": {"metadata": {"annotations": {RESTARTED_AT: now}}}}}
    return at.write(body, MERGE_PATCH, {"restartedAt": _restarted(at.template)}, {"restartedAt": now})


def _pause(at: _Read, params: Mapping[str, Any]) -> PlannedWrite:
    paused = bool(params["paused"])
    before = {"paused": bool(at.spec.get("paused", False))}
    return at.write({"spec": {"paused": paused}}, MERGE_PATCH, before, {"paused": paused})


def _revision(rs: Mapping[str, Any]) -> str | None:
    return (rs["metadata"].get("annotations") or {}).get(REVISION)


def _hash(rs: Mapping[str, Any]) -> str | None:
    return (rs["metadata"].get("labels") or {}).get(TEMPLATE_HASH)


def _revision_number(rs: Mapping[str, Any]) -> int:
    revision = _revision(rs)
    return int(revision) if revision and revision.isdigit() else -1


def _owned_by(rs: Mapping[str, Any], uid: str | None) -> bool:
    return bool(uid) and any(ref.get("uid") == uid for ref in rs["metadata"].get("ownerReferences") or [])


def _owners(rs: Mapping[str, Any]) -> str:
    refs = rs["metadata"].get("ownerReferences") or []
    return ", ".join(f"{r.get('kind')}/{r.get('name')} (uid {r.get('uid')})" for r in refs) or "no owner"


def _replica_sets(at: _Read) -> list[dict[str, Any]]:
    """The namespace's ReplicaSets, narrowed by the Deployment's ``matchLabels`` (only to
    list fewer: ownership is decided by owner uid, never by labels)."""
    match = (at.spec.get("selector") or {}).get("matchLabels") or {}
    selector = ",".join(f"{k}={v}" for k, v in sorted(match.items()))
    path = f"/apis/apps/v1/namespaces/{quote(at.namespace, safe='')}/replicasets"
    listed = at.read(path, labelSelector=selector) if selector else at.read(path)
    items: list[dict[str, Any]] = (listed or {}).get("items") or []
    return items


def _rollback(at: _Read, params: Mapping[str, Any]) -> PlannedWrite:
    """Write the "to" ReplicaSet's pod template into the Deployment, if it still runs the
    "from" one (what ``kubectl rollout undo --to-revision`` does client-side, with every
    check the plan's approval rests on). A JSON Patch ``replace`` of ``/spec/template``, so
    labels, annotations and env of the newer template do not survive, as a merge patch
    would let them."""
    name, from_revision = at.label, params["fromRevision"]
    template_annotations = (at.template.get("metadata") or {}).get("annotations") or {}
    forbidden = at.annotations.get(ROLLBACK_FORBIDDEN) or template_annotations.get(ROLLBACK_FORBIDDEN)
    if forbidden is not None:
        where = "" if ROLLBACK_FORBIDDEN in at.annotations else " (in its running pod template)"
        raise Refused(f"rollback of {name} is forbidden by {ROLLBACK_FORBIDDEN}{where}: {forbidden}")
    if at.spec.get("paused"):
        raise Refused(
            f"{name} is paused: resume it before a rollback (the written template would wait unrolled; "
            "kubectl rollout undo refuses a paused Deployment too)"
        )
    listed = _replica_sets(at)
    owned = [rs for rs in listed if _owned_by(rs, at.deployment["metadata"].get("uid"))]
    current = at.template
    running = max(
        (rs for rs in owned if _unhashed(rs["spec"]["template"]) == current), key=_revision_number, default=None
    )
    if running is None:
        raise Refused(
            f"{name} runs a pod template none of its ReplicaSets has yet (a new rollout is starting): it "
            f"changed since the plan, which rolls back from revision {from_revision}"
        )
    if _revision(running) != from_revision:
        raise Refused(
            f"{name} no longer runs revision {from_revision}: it runs revision {_revision(running)} "
            f"({', '.join(images_of(current))}); someone changed it since the plan"
        )
    if params["fromTemplateHash"] is not None and _hash(running) != params["fromTemplateHash"]:
        raise Refused(
            f"{name} runs revision {from_revision} with pod-template-hash {_hash(running)}, not the "
            f"{params['fromTemplateHash']} of the plan: it is not the template the plan saw"
        )
    if params["fromImages"] and images_of(current) != params["fromImages"]:
        raise Refused(
            f"{name} runs {', '.join(images_of(current))}, not {', '.join(params['fromImages'])} as the plan "
            "saw: it is not the template the plan saw"
        )
    wanted = _rollback_source(at, params, listed, owned)
    images = images_of(wanted["spec"]["template"])
    if params["toImages"] and images != params["toImages"]:
        raise Refused(
            f"revision {params['toRevision']} of {name} runs {', '.join(images)}, not "
            f"{', '.join(params['toImages'])} as the plan says"
        )
    before = {"revision": from_revision, "templateHash": _hash(running), "images": images_of(current)}
    # The controller takes the restored template's ReplicaSet back as the newest revision
    # (the highest owned number + 1): recorded as such, so that undoing this rollback names
    # the revision the Deployment will then run (the hash is the identity either way).
    renumbered = str(max((_revision_number(rs) for rs in owned), default=0) + 1)
    after = {
        "revision": renumbered,
        "restoredRevision": params["toRevision"],
        "templateHash": _hash(wanted),
        "images": images,
    }
    ops = [{"op": "replace", "path": "/spec/template", "value": _unhashed(wanted["spec"]["template"])}]
    return at.write(ops, JSON_PATCH, before, after)


def _rollback_source(
    at: _Read, params: Mapping[str, Any], listed: list[dict[str, Any]], owned: list[dict[str, Any]]
) -> dict[str, Any]:
    """The "to" ReplicaSet: owned by the Deployment (by uid), of the plan's revision and
    hash; otherwise the reason it is not there."""
    name, to_revision, to_hash = at.label, params["toRevision"], params["toTemplateHash"]
    found = [rs for rs in owned if _revision(rs) == to_revision]
    if not found:
        strangers = [
            rs
            for rs in listed
            if rs not in owned and (_revision(rs) == to_revision or (to_hash is not None and _hash(rs) == to_hash))
        ]
        if strangers:
            rs = strangers[0]
            raise Refused(
                f"revision {to_revision} of {name} is not owned by it: ReplicaSet {rs['metadata']['name']} "
                f"matches its labels but belongs to {_owners(rs)}; a rollback takes a template only from "
                "a ReplicaSet the Deployment owns"
            )
        kept = sorted({r for r in map(_revision, owned) if r}, key=int)
        raise Refused(
            f"revision {to_revision} of {name} is gone: none of its ReplicaSets has it (it keeps revisions "
            f"{', '.join(kept) or 'none'}; revisionHistoryLimit or a person removed it)"
        )
    if len(found) > 1:
        names = ", ".join(rs["metadata"]["name"] for rs in found)
        raise Refused(f"revision {to_revision} of {name} is claimed by several ReplicaSets: {names}")
    (wanted,) = found
    if to_hash is not None and _hash(wanted) != to_hash:
        raise Refused(
            f"revision {to_revision} of {name} has pod-template-hash {_hash(wanted)}, not the {to_hash} of "
            "the plan: it is not the template the plan names"
        )
    return wanted


def _raise_ceiling(at: _Read, params: Mapping[str, Any]) -> PlannedWrite:
    kind = AUTOSCALERS[params["autoscalerKind"]]
    label = f"{params['autoscalerKind']} {at.namespace}/{params['autoscaler']}"
    url = kind.url(at.namespace, params["autoscaler"])
    scaler = at.read(url)
    if scaler is None:
        raise Refused(f"{label} does not exist", 404)
    spec = scaler.get("spec") or {}
    ref = spec.get("scaleTargetRef") or {}
    ref_kind = ref.get("kind", kind.default_target_kind)
    if ref_kind != "Deployment" or ref.get("name") != at.name or ref.get("apiVersion", "apps/v1") != "apps/v1":
        raise Refused(
            f"{label} scales {ref_kind}/{ref.get('name')}, not Deployment {at.name}: "
            "a command may raise only the ceiling of its own resource"
        )
    current = spec.get(kind.ceiling, kind.default_ceiling)
    # Already at the wanted ceiling: this key's own earlier write whose record was lost (a
    # crash between the write and the record), retried: recorded, not written again, and
    # shown as the change the plan made (its "from" value can no longer be read).
    done = current == params["maxReplicas"]
    if current != params["fromMaxReplicas"] and not done:
        raise Refused(
            f"{label} has {kind.ceiling} {current}, not the {params['fromMaxReplicas']} the plan raises from: "
            "someone changed it since the plan"
        )
    declared = (scaler["metadata"].get("annotations") or {}).get(MAX_REPLICAS_CEILING)
    if declared is not None:
        if not declared.strip().isdigit():
            raise Refused(f"{label} declares an unreadable {MAX_REPLICAS_CEILING}: {declared!r}")
        if params["maxReplicas"] > int(declared):
            raise Refused(
                f"{label}: {params['maxReplicas']} is above its declared maximum "
                f"({MAX_REPLICAS_CEILING}: {declared.strip()})"
            )
    facts = _autoscaler_facts(f"{params['autoscalerKind']}/{params['autoscaler']}", kind)
    return PlannedWrite(
        "PATCH",
        url,
        {"spec": {kind.ceiling: params["maxReplicas"]}},
        MERGE_PATCH,
        scaler,
        {"maxReplicas": params["fromMaxReplicas"]},
        {"maxReplicas": params["maxReplicas"]},
        {**facts(scaler), "maxReplicas": params["fromMaxReplicas"]},
        facts,
        done=done,
    )


def _raise_memory(at: _Read, params: Mapping[str, Any]) -> PlannedWrite:
    name, container = at.label, params["container"]
    containers = _containers(at.template)
    index = next((i for i, c in enumerate(containers) if c.get("name") == container), None)
    if index is None:
        have = ", ".join(str(c.get("name")) for c in containers)
        raise Refused(f"{name} has no container {container!r} (it has {have})")
    limit = ((containers[index].get("resources") or {}).get("limits") or {}).get("memory")
    if limit is None:
        raise Refused(
            f"container {container!r} of {name} has no memory limit: raise-memory raises one, it does not set one"
        )
    try:
        current = parse_bytes(str(limit))
    except ValueError:
        raise Refused(f"container {container!r} of {name} has an unreadable memory limit {limit!r}") from None
    if current != params["fromMemoryLimitBytes"]:
        raise Refused(
            f"container {container!r} of {name} has memory limit {limit} ({current} bytes), not the "
            f"{params['fromMemoryLimitBytes']} bytes the plan raises from: someone changed it since the plan"
        )
    declared = at.annotations.get(MAX_MEMORY_LIMIT)
    if declared is not None:
        try:
            ceiling = parse_bytes(declared)
        except ValueError:
            raise Refused(f"{name} declares an unreadable {MAX_MEMORY_LIMIT}: {declared!r}") from None
        if params["memoryLimitBytes"] > ceiling:
            raise Refused(
                f"{name}: a memory limit of {format_bytes(params['memoryLimitBytes'])} is above its declared "
                f"maximum ({MAX_MEMORY_LIMIT}: {declared})"
            )
    path = f"/spec/template/spec/containers/{index}/resources/limits/memory"
    ops = [{"op": "replace", "path": path, "value": format_bytes(params["memoryLimitBytes"])}]
    before = {"memoryLimitBytes": current, "container": container}
    return at.write(ops, JSON_PATCH, before, {"memoryLimitBytes": params["memoryLimitBytes"], "container": container})


_PLANS: dict[str, Callable[[_Read, Mapping[str, Any]], PlannedWrite]] = {
    "scale": _scale,
    "restart": _restart,
    "rollback": _rollback,
    "pause": _pause,
    "raise-ceiling": _raise_ceiling,
    "raise-memory": _raise_memory,
}
# The actions with a write, in the order a refusal lists them.
WRITES = tuple(sorted(_PLANS))
# What Kubernetes has no write for, and why.
NO_WRITE = {"failover": "a dependency's failover target is application or mesh configuration, not a Deployment"}


def planned_write(
    action: str, params: Mapping[str, Any], *, namespace: str, deployment: Mapping[str, Any], read: Read
) -> PlannedWrite | None:
    """The write the executor would make for ``action`` on ``deployment`` (as read, in
    ``namespace``), or None for an action with no Kubernetes write (failover); Refused,
    with the reason, for one the target would refuse. ``read`` reads what else the plan
    rests on (the ReplicaSets of a rollback, the autoscaler of a raise-ceiling)."""
    found = checked(action, params)
    plan = _PLANS.get(action)
    if plan is None:
        return None
    return plan(_Read(namespace, deployment, read), found)
