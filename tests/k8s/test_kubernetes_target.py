"""The executor's ``KubernetesTarget`` against real Deployments, with the executor's own token.

The unit lane drives it against recorded API answers (tests/unit/services/test_targets.py);
here the API server answers: its resourceVersion preconditions on a merge patch and on
the scale subresource, its 404s and 409s, and the controller manager turning a scale or
a restart into ReplicaSets. Between the target's requests a test can act through a
transport that wraps the real one: another writer, a crash, the API server stopped.
"""

from __future__ import annotations

import json
import ssl
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from services.executor.targets import KubernetesTarget, StaleFencingToken, TargetRejected, TargetUnavailable

from .conftest import FLEET_NAMESPACE, MERGE, TARGET_NAMESPACE, Cluster, apps, controlplane, deployment

pytestmark = pytest.mark.timeout(300)

ENVIRONMENT = "production"


@pytest.fixture(scope="module")
def executor_token(production: Cluster) -> str:
    return production.token_for("executor", FLEET_NAMESPACE)


@pytest.fixture()
def name(production: Cluster) -> Iterator[str]:
    """A Deployment of its own for each test (2 replicas), in the namespace the executor serves."""
    name = f"shop-{uuid.uuid4().hex[:8]}"
    with production.client() as api:
        created = api.post(apps(), json=deployment(name, replicas=2))
        assert created.status_code == 201, created.text
    yield name
    with production.client() as api:
        api.delete(apps(f"/{name}"))


class Between(httpx.HTTPTransport):
    """The real transport, with ``hook(request, response)`` run after each exchange (the
    response is ``None`` when the hook should run instead of sending)."""

    def __init__(self, ca: str, hook: Callable[[httpx.Request, httpx.Response | None], None]) -> None:
        super().__init__(verify=ssl.create_default_context(cafile=ca))
        self.hook = hook
        self.patches: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if request.method == "PATCH":
            self.patches.append(request.url.path)
        self.hook(request, response)
        return response


def wrote(response: httpx.Response | None) -> bool:
    """Whether the API server took the write. A test that loses the answer to a write must
    lose a write that happened: a new Deployment's controllers still update it, so the
    target's first patch may meet a 409 (nothing written) and be retried."""
    return response is not None and response.is_success


def target(cluster: Cluster, token: str, transport: httpx.BaseTransport | None = None) -> KubernetesTarget:
    return KubernetesTarget(cluster.url, token, {ENVIRONMENT: TARGET_NAMESPACE}, str(cluster.ca), transport=transport)


def hooked(
    cluster: Cluster, token: str, hook: Callable[[httpx.Request, httpx.Response | None], None]
) -> KubernetesTarget:
    """A target whose every exchange with the API server is followed by ``hook``."""
    return target(cluster, token, Between(str(cluster.ca), hook))


def live(cluster: Cluster, name: str) -> dict[str, Any]:
    with cluster.client() as api:
        answer = api.get(apps(f"/{name}"))
        assert answer.status_code == 200, answer.text
        body: dict[str, Any] = answer.json()
        return body


def recorded(cluster: Cluster, name: str) -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = json.loads(
        live(cluster, name)["metadata"].get("annotations", {}).get(KubernetesTarget.ACTIONS, "[]")
    )
    return history


def replica_sets(cluster: Cluster, name: str, timeout: float = 60, *, at_least: int = 1) -> list[dict[str, Any]]:
    """The Deployment's ReplicaSets, once the controller manager has made ``at_least``."""
    deadline = time.monotonic() + timeout
    while True:
        with cluster.client() as api:
            items = api.get(f"/apis/apps/v1/namespaces/{TARGET_NAMESPACE}/replicasets?labelSelector=app%3D{name}")
        found: list[dict[str, Any]] = items.json()["items"]
        if len(found) >= at_least or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def test_scale_changes_the_deployment_and_the_controller_follows(
    production: Cluster, executor_token: str, name: str
) -> None:
    key = f"incident-1:{uuid.uuid4()}:scale:{name}:5"
    with target(production, executor_token) as k8s:
        result = k8s.apply("scale", f"{ENVIRONMENT}/{name}", {"replicas": 5}, key, 3, "executor-0")
    assert (result.before, result.after, result.replayed) == ({"replicas": 2}, {"replicas": 5}, False)
    annotations = live(production, name)["metadata"]["annotations"]
    assert live(production, name)["spec"]["replicas"] == 5
    assert annotations[KubernetesTarget.TOKEN] == "3" and annotations[KubernetesTarget.LAST_KEY] == key
    assert [h["idempotencyKey"] for h in recorded(production, name)] == [key]
    deadline = time.monotonic() + 60
    while replica_sets(production, name)[0]["spec"]["replicas"] != 5:  # the ReplicaSet controller saw it
        assert time.monotonic() < deadline, replica_sets(production, name)
        time.sleep(0.5)


