"""The executor's action targets.

``SimTarget`` is tested against the sim app served by uvicorn on a loopback port.
``KubernetesTarget`` is tested against a small fake of the Kubernetes API (below): GET
and merge-PATCH of Deployments and their scale subresource, with resourceVersion
preconditions and 409 conflicts. It is *not* tested against a real cluster.
"""

from __future__ import annotations

import copy
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from services.executor.targets import (
    ActionResult,
    ActionTarget,
    KubernetesTarget,
    SimTarget,
    StaleFencingToken,
    TargetRejected,
    TargetUnavailable,
)
from services.sim import create_sim_app

CHECKOUT = "checkout-api"
KEY = "incident-204:scale:12"


def serve(app: FastAPI) -> Iterator[str]:
    """Serve ``app`` on a free loopback port from a thread; yield its base URL."""
    # proto=IPPROTO_TCP, or asyncio skips TCP_NODELAY on accepted connections and every
    # request waits out a 40 ms delayed ACK
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# -- ActionResult --------------------------------------------------------------------


def test_action_result_round_trips_the_wire_shape() -> None:
    wire = {
        "idempotencyKey": KEY,
        "action": "scale",
        "resource": "production/checkout-api",
        "status": "applied",
        "before": {"replicas": 4},
        "after": {"replicas": 12},
        "appliedAt": "2025-03-01T10:00:00.250Z",
        "replayed": False,
        "durationMs": 201,
    }
    result = ActionResult.from_json(wire)
    assert result.applied_at == datetime.fromisoformat("2025-03-01T10:00:00.250+00:00")
    assert result.applied_at.tzinfo is not None
    assert (result.before, result.after, result.duration_ms) == ({"replicas": 4}, {"replicas": 12}, 201)
    assert result.to_json() == wire


def test_errors_say_whether_to_retry() -> None:
    assert TargetUnavailable("x").retryable
    assert not TargetRejected("x").retryable
    stale = StaleFencingToken(3, 5)
    assert (stale.token, stale.newest, stale.retryable) == (3, 5, False)


# -- SimTarget -----------------------------------------------------------------------


@pytest.fixture
def sim_url() -> Iterator[str]:
    yield from serve(create_sim_app(action_seconds=0.05))


@pytest.fixture
def sim(sim_url: str) -> Iterator[SimTarget]:
    with SimTarget(sim_url, timeout=5) as target:
        yield target


def test_sim_target_is_an_action_target(sim: SimTarget) -> None:
    assert isinstance(sim, ActionTarget)


def test_sim_target_applies_replays_and_looks_up(sim: SimTarget, sim_url: str) -> None:
    assert sim.lookup(KEY) is None
    result = sim.apply("scale", "production/checkout-api", {"replicas": 12}, KEY, 1, "executor-a")
    assert (result.idempotency_key, result.action, result.resource) == (KEY, "scale", "production/checkout-api")
    assert (result.status, result.replayed) == ("applied", False)
    assert result.before["replicas"] == 4 and result.after["replicas"] == 12
    assert result.duration_ms >= 50
    assert isinstance(result.applied_at, datetime) and result.applied_at.tzinfo is not None
    assert httpx.get(f"{sim_url}/services/checkout-api").json()["replicas"] == 12

    replay = sim.apply("scale", "production/checkout-api", {"replicas": 12}, KEY, 1, "executor-a")
    assert replay.replayed is True
    assert replay.applied_at == result.applied_at
    assert sim.lookup(KEY) == result


def test_sim_target_keys_with_odd_characters(sim: SimTarget) -> None:
    key = "incident 9/scale:12?#%"
    sim.apply("scale", CHECKOUT, {"replicas": 5}, key, 1, "a")
    found = sim.lookup(key)
    assert found is not None and found.idempotency_key == key


def test_sim_target_stale_token(sim: SimTarget, sim_url: str) -> None:
    sim.apply("scale", CHECKOUT, {"replicas": 12}, KEY, 4, "executor-b")
    with pytest.raises(StaleFencingToken) as caught:
        sim.apply("scale", CHECKOUT, {"replicas": 3}, "late", 3, "executor-a")
    assert (caught.value.token, caught.value.newest) == (3, 4)
    assert httpx.get(f"{sim_url}/services/checkout-api").json()["replicas"] == 12


