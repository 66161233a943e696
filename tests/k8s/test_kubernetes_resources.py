"""Pause and resume, an autoscaler's ceiling, a memory limit: on a real API server, with
the executor's own token.

The HorizontalPodAutoscaler is autoscaling/v2 as the API server serves it; the
ScaledObject is KEDA's own CRD (the lane installs it, conftest ``crds_installed``), with
no KEDA operator running: the test shows the field written, not KEDA acting on it. No
pod runs (no node): a raised ceiling is not shown scaling a workload.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from services.executor.targets import KubernetesTarget, StaleFencingToken, TargetRejected, TargetUnavailable

from .conftest import MERGE, TARGET_NAMESPACE, Cluster, apps, deployment
from .test_kubernetes_rollback import REVISION, replica_sets, wait_for, written
from .test_kubernetes_target import ENVIRONMENT, hooked, live, recorded, target, wrote

pytestmark = pytest.mark.timeout(300)

HPAS = f"/apis/autoscaling/v2/namespaces/{TARGET_NAMESPACE}/horizontalpodautoscalers"
SCALED_OBJECTS = f"/apis/keda.sh/v1alpha1/namespaces/{TARGET_NAMESPACE}/scaledobjects"
MiB = 2**20


@pytest.fixture(scope="module")
def executor_token(production: Cluster) -> str:
    return production.token_for("executor", "flotilla")


@pytest.fixture()
def name(production: Cluster) -> Iterator[str]:
    """A Deployment (2 replicas, container ``app`` limited to 256Mi, at most 768Mi
    declared) with its first revision made."""
    name = f"shop-{uuid.uuid4().hex[:8]}"
    body = deployment(name, replicas=2)
    body["metadata"]["annotations"] = {"flotilla.dev/max-memory-limit": "768Mi"}
    body["spec"]["template"]["spec"]["containers"][0]["resources"] = {"limits": {"memory": "256Mi"}}
    with production.client() as api:
        assert api.post(apps(), json=body).status_code == 201
    wait_for(production, name, ["1"])
    yield name
    with production.client() as api:
        api.delete(apps(f"/{name}"))
        api.delete(f"{HPAS}/{name}")
        api.delete(f"{SCALED_OBJECTS}/{name}")


def act(cluster: Cluster, token: str, action: str, name: str, params: dict[str, Any], key: str | None = None) -> Any:
    with target(cluster, token) as k8s:
        return k8s.apply(action, f"{ENVIRONMENT}/{name}", params, key or f"k-{uuid.uuid4()}", 3, "executor-0")


def ship(cluster: Cluster, name: str, image: str) -> None:
    """A person's release: a new image in the template."""
    release = {"spec": {"template": {"spec": {"containers": [{"name": "app", "image": image}]}}}}
    with cluster.client() as api:
        assert api.patch(apps(f"/{name}"), json=release, headers=MERGE).status_code == 200


def progressing(cluster: Cluster, name: str) -> str | None:
    conditions = live(cluster, name).get("status", {}).get("conditions") or []
    return next((c.get("reason") for c in conditions if c["type"] == "Progressing"), None)


def eventually(check: Any, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.3)


# -- pause and resume -----------------------------------------------------------------


def test_pause_stops_a_progressing_rollout_and_resume_lets_it_go_on(
    production: Cluster, executor_token: str, name: str
) -> None:
    ship(production, name, "registry.example.com/app:2")
    wait_for(production, name, ["1", "2"])  # rolling out (it never finishes: no pod runs)
    key = f"incident-8:{uuid.uuid4()}:pause:{name}"
    paused = act(production, executor_token, "pause", name, {"paused": True}, key)
    assert (paused.before, paused.after) == ({"paused": False}, {"paused": True})
    assert live(production, name)["spec"]["paused"] is True
    eventually(lambda: progressing(production, name) == "DeploymentPaused")
    assert act(production, executor_token, "pause", name, {"paused": True}, key).replayed

    ship(production, name, "registry.example.com/app:3")  # while paused: no new ReplicaSet
    time.sleep(3)
    assert len(replica_sets(production, name)) == 2

    resumed = act(production, executor_token, "pause", name, {"paused": False})
    assert (resumed.before, resumed.after) == ({"paused": True}, {"paused": False})
    found = wait_for(production, name, ["1", "2", "3"])
    assert found[-1]["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example.com/app:3"
    eventually(lambda: progressing(production, name) != "DeploymentPaused")
    history = live(production, name)["metadata"]["annotations"][KubernetesTarget.ACTIONS]
    assert history.count('"action":"pause"') == 2


# -- raise an autoscaler's ceiling ------------------------------------------------------


def hpa(name: str, target_name: str, max_replicas: int, ceiling: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if ceiling is not None:
        meta["annotations"] = {"flotilla.dev/max-replicas-ceiling": ceiling}
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": meta,
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": target_name},
            "minReplicas": 1,
            "maxReplicas": max_replicas,
            "metrics": [
                {
                    "type": "Resource",
                    "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}},
                }
            ],
        },
    }