def test_restart_rolls_the_deployment_out_again(production: Cluster, executor_token: str, name: str) -> None:
    assert len(replica_sets(production, name)) == 1
    key = f"incident-2:{uuid.uuid4()}:restart:{name}"
    with target(production, executor_token) as k8s:
        result = k8s.apply("restart", f"{ENVIRONMENT}/{name}", {"rolling": True}, key, 4, "executor-0")
    template = live(production, name)["spec"]["template"]["metadata"]["annotations"]
    assert template[KubernetesTarget.RESTARTED_AT] == result.after["restartedAt"]
    revisions = replica_sets(production, name, at_least=2)
    assert len(revisions) == 2, "the restart made no new ReplicaSet"
    assert sorted(rs["metadata"]["annotations"]["deployment.kubernetes.io/revision"] for rs in revisions) == ["1", "2"]


def test_a_replayed_key_changes_nothing(production: Cluster, executor_token: str, name: str) -> None:
    key = f"incident-3:{uuid.uuid4()}:scale:{name}:4"
    with target(production, executor_token) as k8s:
        first = k8s.apply("scale", f"{ENVIRONMENT}/{name}", {"replicas": 4}, key, 3, "executor-0")
        version = live(production, name)["metadata"]["resourceVersion"]
        again = k8s.apply("scale", f"{ENVIRONMENT}/{name}", {"replicas": 4}, key, 3, "executor-1")
    assert again.replayed and again.after == first.after
    assert live(production, name)["metadata"]["resourceVersion"] == version  # not even a write
    assert len(recorded(production, name)) == 1


def test_a_stale_fencing_token_is_refused_and_changes_nothing(
    production: Cluster, executor_token: str, name: str
) -> None:
    with target(production, executor_token) as k8s:
        k8s.apply("scale", f"{ENVIRONMENT}/{name}", {"replicas": 3}, f"k-{uuid.uuid4()}", 9, "executor-new")
        with pytest.raises(StaleFencingToken) as stale:
            k8s.apply("scale", f"{ENVIRONMENT}/{name}", {"replicas": 7}, f"k-{uuid.uuid4()}", 8, "executor-old")
    assert (stale.value.token, stale.value.newest) == (8, 9)
    assert live(production, name)["spec"]["replicas"] == 3


def test_a_writer_between_claim_and_scale_makes_the_target_read_again(
    production: Cluster, executor_token: str, name: str
) -> None:
    def someone_edits(request: httpx.Request, response: httpx.Response | None) -> None:
        if request.method == "PATCH" and request.url.path == apps(f"/{name}") and not written:
            written.append(True)
            with production.client() as admin:  # kubectl label, say, by a person
                edit = {"metadata": {"labels": {"team": "payments"}}}
                assert admin.patch(apps(f"/{name}"), json=edit, headers=MERGE).status_code == 200

    written: list[bool] = []
    transport = Between(str(production.ca), someone_edits)
    with target(production, executor_token, transport) as k8s:
        result = k8s.apply("scale", f"{ENVIRONMENT}/{name}", {"replicas": 6}, f"k-{uuid.uuid4()}", 5, "executor-0")
    # claim, scale refused (409: the claim's resourceVersion is gone), claim, scale, record
    assert transport.patches == [apps(f"/{name}"), apps(f"/{name}/scale")] * 2 + [apps(f"/{name}")]
    assert result.after == {"replicas": 6} and live(production, name)["spec"]["replicas"] == 6
    assert live(production, name)["metadata"]["labels"]["team"] == "payments"  # the other write stands


def test_a_newer_holder_between_claim_and_scale_fences_the_older_one_out(
    production: Cluster, executor_token: str, name: str
) -> None:
    newer = target(production, executor_token)

    def a_newer_holder_acts(request: httpx.Request, response: httpx.Response | None) -> None:
        if request.method == "PATCH" and request.url.path == apps(f"/{name}") and not acted:
            acted.append(newer.apply("scale", f"{ENVIRONMENT}/{name}", {"replicas": 1}, "k-newer", 6, "executor-1"))

    acted: list[Any] = []
    with hooked(production, executor_token, a_newer_holder_acts) as old, pytest.raises(StaleFencingToken):
        old.apply("scale", f"{ENVIRONMENT}/{name}", {"replicas": 9}, "k-older", 5, "executor-0")
    newer.close()
    assert live(production, name)["spec"]["replicas"] == 1  # the older holder's 9 never landed
    assert [h["idempotencyKey"] for h in recorded(production, name)] == ["k-newer"]