@pytest.mark.parametrize(
    ("action", "resource", "params", "status"),
    [
        ("scale", "nope", {"replicas": 2}, 404),
        ("scale", CHECKOUT, {"replicas": 0}, 422),
        ("teleport", CHECKOUT, {}, 404),
    ],
)
def test_sim_target_rejections(sim: SimTarget, action: str, resource: str, params: dict[str, Any], status: int) -> None:
    with pytest.raises(TargetRejected) as caught:
        sim.apply(action, resource, params, "k", 1, "a")
    assert caught.value.status == status
    assert not caught.value.retryable


def test_sim_target_unreachable() -> None:
    with SimTarget(f"http://127.0.0.1:{free_port()}", timeout=1) as target:
        with pytest.raises(TargetUnavailable):
            target.apply("scale", CHECKOUT, {"replicas": 2}, "k", 1, "a")
        with pytest.raises(TargetUnavailable):
            target.lookup("k")


@pytest.mark.parametrize(
    "answer",
    [
        lambda r: httpx.Response(503, json={"error": "down"}),
        lambda r: httpx.Response(429, text="slow down"),
        lambda r: httpx.Response(200, text="<html>proxy</html>"),
    ],
)
def test_sim_target_server_trouble_is_retryable(answer: Callable[[httpx.Request], httpx.Response]) -> None:
    with SimTarget("http://sim", transport=httpx.MockTransport(answer)) as target, pytest.raises(TargetUnavailable):
        target.apply("scale", CHECKOUT, {"replicas": 2}, "k", 1, "a")


def test_sim_target_timeout_is_retryable() -> None:
    def hang(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    with SimTarget("http://sim", transport=httpx.MockTransport(hang)) as target, pytest.raises(TargetUnavailable):
        target.apply("scale", CHECKOUT, {"replicas": 2}, "k", 1, "a")


def test_sim_target_sends_the_contract_body() -> None:
    seen: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(409, json={"error": "stale fencing token", "fencingToken": 2, "newestToken": 3})

    with SimTarget("http://sim/", transport=httpx.MockTransport(record)) as target, pytest.raises(StaleFencingToken):
        target.apply("failover", CHECKOUT, {"dependency": "d", "toTarget": "t"}, "k:1", 2, "exec-1")
    assert seen[0].method == "POST" and seen[0].url.path == "/actions/failover"
    assert json.loads(seen[0].content) == {
        "resource": CHECKOUT,
        "params": {"dependency": "d", "toTarget": "t"},
        "idempotencyKey": "k:1",
        "fencingToken": 2,
        "holder": "exec-1",
    }


# -- a fake Kubernetes API -------------------------------------------------------------

NAMESPACE = "shop"
BEARER = "s3cret"


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def status(code: int, reason: str, message: str) -> JSONResponse:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "message": message}
    return JSONResponse(body, status_code=code)