def ceiling(kind: str, autoscaler: str, before: int, after: int) -> dict[str, Any]:
    return {"autoscalerKind": kind, "autoscaler": autoscaler, "fromMaxReplicas": before, "maxReplicas": after}


def test_an_hpa_ceiling_is_raised_within_its_bounds(production: Cluster, executor_token: str, name: str) -> None:
    with production.client() as api:
        assert api.post(HPAS, json=hpa(name, name, 4, ceiling="7")).status_code == 201
    key = f"incident-9:{uuid.uuid4()}:raise-ceiling:{name}"
    raised = act(production, executor_token, "raise-ceiling", name, ceiling("HorizontalPodAutoscaler", name, 4, 6), key)
    assert (raised.before, raised.after) == ({"maxReplicas": 4}, {"maxReplicas": 6})
    with production.client() as api:
        assert api.get(f"{HPAS}/{name}").json()["spec"]["maxReplicas"] == 6
    annotations = live(production, name)["metadata"]["annotations"]
    assert annotations[KubernetesTarget.LAST_KEY] == key and annotations[KubernetesTarget.TOKEN] == "3"
    again = act(production, executor_token, "raise-ceiling", name, ceiling("HorizontalPodAutoscaler", name, 4, 6), key)
    assert again.replayed and again.after == raised.after

    for params, fragment in (
        (ceiling("HorizontalPodAutoscaler", name, 6, 13), "more than twice"),
        (ceiling("HorizontalPodAutoscaler", name, 4, 8), "not the 4 the plan raises from"),
        (
            ceiling("HorizontalPodAutoscaler", name, 6, 8),
            r"above its declared maximum \(flotilla.dev/max-replicas-ceiling: 7\)",
        ),
        (ceiling("HorizontalPodAutoscaler", name, 6, 6), "not a raise"),
    ):
        with pytest.raises(TargetRejected, match=fragment):
            act(production, executor_token, "raise-ceiling", name, params)
    with production.client() as api:
        assert api.get(f"{HPAS}/{name}").json()["spec"]["maxReplicas"] == 6


def test_an_hpa_of_another_deployment_is_not_raised(production: Cluster, executor_token: str, name: str) -> None:
    other = f"other-{uuid.uuid4().hex[:8]}"
    with production.client() as api:
        assert api.post(HPAS, json=hpa(other, "someone-else", 4)).status_code == 201
    try:
        with pytest.raises(TargetRejected, match="not Deployment"):
            act(production, executor_token, "raise-ceiling", name, ceiling("HorizontalPodAutoscaler", other, 4, 6))
        with production.client() as api:
            assert api.get(f"{HPAS}/{other}").json()["spec"]["maxReplicas"] == 4
    finally:
        with production.client() as api:
            api.delete(f"{HPAS}/{other}")
    with pytest.raises(TargetRejected) as missing:
        act(production, executor_token, "raise-ceiling", name, ceiling("HorizontalPodAutoscaler", "nope", 4, 6))
    assert missing.value.status == 404
    assert KubernetesTarget.LAST_KEY not in (live(production, name)["metadata"].get("annotations") or {})


def test_a_crash_between_the_hpa_write_and_the_record_is_retried_to_one_raise(
    production: Cluster, executor_token: str, name: str
) -> None:
    def crash_before_the_record(request: httpx.Request, response: httpx.Response | None) -> None:
        if request.method == "PATCH" and "horizontalpodautoscalers" in request.url.path and wrote(response):
            raise httpx.ConnectError("the executor died here", request=request)

    with production.client() as api:
        assert api.post(HPAS, json=hpa(name, name, 4)).status_code == 201
    key = f"k-{uuid.uuid4()}"
    params = ceiling("HorizontalPodAutoscaler", name, 4, 8)
    with hooked(production, executor_token, crash_before_the_record) as dying, pytest.raises(TargetUnavailable):
        dying.apply("raise-ceiling", f"{ENVIRONMENT}/{name}", params, key, 5, "executor-0")
    with production.client() as api:
        assert api.get(f"{HPAS}/{name}").json()["spec"]["maxReplicas"] == 8  # applied, not recorded
    with target(production, executor_token) as k8s:
        retried = k8s.apply("raise-ceiling", f"{ENVIRONMENT}/{name}", params, key, 5, "executor-1")
    assert (retried.before, retried.after, retried.replayed) == ({"maxReplicas": 4}, {"maxReplicas": 8}, False)
    assert [h["idempotencyKey"] for h in recorded(production, name)] == [key]