def test_a_crash_between_scaling_and_recording_is_retried_with_the_same_key_to_one_effect(
    production: Cluster, executor_token: str, name: str
) -> None:
    def crash_before_the_record(request: httpx.Request, response: httpx.Response | None) -> None:
        if request.method == "PATCH" and request.url.path.endswith("/scale") and wrote(response):
            raise httpx.ConnectError("the executor died here", request=request)

    key = f"k-{uuid.uuid4()}"
    with hooked(production, executor_token, crash_before_the_record) as dying, pytest.raises(TargetUnavailable):
        dying.apply("scale", f"{ENVIRONMENT}/{name}", {"replicas": 4}, key, 5, "executor-0")
    assert live(production, name)["spec"]["replicas"] == 4  # applied, not recorded
    with target(production, executor_token) as k8s:
        assert k8s.lookup(key) is None  # so lookup cannot tell; the same key is retried
        result = k8s.apply("scale", f"{ENVIRONMENT}/{name}", {"replicas": 4}, key, 5, "executor-1")
        assert k8s.lookup(key) == result.__class__.from_json({**result.to_json(), "replayed": False})
    assert result.after == {"replicas": 4} and live(production, name)["spec"]["replicas"] == 4
    assert [h["idempotencyKey"] for h in recorded(production, name)] == [key]


def test_a_restart_whose_answer_was_lost_is_found_by_lookup(
    production: Cluster, executor_token: str, name: str
) -> None:
    def answer_lost(request: httpx.Request, response: httpx.Response | None) -> None:
        if request.method == "PATCH" and wrote(response):
            raise httpx.ReadError("connection reset after the write", request=request)

    # The first revision exists before the restart (a controller that has not synced the
    # new Deployment yet would make one ReplicaSet of the restarted template, not two).
    assert len(replica_sets(production, name)) == 1
    key = f"k-{uuid.uuid4()}"
    with hooked(production, executor_token, answer_lost) as k8s, pytest.raises(TargetUnavailable):
        k8s.apply("restart", f"{ENVIRONMENT}/{name}", {"rolling": True}, key, 5, "executor-0")
    with target(production, executor_token) as k8s:
        found = k8s.lookup(key)
        assert found is not None and found.action == "restart" and found.resource == f"{ENVIRONMENT}/{name}"
        replay = k8s.apply("restart", f"{ENVIRONMENT}/{name}", {"rolling": True}, key, 5, "executor-1")
    assert replay.replayed
    assert len(replica_sets(production, name, at_least=2)) == 2  # one restart, not two


def test_a_deployment_that_does_not_exist_is_refused(production: Cluster, executor_token: str) -> None:
    with target(production, executor_token) as k8s, pytest.raises(TargetRejected) as refused:
        k8s.apply("scale", f"{ENVIRONMENT}/no-such-shop", {"replicas": 2}, f"k-{uuid.uuid4()}", 1, "executor-0")
    assert refused.value.status == 404


def test_the_api_server_stopped_mid_action_then_the_retry_applies_once(
    production: Cluster, executor_token: str, name: str
) -> None:
    def stop_the_api_server(request: httpx.Request, response: httpx.Response | None) -> None:
        if request.method == "PATCH" and request.url.path == apps(f"/{name}") and not stopped:
            stopped.append(True)
            pid = controlplane.pid_of("kube-apiserver")
            assert pid is not None
            controlplane.down_one("kube-apiserver")

    stopped: list[bool] = []
    key = f"k-{uuid.uuid4()}"
    try:
        with hooked(production, executor_token, stop_the_api_server) as k8s, pytest.raises(TargetUnavailable):
            k8s.apply("scale", f"{ENVIRONMENT}/{name}", {"replicas": 8}, key, 5, "executor-0")
    finally:
        controlplane.up()  # the API server back; etcd kept everything
    assert live(production, name)["spec"]["replicas"] == 2  # claimed, not scaled
    with target(production, executor_token) as k8s:
        result = k8s.apply("scale", f"{ENVIRONMENT}/{name}", {"replicas": 8}, key, 5, "executor-0")
        again = k8s.apply("scale", f"{ENVIRONMENT}/{name}", {"replicas": 8}, key, 5, "executor-0")
    assert result.after == {"replicas": 8} and again.replayed
    assert live(production, name)["spec"]["replicas"] == 8
    assert [h["idempotencyKey"] for h in recorded(production, name)] == [key]
