"""What the Kubernetes API says of each service's Deployment, added to another source's evidence.

Prometheus knows latency; the API server knows the workload: the replicas a Deployment
wants and has available, which ReplicaSet revision runs and which image it runs, when
that revision appeared (a "recent rollout" signal, the first thing an SRE checks), and
the Deployment's recent events; and the facts a rollback is planned with (the running and
the newest older ReplicaSet's revision number, pod-template hash and images, whether the
Deployment is paused, and the ``flotilla.dev/rollback-forbidden`` annotation on the
Deployment or in the running ReplicaSet's pod template). :class:`KubernetesEvidence` wraps an evidence source
(``PrometheusEvidence`` in production) and fills those fields of each service it can
place in a namespace, reading only: ``get``/``list`` of deployments, replicasets and
events (infra/k8s/overlays/production/diagnostic-rbac.yaml grants exactly that).

A service whose Deployment is missing keeps what the wrapped source said; an API server
that does not answer, or refuses, is :class:`EvidenceUnavailable`, as for any source.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from flotilla_evidence.base import EvidenceSource, EvidenceUnavailable
from flotilla_evidence.model import RevisionFacts, ServiceView, Topology

REVISION = "deployment.kubernetes.io/revision"
TEMPLATE_HASH = "pod-template-hash"
ROLLBACK_FORBIDDEN = "flotilla.dev/rollback-forbidden"
EVENTS_KEPT = 5


@dataclass(frozen=True)
class Rollout:
    """One Deployment as the API server has it."""

    desired: int
    available: int
    revision: str  # the running ReplicaSet's images and revision, e.g. "shop:1.4 (revision 3)"
    previous_revision: str | None
    changed_at: datetime | None  # when the running revision's ReplicaSet appeared (None: the only one)
    events: tuple[str, ...] = ()
    running: RevisionFacts | None = None  # the running ReplicaSet's
    rollback_candidate: RevisionFacts | None = None  # the newest older ReplicaSet's
    rollback_forbidden: str | None = None
    paused: bool = False


class KubernetesApi:
    """A client of the API server that reads, and dry-runs writes without ever persisting
    one (bearer token, the cluster's CA)."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        ca_file: Path | None = None,
        timeout: float = 5.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        verify: bool | ssl.SSLContext = True if ca_file is None else ssl.create_default_context(cafile=str(ca_file))
        self.url = url.rstrip("/")
        self._client = httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
            verify=verify,
            timeout=timeout,
            transport=transport,
        )

    def get(self, path: str, **params: str) -> dict[str, Any] | None:
        """The object or list at ``path``; None when it does not exist (404)."""
        try:
            answer = self._client.get(path, params=params or None)
        except httpx.HTTPError as exc:
            raise EvidenceUnavailable(f"Kubernetes API {self.url} unreachable: {exc!r}") from exc
        if answer.status_code == 404:
            return None
        if not answer.is_success:
            raise EvidenceUnavailable(f"Kubernetes API GET {path}: HTTP {answer.status_code}: {answer.text[:200]}")
        body: dict[str, Any] = answer.json()
        return body

    def dry_run(self, method: str, path: str, body: Any, content_type: str) -> dict[str, Any]:
        """The object the API server would store for this write (``dryRun=All``: admission
        and validation run, nothing is persisted), so a person can be shown the exact change
        before approving it. Never writes; the token still needs the write's verb."""
        try:
            answer = self._client.request(
                method,
                path,
                params={"dryRun": "All"},
                content=json.dumps(body),
                headers={"Content-Type": content_type},
            )
        except httpx.HTTPError as exc:
            raise EvidenceUnavailable(f"Kubernetes API {self.url} unreachable: {exc!r}") from exc
        if not answer.is_success:
            raise EvidenceUnavailable(
                f"Kubernetes API {method} {path} (dry run): HTTP {answer.status_code}: {answer.text[:200]}"
            )
        written: dict[str, Any] = answer.json()
        return written

    def close(self) -> None:
        self._client.close()


def _images(template: Mapping[str, Any]) -> str:
    containers = template.get("spec", {}).get("containers", [])
    return ",".join(str(c.get("image", "?")) for c in containers) or "?"


def facts_of(rs: Mapping[str, Any]) -> RevisionFacts | None:
    """A ReplicaSet's revision number, pod-template hash and images ("container=image" in
    order); None without a revision number (a ReplicaSet no Deployment controller numbered)."""
    number = _revision_of(rs)
    if number <= 0:
        return None
    containers = rs.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])
    return RevisionFacts(
        revision=str(number),
        template_hash=rs["metadata"].get("labels", {}).get(TEMPLATE_HASH),
        images=tuple(f"{c.get('name', '?')}={c.get('image', '?')}" for c in containers),
    )


def forbidden_reason(deployment: Mapping[str, Any], running: Mapping[str, Any] | None) -> str | None:
    """Why the Deployment may not be rolled back: its own ``flotilla.dev/rollback-forbidden``
    annotation, else the running template's (a release marked so carries it); None if neither."""
    template = (running if running is not None else deployment).get("spec", {}).get("template", {})
    for marked in (
        deployment["metadata"].get("annotations") or {},
        template.get("metadata", {}).get("annotations") or {},
    ):
        reason = marked.get(ROLLBACK_FORBIDDEN)
        if reason is not None:
            return reason.strip() or "marked irreversible (no reason given)"
    return None