def test_a_newer_holder_writing_the_hpa_fences_the_older_one_out(
    production: Cluster, executor_token: str, name: str
) -> None:
    """The older holder (5) has read the HPA and claimed the Deployment; the newer (6)
    raises the HPA before the older writes it: the older's write meets the HPA's new
    resourceVersion, it reads the Deployment again and finds itself stale."""
    with production.client() as api:
        assert api.post(HPAS, json=hpa(name, name, 4)).status_code == 201
    newer = target(production, executor_token)

    def a_newer_holder_acts(request: httpx.Request, response: httpx.Response | None) -> None:
        claim = request.method == "PATCH" and request.url.path == apps(f"/{name}")
        if claim and not acted:
            params = ceiling("HorizontalPodAutoscaler", name, 4, 5)
            acted.append(newer.apply("raise-ceiling", f"{ENVIRONMENT}/{name}", params, "k-newer", 6, "executor-1"))

    acted: list[Any] = []
    params = ceiling("HorizontalPodAutoscaler", name, 4, 8)
    with hooked(production, executor_token, a_newer_holder_acts) as old, pytest.raises(StaleFencingToken):
        old.apply("raise-ceiling", f"{ENVIRONMENT}/{name}", params, "k-older", 5, "executor-0")
    newer.close()
    with production.client() as api:
        assert api.get(f"{HPAS}/{name}").json()["spec"]["maxReplicas"] == 5  # the older's 8 never landed
    assert [h["idempotencyKey"] for h in recorded(production, name)] == ["k-newer"]


def test_a_keda_scaled_object_ceiling_is_raised(production: Cluster, executor_token: str, name: str) -> None:
    scaled = {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": name},
        "spec": {
            "scaleTargetRef": {"name": name},
            "minReplicaCount": 1,
            "maxReplicaCount": 3,
            "triggers": [{"type": "cpu", "metricType": "Utilization", "metadata": {"value": "60"}}],
        },
    }
    with production.client() as api:
        created = api.post(SCALED_OBJECTS, json=scaled)
        assert created.status_code == 201, created.text
    raised = act(production, executor_token, "raise-ceiling", name, ceiling("ScaledObject", name, 3, 5))
    assert (raised.before, raised.after) == ({"maxReplicas": 3}, {"maxReplicas": 5})
    with production.client() as api:
        assert api.get(f"{SCALED_OBJECTS}/{name}").json()["spec"]["maxReplicaCount"] == 5
    with pytest.raises(TargetRejected, match="not the 3 the plan raises from"):
        act(production, executor_token, "raise-ceiling", name, ceiling("ScaledObject", name, 3, 6))


# -- raise a memory limit ---------------------------------------------------------------


def memory(container: str, before: int, after: int) -> dict[str, Any]:
    return {"container": container, "fromMemoryLimitBytes": before, "memoryLimitBytes": after}


def test_a_memory_limit_is_raised_and_rolled_out_in_a_new_replica_set(
    production: Cluster, executor_token: str, name: str
) -> None:
    raised = act(production, executor_token, "raise-memory", name, memory("app", 256 * MiB, 512 * MiB))
    assert raised.before == {"memoryLimitBytes": 256 * MiB, "container": "app"}
    assert raised.after == {"memoryLimitBytes": 512 * MiB, "container": "app"}
    container = live(production, name)["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"] == {"memory": "512Mi"}
    found = wait_for(production, name, ["1", "2"])
    assert found[-1]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"] == "512Mi"
    assert found[-1]["metadata"]["annotations"][REVISION] == "2"


def test_a_memory_raise_out_of_bounds_or_on_a_changed_limit_is_refused(
    production: Cluster, executor_token: str, name: str
) -> None:
    before = written(live(production, name))
    for params, fragment in (
        (memory("app", 256 * MiB, 513 * MiB), "more than twice"),
        (memory("app", 128 * MiB, 256 * MiB), "not the 134217728 bytes the plan raises from"),
        (memory("sidecar", 256 * MiB, 512 * MiB), "no container 'sidecar'"),
    ):
        with pytest.raises(TargetRejected, match=fragment):
            act(production, executor_token, "raise-memory", name, params)
    act(production, executor_token, "raise-memory", name, memory("app", 256 * MiB, 512 * MiB))
    with pytest.raises(TargetRejected, match=r"above its declared maximum \(flotilla.dev/max-memory-limit: 768Mi\)"):
        act(production, executor_token, "raise-memory", name, memory("app", 512 * MiB, 1024 * MiB))
    assert written(live(production, name)) != before  # the one raise in bounds, and only it
    assert live(production, name)["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] == {
        "memory": "512Mi"
    }
