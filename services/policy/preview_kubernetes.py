"""The exact change of a step on Kubernetes: the API server's dry run of the executor's write.

For each step the previewer reads the Deployment the step acts on (the namespace its
environment maps to, ``FLOTILLA_KUBERNETES_NAMESPACES``, as the executor has it), asks
:func:`flotilla.actions.kubernetes.planned_write` for the write the executor would make
(the same pure planning KubernetesTarget uses, so what is shown is what would be sent), and
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

from collections.abc import Mapping
from urllib.parse import quote

from flotilla_evidence import EvidenceSettings
from flotilla_evidence.kubernetes import KubernetesApi

from flotilla.actions import Change, NoPreview, by_kind
from flotilla.actions.kubernetes import Refused, planned_write
from services.policy.decide import StepFacts
from services.policy.inventory import kubernetes_client


class KubernetesPreviewer:
    """:class:`~services.policy.preview.ChangePreviewer` for Deployments on an API server."""

    def __init__(self, api: KubernetesApi, namespaces: Mapping[str, str]) -> None:
        self._api = api
        self._namespaces = dict(namespaces)

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
            write = planned_write(action, step.params, namespace=namespace, deployment=deployment, read=self._api.get)
        except Refused as exc:
            return NoPreview(f"the executor would refuse this step: {exc}")
        if write is None:
            return NoPreview(f"{action} makes no write to a Kubernetes object, so there is nothing to dry-run")
        if write.done:
            return NoPreview(f"{action} is already at the wanted value: the executor would record it without writing")
        answer = self._api.dry_run(write.method, write.path, write.body, write.content_type)
        return write.change(answer)

    def close(self) -> None:
        self._api.close()