def _revision_of(obj: Mapping[str, Any]) -> int:
    try:
        return int(obj["metadata"].get("annotations", {}).get(REVISION, "0"))
    except ValueError:
        return 0


def _timestamp(text: str | None) -> datetime | None:
    return None if not text else datetime.fromisoformat(text.replace("Z", "+00:00"))


def rollout_of(api: KubernetesApi, namespace: str, deployment: str) -> Rollout | None:
    """The Deployment's replicas, revisions and recent events; None if it does not exist."""
    ns = quote(namespace, safe="")
    found = api.get(f"/apis/apps/v1/namespaces/{ns}/deployments/{quote(deployment, safe='')}")
    if found is None:
        return None
    uid = found["metadata"]["uid"]
    labels = found["spec"].get("selector", {}).get("matchLabels", {})
    selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
    listed = api.get(f"/apis/apps/v1/namespaces/{ns}/replicasets", labelSelector=selector) or {"items": []}
    owned = sorted(
        (rs for rs in listed["items"] if any(o.get("uid") == uid for o in rs["metadata"].get("ownerReferences", []))),
        key=_revision_of,
    )
    current_number = _revision_of(found)
    current = next((rs for rs in owned if _revision_of(rs) == current_number), owned[-1] if owned else None)
    older = [rs for rs in owned if current is not None and _revision_of(rs) < _revision_of(current)]

    def described(rs: Mapping[str, Any]) -> str:
        return f"{_images(rs['spec']['template'])} (revision {_revision_of(rs)})"

    recent = sorted(
        _events_of(api, ns, deployment, uid), key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or ""
    )
    return Rollout(
        desired=int(found["spec"].get("replicas", 1)),
        available=int(found.get("status", {}).get("availableReplicas", 0)),
        revision=described(current) if current is not None else f"{_images(found['spec']['template'])}",
        previous_revision=described(older[-1]) if older else None,
        changed_at=_timestamp(current["metadata"].get("creationTimestamp")) if current is not None and older else None,
        events=tuple(f"{e.get('reason', '?')}: {e.get('message', '')}"[:300] for e in recent[-EVENTS_KEPT:]),
        running=facts_of(current) if current is not None else None,
        rollback_candidate=facts_of(older[-1]) if older else None,
        rollback_forbidden=forbidden_reason(found, current),
        paused=bool(found["spec"].get("paused", False)),
    )


def _events_of(api: KubernetesApi, ns: str, deployment: str, uid: str) -> list[dict[str, Any]]:
    """The events about this Deployment object: by kind and uid as well as by name, since
    anyone who may create events in the namespace can write them about a Pod, a ConfigMap
    or an earlier Deployment of the same name, and their text reaches a prompt. (An event
    that names this kind, name and uid is taken as the Deployment's: who may create events
    is RBAC's to limit.)"""
    selector = f"involvedObject.kind=Deployment,involvedObject.name={deployment},involvedObject.uid={uid}"
    listed = api.get(f"/api/v1/namespaces/{ns}/events", fieldSelector=selector) or {"items": []}
    return [  # the selector again, on the answer: the evidence does not rest on the server honouring it
        e
        for e in listed["items"]
        if (about := e.get("involvedObject") or {}).get("kind") == "Deployment"
        and about.get("name") == deployment
        and about.get("uid") == uid
    ]


Placement = Callable[[str, str], tuple[str, str] | None]  # (environment, service) -> (namespace, Deployment)


def by_namespace(namespaces: Mapping[str, str]) -> Placement:
    """The Deployment named after the service, in its environment's namespace (if mapped)."""
    return lambda environment, name: (namespaces[environment], name) if environment in namespaces else None


class KubernetesEvidence:
    """``base``'s evidence, with each placeable service's Deployment read from the API server."""

    def __init__(self, base: EvidenceSource, api: KubernetesApi, placement: Placement) -> None:
        self.base = base
        self.api = api
        self.placement = placement
        self.name = f"{base.name} + {api.url}"

    def snapshot(self, around: str | None = None, *, environment: str | None = None) -> Topology:
        topology = self.base.snapshot(around, environment=environment)
        services: dict[str, ServiceView] = {}
        for name, view in topology.services.items():
            where = self.placement(view.environment, name)
            rollout = None if where is None else rollout_of(self.api, *where)
            services[name] = view if rollout is None else with_rollout(view, rollout)
        return replace(topology, services=services, source=self.name)


def with_rollout(view: ServiceView, rollout: Rollout) -> ServiceView:
    """The API server is the authority on a workload: its figures replace the metrics'."""
    return replace(
        view,
        replicas=rollout.desired,
        available_replicas=rollout.available,
        revision=rollout.revision,
        previous_revision=rollout.previous_revision,
        revision_changed_at=rollout.changed_at,
        events=rollout.events,
        running=rollout.running,
        rollback_candidate=rollout.rollback_candidate,
        rollback_forbidden=rollout.rollback_forbidden,
        paused=rollout.paused,
    )
