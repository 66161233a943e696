"""The revision facts a rollback is planned with (issue 40): from the Kubernetes API's
ReplicaSets (the real API server: tests/k8s/test_kubernetes_evidence.py) and from
Prometheus' view of the sim (kube-state-metrics' paused and annotation series, the
running version and the one before it)."""

from __future__ import annotations

import json
from typing import Any

import httpx
from flotilla_evidence import StaticEvidence
from flotilla_evidence.kubernetes import KubernetesApi, KubernetesEvidence, by_namespace, facts_of, rollout_of
from flotilla_evidence.model import MAX_FACT_CHARS, MAX_IMAGES, RevisionFacts, ServiceView, Topology

from tests.unit.evidence.test_prometheus_evidence import demo_estate, evidence

UID = "8d0c1c1e-6b8f-4a4e-9d51-3f4c2b7a9e10"
BASE = "/apis/apps/v1/namespaces/shop"
FORBIDDEN = "flotilla.dev/rollback-forbidden"


def replica_set(
    revision: int, template_hash: str, images: list[tuple[str, str]], *, owner: str = UID, **annotations: str
) -> dict[str, Any]:
    """A ReplicaSet as kube-apiserver lists it for a Deployment's controller."""
    labels = {"app": "shop", "pod-template-hash": template_hash}
    return {
        "metadata": {
            "name": f"shop-{template_hash}",
            "namespace": "shop",
            "uid": f"rs-{template_hash}",
            "resourceVersion": str(1000 + revision),
            "generation": 1,
            "creationTimestamp": f"2026-12-06T1{revision}:00:00Z",
            "labels": labels,
            "annotations": {
                "deployment.kubernetes.io/desired-replicas": "3",
                "deployment.kubernetes.io/max-replicas": "4",
                "deployment.kubernetes.io/revision": str(revision),
            },
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "name": "shop",
                    "uid": owner,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels, "annotations": annotations},
                "spec": {
                    "containers": [
                        {"name": name, "image": image, "resources": {}, "imagePullPolicy": "IfNotPresent"}
                        for name, image in images
                    ],
                    "restartPolicy": "Always",
                },
            },
        },
        "status": {"replicas": 3, "readyReplicas": 3, "availableReplicas": 3, "observedGeneration": 1},
    }


def deployment(revision: int, *, paused: bool = False, **annotations: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "shop",
            "namespace": "shop",
            "uid": UID,
            "annotations": {"deployment.kubernetes.io/revision": str(revision), **annotations},
        },
        "spec": {
            "replicas": 3,
            "paused": paused,
            "selector": {"matchLabels": {"app": "shop"}},
            "template": {"metadata": {"labels": {"app": "shop"}}, "spec": {"containers": []}},
        },
        "status": {"availableReplicas": 3},
    }


def api(found: dict[str, Any], sets: list[dict[str, Any]]) -> KubernetesApi:
    answers = {f"{BASE}/deployments/shop": found, f"{BASE}/replicasets": {"kind": "ReplicaSetList", "items": sets}}

    def answer(request: httpx.Request) -> httpx.Response:
        body = answers.get(request.url.path, {"items": []})
        return httpx.Response(200, json=body)

    return KubernetesApi("https://k8s.test", "t", transport=httpx.MockTransport(answer))


SETS = [
    replica_set(3, "7c9f5d8b46", [("shop", "shop:1.5"), ("sidecar", "envoy:1.30")]),
    replica_set(1, "5d8f7c9b61", [("shop", "shop:1.3"), ("sidecar", "envoy:1.29")]),
    replica_set(2, "66b7f4d9c8", [("shop", "shop:1.4"), ("sidecar", "envoy:1.30")]),
    replica_set(7, "99aa99aa99", [("shop", "evil:1")], owner="another-deployment"),  # same labels, not ours
]


def test_the_running_revision_and_the_candidate_are_the_owned_replicasets_facts() -> None:
    rollout = rollout_of(api(deployment(3), SETS), "shop", "shop")
    assert rollout is not None
    assert rollout.running == RevisionFacts("3", "7c9f5d8b46", ("shop=shop:1.5", "sidecar=envoy:1.30"))
    assert rollout.rollback_candidate == RevisionFacts("2", "66b7f4d9c8", ("shop=shop:1.4", "sidecar=envoy:1.30"))
    assert (rollout.rollback_forbidden, rollout.paused) == (None, False)
    # the descriptive strings are unchanged beside them
    assert rollout.previous_revision == "shop:1.4,envoy:1.30 (revision 2)"


def test_a_rolled_back_deployment_runs_its_renumbered_replicaset() -> None:
    """After an undo to revision 2 the controller renumbers its ReplicaSet 4: the candidate is
    then the newest older one, revision 3."""
    sets = [replica_set(4, "66b7f4d9c8", [("shop", "shop:1.4")]), replica_set(3, "7c9f5d8b46", [("shop", "shop:1.5")])]
    rollout = rollout_of(api(deployment(4), sets), "shop", "shop")
    assert rollout is not None and rollout.running is not None and rollout.rollback_candidate is not None
    assert (rollout.running.revision, rollout.rollback_candidate.revision) == ("4", "3")


