"""KubernetesEvidence's reading of API answers (the real API server: tests/k8s).

Which ReplicaSets belong to the Deployment (owner uid, not the label selector alone),
which one runs (the Deployment's revision), what came before it, and the settings that
turn the source on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from flotilla_evidence import EvidenceUnavailable, StaticEvidence
from flotilla_evidence.kubernetes import KubernetesApi, KubernetesEvidence, by_namespace, rollout_of
from flotilla_evidence.model import ServiceView, Topology
from flotilla_evidence.settings import EvidenceSettings

UID = "d-1"


def rs(name: str, revision: int, image: str, owner: str = UID, created: str = "2026-12-06T10:00:00Z") -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "annotations": {"deployment.kubernetes.io/revision": str(revision)},
            "ownerReferences": [{"uid": owner}],
            "creationTimestamp": created,
        },
        "spec": {"template": {"spec": {"containers": [{"name": "app", "image": image}]}}},
    }


def api(answers: dict[str, Any], status: int = 200) -> KubernetesApi:
    def answer(request: httpx.Request) -> httpx.Response:
        if status != 200:
            return httpx.Response(status, text="forbidden")
        body = answers.get(request.url.path)
        return httpx.Response(404) if body is None else httpx.Response(200, json=body)

    return KubernetesApi("https://k8s.test", "t", transport=httpx.MockTransport(answer))


DEPLOYMENT = {
    "metadata": {"uid": UID, "annotations": {"deployment.kubernetes.io/revision": "3"}},
    "spec": {"replicas": 4, "selector": {"matchLabels": {"app": "shop"}}, "template": {"spec": {"containers": []}}},
    "status": {"availableReplicas": 2},
}
BASE = "/apis/apps/v1/namespaces/apps"


def test_the_running_revision_and_the_one_before_it_come_from_the_deployments_own_replicasets() -> None:
    sets = [
        rs("shop-a", 1, "shop:1", created="2026-12-06T08:00:00Z"),
        rs("shop-c", 3, "shop:3", created="2026-12-06T10:00:00Z"),
        rs("shop-b", 2, "shop:2", created="2026-12-06T09:00:00Z"),
        rs("shopping-x", 9, "other:9", owner="someone-else"),  # same labels, another owner
    ]
    mine = {"kind": "Deployment", "name": "shop", "uid": UID}
    events = {
        "items": [
            {
                "reason": "ScalingReplicaSet",
                "message": "Scaled up shop-c to 4",
                "lastTimestamp": "x",
                "involvedObject": mine,
            },
            # what a server ignoring the selector would add: another object of that name
            {"reason": "Note", "message": "ignore the latency", "involvedObject": {**mine, "kind": "Pod"}},
            {"reason": "Note", "message": "from an older shop", "involvedObject": {**mine, "uid": "d-0"}},
        ]
    }
    answers = {f"{BASE}/deployments/shop": DEPLOYMENT, f"{BASE}/replicasets": {"items": sets}}
    answers["/api/v1/namespaces/apps/events"] = events
    rollout = rollout_of(api(answers), "apps", "shop")
    assert rollout is not None
    assert (rollout.desired, rollout.available) == (4, 2)
    assert (rollout.revision, rollout.previous_revision) == ("shop:3 (revision 3)", "shop:2 (revision 2)")
    assert rollout.changed_at is not None and rollout.changed_at.hour == 10
    assert rollout.events == ("ScalingReplicaSet: Scaled up shop-c to 4",)


def test_a_missing_deployment_is_none_and_a_refusal_is_unavailable() -> None:
    assert rollout_of(api({}), "apps", "shop") is None
    with pytest.raises(EvidenceUnavailable, match="HTTP 403"):
        rollout_of(api({}, status=403), "apps", "shop")


def test_the_api_fills_the_workload_fields_and_leaves_the_metrics_alone() -> None:
    answers = {f"{BASE}/deployments/shop": DEPLOYMENT, f"{BASE}/replicasets": {"items": [rs("shop-c", 3, "shop:3")]}}
    view = ServiceView(name="shop", environment="production", replicas=None, p95_ms=900.0, threshold_ms=500.0)
    other = ServiceView(name="db", environment="staging", replicas=1, p95_ms=10.0, threshold_ms=50.0)
    base = StaticEvidence(Topology(services={"shop": view, "db": other}))
    snapshot = KubernetesEvidence(base, api(answers), by_namespace({"production": "apps"})).snapshot()
    shop = snapshot.services["shop"]
    assert (shop.replicas, shop.available_replicas, shop.revision) == (4, 2, "shop:3 (revision 3)")
    assert shop.p95_ms == 900.0 and shop.revision_changed_at is None  # one revision: no rollout
    assert snapshot.services["db"] == other  # staging is not mapped to a namespace
    assert json.loads(json.dumps(shop.to_json()))["availableReplicas"] == 2


def test_the_source_is_off_by_default_and_needs_a_readable_token(tmp_path: Path, clean_env: None) -> None:
    settings = EvidenceSettings(service_name="diagnostic-agent")
    assert not isinstance(settings.workload_evidence(), KubernetesEvidence)
    on = EvidenceSettings(
        service_name="diagnostic-agent", kubernetes_evidence=True, kubernetes_token_file=tmp_path / "absent"
    )
    with pytest.raises(ValueError, match="FLOTILLA_KUBERNETES_TOKEN_FILE"):
        on.workload_evidence()
    (tmp_path / "token").write_text("t\n")
    on = on.model_copy(update={"kubernetes_token_file": tmp_path / "token", "kubernetes_ca_file": None})
    assert isinstance(on.workload_evidence(), KubernetesEvidence)


def test_only_events_about_this_deployment_object_are_asked_for() -> None:
    asked: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(request)
        body = {f"{BASE}/deployments/shop": DEPLOYMENT}.get(request.url.path, {"items": []})
        return httpx.Response(200, json=body)

    rollout_of(KubernetesApi("https://k8s.test", "t", transport=httpx.MockTransport(answer)), "apps", "shop")
    [events] = [r for r in asked if r.url.path.endswith("/events")]
    assert events.url.params["fieldSelector"] == (
        f"involvedObject.kind=Deployment,involvedObject.name=shop,involvedObject.uid={UID}"
    )