class FakeKubernetes:
    """Deployments in one namespace, enough of apps/v1 for KubernetesTarget.

    ``before_patch`` holds callables run (one per PATCH, first in first out) just before
    a PATCH is handled: another writer slipping in between a read and a write.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.version = 100
        self.deployments: dict[str, dict[str, Any]] = {}
        self.patches: list[tuple[str, str, dict[str, Any]]] = []  # (path, content type, body)
        self.before_patch: list[Callable[[FakeKubernetes], None]] = []
        self.fail_with: int | None = None
        self.add(CHECKOUT, replicas=4)
        self.add("search-api", replicas=2)

    def add(self, name: str, replicas: int) -> None:
        self.deployments[name] = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "namespace": NAMESPACE, "resourceVersion": self._next(), "annotations": {}},
            "spec": {"replicas": replicas, "template": {"metadata": {"labels": {"app": name}}, "spec": {}}},
        }

    def _next(self) -> str:
        self.version += 1
        return str(self.version)

    def write(self, name: str, patch: dict[str, Any]) -> None:
        """Another writer's unconditional merge patch."""
        with self.lock:
            self._apply(name, patch)

    def _apply(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        patch = copy.deepcopy(patch)
        patch.get("metadata", {}).pop("resourceVersion", None)
        updated: dict[str, Any] = merge_patch(self.deployments[name], patch)
        updated["metadata"]["resourceVersion"] = self._next()
        self.deployments[name] = updated
        return updated

    def replicas(self, name: str = CHECKOUT) -> int:
        replicas: int = self.deployments[name]["spec"]["replicas"]
        return replicas

    def annotations(self, name: str = CHECKOUT) -> dict[str, str]:
        annotations: dict[str, str] = self.deployments[name]["metadata"]["annotations"]
        return annotations

    def scale_of(self, deployment: dict[str, Any]) -> dict[str, Any]:
        meta = deployment["metadata"]
        return {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {"name": meta["name"], "namespace": NAMESPACE, "resourceVersion": meta["resourceVersion"]},
            "spec": {"replicas": deployment["spec"]["replicas"]},
            "status": {"replicas": deployment["spec"]["replicas"]},
        }

    @property
    def app(self) -> FastAPI:
        app = FastAPI()
        base = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments"

        @app.middleware("http")
        async def guard(request: Request, call_next: Any) -> Any:
            if request.headers.get("authorization") != f"Bearer {BEARER}":
                return status(401, "Unauthorized", "Unauthorized")
            if self.fail_with is not None:
                return status(self.fail_with, "InternalError", "etcd is having a bad day")
            return await call_next(request)

        @app.get(base)
        def list_deployments() -> dict[str, Any]:
            with self.lock:
                return {"kind": "DeploymentList", "items": copy.deepcopy(list(self.deployments.values()))}

        @app.get(base + "/{name}", response_model=None)
        def get_deployment(name: str) -> dict[str, Any] | JSONResponse:
            with self.lock:
                if name not in self.deployments:
                    return status(404, "NotFound", f'deployments.apps "{name}" not found')
                return copy.deepcopy(self.deployments[name])

        @app.patch(base + "/{name}", response_model=None)
        async def patch_deployment(name: str, request: Request) -> dict[str, Any] | JSONResponse:
            return self._patch(name, request.headers.get("content-type", ""), await request.body(), scale=False)

        @app.patch(base + "/{name}/scale", response_model=None)
        async def patch_scale(name: str, request: Request) -> dict[str, Any] | JSONResponse:
            return self._patch(name, request.headers.get("content-type", ""), await request.body(), scale=True)

        return app

    def _patch(self, name: str, content_type: str, raw: bytes, *, scale: bool) -> dict[str, Any] | JSONResponse:
        if content_type != "application/merge-patch+json":
            return status(
                415, "UnsupportedMediaType", f"the body of the request was in an unknown format: {content_type}"
            )
        if self.before_patch:
            self.before_patch.pop(0)(self)
        body = json.loads(raw)
        with self.lock:
            self.patches.append((name + ("/scale" if scale else ""), content_type, body))
            if name not in self.deployments:
                return status(404, "NotFound", f'deployments.apps "{name}" not found')
            current = self.deployments[name]
            wanted = body.get("metadata", {}).get("resourceVersion")
            if wanted is not None and wanted != current["metadata"]["resourceVersion"]:
                return status(
                    409, "Conflict", "the object has been modified; please apply your changes to the latest version"
                )
            if scale:
                return self.scale_of(self._apply(name, {"spec": {"replicas": body["spec"]["replicas"]}}))
            return copy.deepcopy(self._apply(name, body))


@pytest.fixture
def cluster() -> FakeKubernetes:
    return FakeKubernetes()


@pytest.fixture
def kube_url(cluster: FakeKubernetes) -> Iterator[str]:
    yield from serve(cluster.app)


@pytest.fixture
def kube(kube_url: str) -> Iterator[KubernetesTarget]:
    with KubernetesTarget(kube_url, BEARER, NAMESPACE, verify=False) as target:
        yield target


def test_kubernetes_target_is_an_action_target(kube: KubernetesTarget) -> None:
    assert isinstance(kube, ActionTarget)


def test_kubernetes_scale_goes_through_the_scale_subresource(kube: KubernetesTarget, cluster: FakeKubernetes) -> None:
    result = kube.apply("scale", "production/checkout-api", {"replicas": 12}, KEY, 3, "executor-a")
    assert (result.before, result.after, result.replayed) == ({"replicas": 4}, {"replicas": 12}, False)
    assert cluster.replicas() == 12
    assert [(path, ctype) for path, ctype, _ in cluster.patches] == [
        (CHECKOUT, "application/merge-patch+json"),  # the claim: the token, on the resourceVersion read
        (CHECKOUT + "/scale", "application/merge-patch+json"),
        (CHECKOUT, "application/merge-patch+json"),  # the record
    ]
    assert all("resourceVersion" in body["metadata"] for _, _, body in cluster.patches)
    assert cluster.patches[1][2]["spec"] == {"replicas": 12}
    annotations = cluster.annotations()
    assert annotations[KubernetesTarget.TOKEN] == "3"
    assert annotations[KubernetesTarget.LAST_KEY] == KEY
    assert json.loads(annotations[KubernetesTarget.ACTIONS])[0]["idempotencyKey"] == KEY


def test_kubernetes_replay_writes_nothing(kube: KubernetesTarget, cluster: FakeKubernetes) -> None:
    first = kube.apply("scale", CHECKOUT, {"replicas": 12}, KEY, 1, "a")
    cluster.write(CHECKOUT, {"spec": {"replicas": 7}})  # someone scaled by hand since
    patches = len(cluster.patches)
    again = kube.apply("scale", CHECKOUT, {"replicas": 12}, KEY, 1, "a")
    assert again.replayed is True
    assert again.applied_at == first.applied_at and again.after == first.after
    assert len(cluster.patches) == patches
    assert cluster.replicas() == 7


def test_kubernetes_lookup(kube: KubernetesTarget) -> None:
    assert kube.lookup(KEY) is None
    first = kube.apply("scale", CHECKOUT, {"replicas": 12}, KEY, 1, "a")
    kube.apply("scale", CHECKOUT, {"replicas": 6}, "incident-205:scale:6", 1, "a")
    kube.apply("scale", "search-api", {"replicas": 3}, "incident-206:scale:3", 1, "a")
    found = kube.lookup(KEY)  # not the last key on its Deployment any more
    assert found == first
    other = kube.lookup("incident-206:scale:3")
    assert other is not None and other.resource == "search-api"


def test_kubernetes_history_is_bounded(kube: KubernetesTarget, cluster: FakeKubernetes) -> None:
    for i in range(KubernetesTarget.HISTORY + 3):
        kube.apply("scale", CHECKOUT, {"replicas": 2 + i % 3}, f"k{i}", 1, "a")
    history = json.loads(cluster.annotations()[KubernetesTarget.ACTIONS])
    assert len(history) == KubernetesTarget.HISTORY
    assert history[-1]["idempotencyKey"] == f"k{KubernetesTarget.HISTORY + 2}"
    assert kube.lookup("k0") is None


def test_kubernetes_stale_token(kube: KubernetesTarget, cluster: FakeKubernetes) -> None:
    kube.apply("scale", CHECKOUT, {"replicas": 12}, KEY, 5, "b")
    with pytest.raises(StaleFencingToken) as caught:
        kube.apply("scale", CHECKOUT, {"replicas": 2}, "late", 4, "a")
    assert (caught.value.token, caught.value.newest) == (4, 5)
    assert cluster.replicas() == 12
    assert kube.lookup("late") is None


def _newer_holder(token: int, replicas: int) -> Callable[[FakeKubernetes], None]:
    def act(cluster: FakeKubernetes) -> None:
        cluster.write(
            CHECKOUT,
            {"metadata": {"annotations": {KubernetesTarget.TOKEN: str(token)}}, "spec": {"replicas": replicas}},
        )

    return act


def test_kubernetes_newer_holder_between_read_and_claim(kube: KubernetesTarget, cluster: FakeKubernetes) -> None:
    cluster.before_patch.append(_newer_holder(token=7, replicas=9))
    with pytest.raises(StaleFencingToken) as caught:
        kube.apply("scale", CHECKOUT, {"replicas": 2}, "zombie", 6, "a")
    assert caught.value.newest == 7
    assert cluster.replicas() == 9
    assert KubernetesTarget.LAST_KEY not in cluster.annotations()


def test_kubernetes_newer_holder_between_claim_and_scale(kube: KubernetesTarget, cluster: FakeKubernetes) -> None:
    cluster.before_patch.extend([lambda c: None, _newer_holder(token=7, replicas=9)])
    with pytest.raises(StaleFencingToken):
        kube.apply("scale", CHECKOUT, {"replicas": 2}, "zombie", 6, "a")
    assert cluster.replicas() == 9
    assert [path for path, _, _ in cluster.patches] == [CHECKOUT, CHECKOUT + "/scale"]  # the scale was refused


def test_kubernetes_unrelated_write_is_retried(kube: KubernetesTarget, cluster: FakeKubernetes) -> None:
    cluster.before_patch.append(lambda c: c.write(CHECKOUT, {"metadata": {"labels": {"team": "shop"}}}))
    result = kube.apply("scale", CHECKOUT, {"replicas": 12}, KEY, 1, "a")
    assert result.after == {"replicas": 12}
    assert cluster.replicas() == 12
    assert cluster.deployments[CHECKOUT]["metadata"]["labels"] == {"team": "shop"}
    assert len(cluster.patches) == 4  # one refused claim, then claim, scale, record


def test_kubernetes_endless_conflicts_are_retryable(kube: KubernetesTarget, cluster: FakeKubernetes) -> None:
    def relabel(n: int) -> Callable[[FakeKubernetes], None]:
        return lambda c: c.write(CHECKOUT, {"metadata": {"labels": {"n": str(n)}}})

    cluster.before_patch.extend(relabel(i) for i in range(20))
    with pytest.raises(TargetUnavailable):
        kube.apply("scale", CHECKOUT, {"replicas": 12}, KEY, 1, "a")
    assert cluster.replicas() == 4


def test_kubernetes_restart_is_one_write(kube: KubernetesTarget, cluster: FakeKubernetes) -> None:
    result = kube.apply("restart", CHECKOUT, {"rolling": True}, "incident-3:restart", 2, "a")
    assert result.before == {"restartedAt": None}
    template = cluster.deployments[CHECKOUT]["spec"]["template"]["metadata"]
    assert template["annotations"][KubernetesTarget.RESTARTED_AT] == result.after["restartedAt"]
    assert template["labels"] == {"app": CHECKOUT}  # merged, not replaced
    assert len(cluster.patches) == 1
    assert cluster.annotations()[KubernetesTarget.LAST_KEY] == "incident-3:restart"
    assert cluster.annotations()[KubernetesTarget.TOKEN] == "2"
    assert kube.apply("restart", CHECKOUT, {"rolling": True}, "incident-3:restart", 2, "a").replayed
    assert len(cluster.patches) == 1


@pytest.mark.parametrize(
    ("action", "params", "fragment"),
    [
        ("rollback", {"toRevision": "v1"}, "rollback"),
        ("failover", {"dependency": "payments-api", "toTarget": "payments-api-secondary"}, "failover"),
        ("restart", {"rolling": False}, "rolling"),
        ("scale", {"replicas": -1}, "negative"),
        ("scale", {"replicas": "12"}, "replicas"),
        ("teleport", {}, "teleport"),
    ],
)
def test_kubernetes_refuses_what_it_cannot_do(
    kube: KubernetesTarget, cluster: FakeKubernetes, action: str, params: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(TargetRejected, match=fragment):
        kube.apply(action, CHECKOUT, params, "k", 1, "a")
    assert cluster.patches == []


def test_kubernetes_unknown_deployment(kube: KubernetesTarget) -> None:
    with pytest.raises(TargetRejected) as caught:
        kube.apply("scale", "nope", {"replicas": 2}, "k", 1, "a")
    assert caught.value.status == 404


def test_kubernetes_wrong_credentials(kube_url: str) -> None:
    with KubernetesTarget(kube_url, "wrong", NAMESPACE) as target, pytest.raises(TargetRejected) as caught:
        target.apply("scale", CHECKOUT, {"replicas": 2}, "k", 1, "a")
    assert caught.value.status == 401


def test_kubernetes_server_errors_are_retryable(kube: KubernetesTarget, cluster: FakeKubernetes) -> None:
    cluster.fail_with = 503
    with pytest.raises(TargetUnavailable):
        kube.apply("scale", CHECKOUT, {"replicas": 2}, "k", 1, "a")
    with pytest.raises(TargetUnavailable):
        kube.lookup("k")


def test_kubernetes_unreachable() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with KubernetesTarget(url, BEARER, NAMESPACE, timeout=1) as target, pytest.raises(TargetUnavailable):
        target.apply("scale", CHECKOUT, {"replicas": 2}, "k", 1, "a")