def test_rollback_is_forbidden_by_the_deployments_annotation_or_the_running_template() -> None:
    on_deployment = rollout_of(
        api(deployment(3, **{FORBIDDEN: "migration 0042 dropped a column"}), SETS), "shop", "shop"
    )
    assert on_deployment is not None and on_deployment.rollback_forbidden == "migration 0042 dropped a column"

    marked = [replica_set(3, "7c9f5d8b46", [("shop", "shop:1.5")], **{FORBIDDEN: "schema v9"}), *SETS[1:]]
    in_template = rollout_of(api(deployment(3), marked), "shop", "shop")
    assert in_template is not None and in_template.rollback_forbidden == "schema v9"

    # a mark on an older release's template does not forbid undoing the running one
    older = [SETS[0], replica_set(2, "66b7f4d9c8", [("shop", "shop:1.4")], **{FORBIDDEN: "schema v8"})]
    undoable = rollout_of(api(deployment(3), older), "shop", "shop")
    assert undoable is not None and undoable.rollback_forbidden is None

    blank = rollout_of(api(deployment(3, **{FORBIDDEN: " "}), SETS), "shop", "shop")
    assert blank is not None and blank.rollback_forbidden == "marked irreversible (no reason given)"


def test_a_paused_deployment_and_the_facts_reach_the_view_and_its_json() -> None:
    view = ServiceView(name="shop", environment="production", replicas=None, p95_ms=900.0, threshold_ms=500.0)
    base = StaticEvidence(Topology(services={"shop": view}))
    found = deployment(3, paused=True, **{FORBIDDEN: "irreversible"})
    shop = KubernetesEvidence(base, api(found, SETS), by_namespace({"production": "shop"})).snapshot().services["shop"]
    assert shop.paused is True and shop.rollback_forbidden == "irreversible"
    value = json.loads(json.dumps(shop.to_json()))
    assert value["runningRevision"] == {
        "revision": "3",
        "templateHash": "7c9f5d8b46",
        "images": ["shop=shop:1.5", "sidecar=envoy:1.30"],
    }
    assert value["rollbackCandidate"]["revision"] == "2"
    assert (value["rollbackForbidden"], value["paused"]) == ("irreversible", True)


def test_a_replicaset_without_a_revision_number_gives_no_facts() -> None:
    unnumbered = replica_set(3, "7c9f5d8b46", [("shop", "shop:1.5")])
    del unnumbered["metadata"]["annotations"]["deployment.kubernetes.io/revision"]
    assert facts_of(unnumbered) is None


def test_facts_from_a_workload_are_bounded() -> None:
    facts = RevisionFacts("3", "h\x00ash", tuple(f"c{i}=img:{i}" for i in range(MAX_IMAGES + 5)))
    assert len(facts.images) == MAX_IMAGES and facts.template_hash == "h ash"
    view = ServiceView("s", "production", 1, 1.0, 2.0, rollback_forbidden="x" * 5000 + "\n")
    assert view.rollback_forbidden is not None and len(view.rollback_forbidden) == MAX_FACT_CHARS


# -- the sim's path: Prometheus --------------------------------------------------------


def test_prometheus_gives_the_versions_as_revision_facts_with_paused_and_forbidden() -> None:
    api = demo_estate()
    api.series["kube_deployment_spec_paused"] = [
        ({"namespace": "production", "deployment": "checkout-api"}, 1.0),
        ({"namespace": "production", "deployment": "payments-api"}, 0.0),
    ]
    reason = "release v42 of checkout-api is marked irreversible (fault-2)"
    api.series["kube_deployment_annotations"] = [
        (
            {
                "namespace": "production",
                "deployment": "checkout-api",
                "annotation_flotilla_dev_rollback_forbidden": reason,
            },
            1.0,
        ),
    ]
    topology = evidence(api, graph="telemetry").snapshot("checkout-api", environment="production")
    checkout, payments = topology.services["checkout-api"], topology.services["payments-api"]
    assert (checkout.running, checkout.rollback_candidate) == (RevisionFacts("v42"), RevisionFacts("v41"))
    assert (checkout.paused, checkout.rollback_forbidden) == (True, reason)
    assert (payments.running, payments.rollback_candidate) == (RevisionFacts("v17"), None)  # one version seen
    assert (payments.paused, payments.rollback_forbidden) == (False, None)
    assert topology.services["inventory-db"].paused is None  # no series for it: unknown
    # asked with the replicas, in the same request, scoped to the neighbourhood's Deployments
    [bundle] = [q for q in api.asked if "kube_deployment_spec_paused" in q]
    assert "kube_deployment_annotations" in bundle and "kube_deployment_spec_replicas" in bundle


def test_a_version_s_image_is_read_from_the_otel_container_attributes_on_target_info() -> None:
    from flotilla_evidence.estate import _image_of

    labels = {"service_name": "checkout-api", "container_image_name": "shop", "container_image_tags": '["1.5","x"]'}
    assert _image_of(labels, "checkout-api") == "checkout-api=shop:1.5"
    assert _image_of({**labels, "k8s_container_name": "app"}, "checkout-api") == "app=shop:1.5"
    assert _image_of({"container_image_name": "shop"}, "web") == "web=shop"
    assert _image_of({"service_name": "web"}, "web") is None
