"""RBAC as deployed: the production overlay applied for real, then each member's own token.

The executor's ServiceAccount may do exactly what ``KubernetesTarget`` calls
(infra/k8s/overlays/production/executor-rbac.yaml) in the namespace it serves: its
Deployments, their ReplicaSets (listed, for a rollback) and the autoscalers whose ceiling
it raises (an HPA, a KEDA ScaledObject); and gets 403 on everything else; the diagnostic agent's may read exactly what
``KubernetesEvidence`` reads (diagnostic-rbac.yaml), and write nothing; the policy
service's may get a Deployment (policy-rbac.yaml: the 2x rule's replica count) and read and
dry-run what a preview of the executor's write needs, and a real write of it is denied by
the admission policy (policy-dry-run-only.yaml), which leaves the executor's writes alone.
They are the three members whose pods mount a token. Every other member's ServiceAccount may do nothing at
all with the API: a token requested for it (as anyone who can create pods under it
could) reads and writes nothing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from .conftest import FLEET_NAMESPACE, MERGE, TARGET_NAMESPACE, Cluster, apps, deployment

pytestmark = pytest.mark.timeout(300)

RBAC = "rbac.authorization.k8s.io/v1"
ADMIN_BINDING = {
    "metadata": {"name": "x"},
    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
    "subjects": [{"kind": "ServiceAccount", "name": "executor", "namespace": FLEET_NAMESPACE}],
}
ANNOTATE = {"metadata": {"annotations": {"flotilla.dev/probe": "1"}}}

REPLICASETS = f"/apis/apps/v1/namespaces/{TARGET_NAMESPACE}/replicasets"
HPAS = "/apis/autoscaling/v2/namespaces/{}/horizontalpodautoscalers"
SCALED_OBJECTS = "/apis/keda.sh/v1alpha1/namespaces/{}/scaledobjects"

# (what, method, url, body): every call KubernetesTarget makes (services/executor/targets/kubernetes.py)
EXECUTOR_NEEDS = [
    ("get a deployment", "GET", apps("/checkout-api"), None),
    ("list deployments (lookup)", "GET", apps(), None),
    ("patch a deployment (claim, record, restart, pause, rollback, memory)", "PATCH", apps("/checkout-api"), ANNOTATE),
    ("patch the scale", "PATCH", apps("/checkout-api/scale"), {"spec": {"replicas": 1}}),
    ("list replicasets (rollback)", "GET", REPLICASETS, None),
    ("get an hpa", "GET", HPAS.format(TARGET_NAMESPACE) + "/checkout-api", None),
    ("patch an hpa (raise-ceiling)", "PATCH", HPAS.format(TARGET_NAMESPACE) + "/checkout-api", ANNOTATE),
    ("get a scaledobject", "GET", SCALED_OBJECTS.format(TARGET_NAMESPACE) + "/checkout-api", None),
    (
        "patch a scaledobject (raise-ceiling)",
        "PATCH",
        SCALED_OBJECTS.format(TARGET_NAMESPACE) + "/checkout-api",
        ANNOTATE,
    ),
]

# Everything else a compromised executor might try.
NOT_FOR_ANYONE = [
    ("read a secret in the target namespace", "GET", f"/api/v1/namespaces/{TARGET_NAMESPACE}/secrets/database", None),
    ("list secrets in the target namespace", "GET", f"/api/v1/namespaces/{TARGET_NAMESPACE}/secrets", None),
    ("read secrets of its own namespace", "GET", f"/api/v1/namespaces/{FLEET_NAMESPACE}/secrets", None),
    ("get a deployment of another namespace", "GET", apps("/checkout-api", "elsewhere"), None),
    ("list deployments of another namespace", "GET", apps(namespace="elsewhere"), None),
    ("patch a deployment of another namespace", "PATCH", apps("/checkout-api", "elsewhere"), ANNOTATE),
    ("scale in another namespace", "PATCH", apps("/checkout-api/scale", "elsewhere"), {"spec": {"replicas": 9}}),
    ("scale its own fleet", "PATCH", apps("/checkout-api/scale", FLEET_NAMESPACE), {"spec": {"replicas": 0}}),
    ("create a deployment", "POST", apps(), {**deployment("miner")}),
    ("replace a deployment (update)", "PUT", apps("/checkout-api"), None),
    ("delete a deployment", "DELETE", apps("/checkout-api"), None),
    ("delete every deployment", "DELETE", apps(), None),
    ("read the scale subresource", "GET", apps("/checkout-api/scale"), None),
    ("get a replicaset", "GET", f"{REPLICASETS}/x", None),
    ("patch a replicaset", "PATCH", f"{REPLICASETS}/x", ANNOTATE),
    ("delete replicasets", "DELETE", REPLICASETS, None),
    ("list replicasets of another namespace", "GET", "/apis/apps/v1/namespaces/elsewhere/replicasets", None),
    ("list hpas", "GET", HPAS.format(TARGET_NAMESPACE), None),
    ("create an hpa", "POST", HPAS.format(TARGET_NAMESPACE), {"metadata": {"name": "miner"}}),
    ("delete an hpa", "DELETE", HPAS.format(TARGET_NAMESPACE) + "/checkout-api", None),
    ("patch an hpa of another namespace", "PATCH", HPAS.format("elsewhere") + "/checkout-api", ANNOTATE),
    ("list scaledobjects", "GET", SCALED_OBJECTS.format(TARGET_NAMESPACE), None),
    ("delete a scaledobject", "DELETE", SCALED_OBJECTS.format(TARGET_NAMESPACE) + "/checkout-api", None),
    (
        "patch a scaledobject of another namespace",
        "PATCH",
        SCALED_OBJECTS.format("elsewhere") + "/checkout-api",
        ANNOTATE,
    ),
    (
        "patch a scaledobject's status",
        "PATCH",
        SCALED_OBJECTS.format(TARGET_NAMESPACE) + "/checkout-api/status",
        ANNOTATE,
    ),
    ("list pods", "GET", f"/api/v1/namespaces/{TARGET_NAMESPACE}/pods", None),
    ("exec into a pod", "POST", f"/api/v1/namespaces/{TARGET_NAMESPACE}/pods/x/exec", None),
    ("list namespaces", "GET", "/api/v1/namespaces", None),
    ("grant itself a role", "POST", f"/apis/{RBAC}/namespaces/{TARGET_NAMESPACE}/rolebindings", ADMIN_BINDING),
]


@pytest.fixture(scope="module", autouse=True)
def autoscalers(production: Cluster) -> Iterator[None]:
    """An HPA and a ScaledObject of checkout-api, so that an allowed get or patch answers
    200 (not 404)."""
    hpa = {
        "metadata": {"name": "checkout-api"},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "checkout-api"},
            "maxReplicas": 4,
        },
    }
    scaled = {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": "checkout-api"},
        "spec": {
            "scaleTargetRef": {"name": "checkout-api"},
            "triggers": [{"type": "cpu", "metricType": "Utilization", "metadata": {"value": "60"}}],
        },
    }
    with production.client() as api:
        for url, body in ((HPAS, hpa), (SCALED_OBJECTS, scaled)):
            for namespace in (TARGET_NAMESPACE, "elsewhere"):
                answer = api.post(url.format(namespace), json=body)
                assert answer.status_code in (201, 409), answer.text
    yield


def call(cluster: Cluster, token: str, method: str, url: str, body: Any) -> int:
    with cluster.client(token) as api:
        if method == "PATCH":
            return api.patch(url, json=body, headers=MERGE).status_code
        if method == "PUT":
            with cluster.client() as admin:
                body = admin.get(url).json()  # the current object, as a real update would send
        return api.request(method, url, json=body).status_code


def test_the_executor_can_do_what_kubernetes_target_needs(production: Cluster) -> None:
    token = production.token_for("executor", FLEET_NAMESPACE)
    answers = {what: call(production, token, method, url, body) for what, method, url, body in EXECUTOR_NEEDS}
    assert answers == {what: 200 for what, *_ in EXECUTOR_NEEDS}


def test_the_executor_gets_403_on_everything_else(production: Cluster) -> None:
    token = production.token_for("executor", FLEET_NAMESPACE)
    answers = {what: call(production, token, method, url, body) for what, method, url, body in NOT_FOR_ANYONE}
    assert answers == {what: 403 for what, *_ in NOT_FOR_ANYONE}


def test_only_the_executor_the_diagnostic_agent_and_the_policy_service_mount_a_token(production: Cluster) -> None:
    mounted = set()
    for obj in production.render("overlays/production"):
        if obj["kind"] in ("Deployment", "Job"):
            spec = obj["spec"]["template"]["spec"]
            if spec.get("automountServiceAccountToken", True):
                mounted.add(spec.get("serviceAccountName", "default"))
    assert mounted == {"executor", "diagnostic-agent", "policy-service"}


@pytest.mark.parametrize(
    "member",
    ["health-agent", "remediation-agent", "audit", "dlq-reconciler", "console"],
)
def test_every_other_member_can_do_nothing(production: Cluster, member: str) -> None:
    token = production.token_for(member, FLEET_NAMESPACE)
    tried = NOT_FOR_ANYONE + EXECUTOR_NEEDS
    answers = {what: call(production, token, method, url, body) for what, method, url, body in tried}
    assert answers == {what: 403 for what, *_ in tried}


# Every call KubernetesEvidence makes (libs/flotilla_evidence/kubernetes.py)
DIAGNOSTIC_NEEDS = [
    ("get a deployment", "GET", apps("/checkout-api"), None),
    ("list replicasets", "GET", REPLICASETS, None),
    ("list events", "GET", f"/api/v1/namespaces/{TARGET_NAMESPACE}/events", None),
]


def test_the_diagnostic_agent_reads_deployments_and_writes_nothing(production: Cluster) -> None:
    token = production.token_for("diagnostic-agent", FLEET_NAMESPACE)
    allowed = {what: call(production, token, method, url, body) for what, method, url, body in DIAGNOSTIC_NEEDS}
    assert allowed == {what: 200 for what, *_ in DIAGNOSTIC_NEEDS}
    writes = [t for t in EXECUTOR_NEEDS if t[0] not in ("get a deployment", "list replicasets (rollback)")]
    writes += NOT_FOR_ANYONE
    denied = {what: call(production, token, method, url, body) for what, method, url, body in writes}
    assert denied == {what: 403 for what, *_ in writes}


# Every call of the policy service: KubernetesInventory's get (the 2x rule's count) and
# KubernetesPreviewer's reads and dry runs (services/policy/preview_kubernetes.py).
PREVIEWED = {"metadata": {"annotations": {"flotilla.dev/previewed": "1"}}}  # never lands
DRY_RUNS = [
    ("dry-run a deployment patch", apps("/checkout-api"), PREVIEWED),
    ("dry-run a scale", apps("/checkout-api/scale"), {"spec": {"replicas": 1}}),
    ("dry-run an hpa patch", HPAS.format(TARGET_NAMESPACE) + "/checkout-api", PREVIEWED),
    ("dry-run a scaledobject patch", SCALED_OBJECTS.format(TARGET_NAMESPACE) + "/checkout-api", PREVIEWED),
]
POLICY_READS = [
    ("get a deployment", "GET", apps("/checkout-api"), None),
    ("list replicasets (rollback)", "GET", REPLICASETS, None),
    ("get an hpa", "GET", HPAS.format(TARGET_NAMESPACE) + "/checkout-api", None),
    ("get a scaledobject", "GET", SCALED_OBJECTS.format(TARGET_NAMESPACE) + "/checkout-api", None),
]
DENIED_BY = "flotilla-policy-service-dry-run-only"  # infra/k8s/overlays/production/policy-dry-run-only.yaml


def dry_run(cluster: Cluster, token: str, url: str, body: Any) -> httpx.Response:
    with cluster.client(token) as api:
        return api.patch(url, params={"dryRun": "All"}, json=body, headers=MERGE)


def real_patch(cluster: Cluster, token: str, url: str, body: Any) -> httpx.Response:
    with cluster.client(token) as api:
        return api.patch(url, json=body, headers=MERGE)


def assert_nothing_previewed_landed(cluster: Cluster) -> None:
    with cluster.client() as admin:
        for _, url, body in DRY_RUNS:
            if body is PREVIEWED:
                assert "flotilla.dev/previewed" not in (admin.get(url).json()["metadata"].get("annotations") or {})


def test_the_policy_service_reads_and_dry_runs_what_a_preview_needs(production: Cluster) -> None:
    token = production.token_for("policy-service", FLEET_NAMESPACE)
    reads = {what: call(production, token, method, url, body) for what, method, url, body in POLICY_READS}
    assert reads == {what: 200 for what, *_ in POLICY_READS}
    dry = {what: dry_run(production, token, url, body).status_code for what, url, body in DRY_RUNS}
    assert dry == {what: 200 for what, *_ in DRY_RUNS}
    assert_nothing_previewed_landed(production)


def test_the_policy_services_real_writes_are_denied_by_the_admission_policy(production: Cluster) -> None:
    """RBAC allows the patch (a dry run needs the verb); the admission policy denies it
    unless it is a dry run. The policy needs a moment after it is created to take effect."""
    token = production.token_for("policy-service", FLEET_NAMESPACE)
    deadline = time.monotonic() + 30
    while (answer := real_patch(production, token, *DRY_RUNS[0][1:])).status_code == 200:
        assert time.monotonic() < deadline, "the admission policy never denied the policy service's real patch"
        time.sleep(0.5)
    denied = {what: real_patch(production, token, url, body) for what, url, body in DRY_RUNS}
    assert {what: a.status_code for what, a in denied.items()} == {what: 403 for what, *_ in DRY_RUNS}
    assert all(DENIED_BY in a.text and "only dry-run" in a.text for a in denied.values()), answer.text
    assert_nothing_previewed_landed(production)


def test_the_policy_service_gets_403_on_everything_else(production: Cluster) -> None:
    token = production.token_for("policy-service", FLEET_NAMESPACE)
    allowed = {what for what, *_ in POLICY_READS} | {
        "patch a deployment (claim, record, restart, pause, rollback, memory)",
        "patch the scale",
        "patch an hpa (raise-ceiling)",
        "patch a scaledobject (raise-ceiling)",
    }  # the patches: allowed by RBAC, denied by the admission policy (test above)
    tried = [t for t in EXECUTOR_NEEDS + NOT_FOR_ANYONE if t[0] not in allowed]
    answers = {what: call(production, token, method, url, body) for what, method, url, body in tried}
    assert answers == {what: 403 for what, *_ in tried}


def test_the_admission_policy_leaves_the_executors_writes_alone(production: Cluster) -> None:
    token = production.token_for("executor", FLEET_NAMESPACE)
    written = {what: real_patch(production, token, url, body).status_code for what, url, body in DRY_RUNS}
    assert written == {what: 200 for what, *_ in DRY_RUNS}
