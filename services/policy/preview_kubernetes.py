"""The exact change of a step on Kubernetes: the API server's dry run of the executor's write.

For each step the previewer reads the Deployment the step acts on (the namespace its
environment maps to, ``FLOTILLA_KUBERNETES_NAMESPACES``, as the executor has it), asks
:func:`flotilla.actions.kubernetes.planned_write` for the write the executor would make
(the same pure planning the executor uses, so what is shown is what would be sent), and
sends that write with ``dryRun=All``: the API server runs defaulting, admission and
validation and answers with the object it would store, persisting nothing. The
:class:`~flotilla.actions.Change` between what was read and that answer is what a person
approves.

What the step cannot be shown, it says, and the decision goes on (the page shows why):
an environment with no namespace, a Deployment that is not there, a write the executor
would refuse (planned_write raises ``Refused``), a kind with no Kubernetes write.

The token needs the write's verb (``patch`` on deployments, and on the autoscalers it may
raise): Kubernetes authorizes a dry run like the write itself. This class only ever sends
``dryRun=All`` (KubernetesApi.dry_run); an admission policy that refuses the policy
service's writes without ``dryRun`` makes that a property of the cluster, not of this code.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any, Protocol, cast
from urllib.parse import quote

from flotilla_evidence import EvidenceSettings
from flotilla_evidence.kubernetes import KubernetesApi

from flotilla.actions import Change, NoPreview, by_kind
from services.policy.decide import StepFacts
from services.policy.inventory import kubernetes_client

PLANNER_MODULE = "flotilla.actions.kubernetes"


class Read(Protocol):
    def __call__(self, path: str, **params: str) -> dict[str, Any] | None: ...


class PlannedWrite(Protocol):
    """The executor's write, as :func:`planned_write` plans it (method, API path, JSON body,
    content type), and how the dry run's answer reads as the change a person approves."""

    method: str
    path: str
    body: Any
    content_type: str

    def change(self, answer: Mapping[str, Any]) -> Change: ...


class Planner(Protocol):
    def __call__(
        self, action: str, params: Mapping[str, Any], *, namespace: str, deployment: Mapping[str, Any], read: Read
    ) -> PlannedWrite | None: ...


def _planner() -> tuple[Planner, type[Exception]]:
    """``planned_write`` and ``Refused`` of flotilla.actions.kubernetes: the one planning of
    the executor's writes, shared so the preview and the write cannot drift apart."""
    try:
        module = importlib.import_module(PLANNER_MODULE)
        return cast(Planner, module.planned_write), cast(type[Exception], module.Refused)
    except (ImportError, AttributeError) as exc:
        raise ValueError(
            f"FLOTILLA_POLICY_PREVIEW=kubernetes needs {PLANNER_MODULE}.planned_write and .Refused "
            f"(the executor's write planning), which this build lacks: {exc}"
        ) from exc


class KubernetesPreviewer:
    """:class:`~services.policy.preview.ChangePreviewer` for Deployments on an API server."""

    def __init__(
        self,
        api: KubernetesApi,
        namespaces: Mapping[str, str],
        *,
        planner: Planner | None = None,
        refused: type[Exception] | None = None,
    ) -> None:
        self._api = api
        self._namespaces = dict(namespaces)
        if planner is None or refused is None:
            planner, refused = _planner()
        self._plan: Planner = planner
        self._refused: type[Exception] = refused

    @classmethod
    def from_settings(cls, settings: EvidenceSettings, *, timeout: float) -> KubernetesPreviewer:
        api, namespaces = kubernetes_client(settings, "FLOTILLA_POLICY_PREVIEW=kubernetes", timeout=timeout)
        return cls(api, namespaces)

    def preview(self, step: StepFacts) -> Change | NoPreview:
        action = by_kind(step.kind).action
        target = step.target
        namespace = self._namespaces.get(target.environment)
        if namespace is None:
            return NoPreview(f"no namespace is configured for {target.environment} (FLOTILLA_KUBERNETES_NAMESPACES)")
        ns, name = quote(namespace, safe=""), quote(target.name, safe="")
        deployment = self._api.get(f"/apis/apps/v1/namespaces/{ns}/deployments/{name}")
        if deployment is None:
            return NoPreview(
                f"Deployment {namespace}/{target.name} does not exist: the executor would refuse this step"
            )
        try:
            write = self._plan(action, step.params, namespace=namespace, deployment=deployment, read=self._api.get)
        except self._refused as exc:
            return NoPreview(f"the executor would refuse this step: {exc}")
        if write is None:
            return NoPreview(f"{action} makes no write to a Kubernetes object, so there is nothing to dry-run")
        answer = self._api.dry_run(write.method, write.path, write.body, write.content_type)
        return write.change(answer)

    def close(self) -> None:
        self._api.close()
