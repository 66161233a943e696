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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from flotilla.actions import Change
from flotilla.actions.kubernetes import planned_write
from flotilla.actions.quantity import format_bytes, parse_bytes
from services.executor.namespaces import NamespaceMapError
from services.executor.settings import ExecutorSettings
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
SIM_TOKEN = "sim-action-token-for-the-tests"


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
    yield from serve(create_sim_app(action_seconds=0.05, action_token=SIM_TOKEN))


@pytest.fixture
def sim(sim_url: str) -> Iterator[SimTarget]:
    with SimTarget(sim_url, SIM_TOKEN, timeout=5) as target:
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
    with SimTarget(f"http://127.0.0.1:{free_port()}", SIM_TOKEN, timeout=1) as target:
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
    with (
        SimTarget("http://sim", SIM_TOKEN, transport=httpx.MockTransport(answer)) as target,
        pytest.raises(TargetUnavailable),
    ):
        target.apply("scale", CHECKOUT, {"replicas": 2}, "k", 1, "a")


def test_sim_target_timeout_is_retryable() -> None:
    def hang(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    with (
        SimTarget("http://sim", SIM_TOKEN, transport=httpx.MockTransport(hang)) as target,
        pytest.raises(TargetUnavailable),
    ):
        target.apply("scale", CHECKOUT, {"replicas": 2}, "k", 1, "a")


def test_sim_target_sends_the_contract_body() -> None:
    seen: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(409, json={"error": "stale fencing token", "fencingToken": 2, "newestToken": 3})

    with (
        SimTarget("http://sim/", SIM_TOKEN, transport=httpx.MockTransport(record)) as target,
        pytest.raises(StaleFencingToken),
    ):
        target.apply("failover", CHECKOUT, {"dependency": "d", "toTarget": "t"}, "k:1", 2, "exec-1")
    assert seen[0].method == "POST" and seen[0].url.path == "/actions/failover"
    assert seen[0].headers["authorization"] == f"Bearer {SIM_TOKEN}"
    assert json.loads(seen[0].content) == {
        "resource": CHECKOUT,
        "params": {"dependency": "d", "toTarget": "t"},
        "idempotencyKey": "k:1",
        "fencingToken": 2,
        "holder": "exec-1",
    }


def test_sim_target_with_a_wrong_token_is_refused_and_acts_on_nothing(sim: SimTarget, sim_url: str) -> None:
    applied = sim.apply("scale", "production/checkout-api", {"replicas": 12}, KEY, 1, "executor-a")
    with SimTarget(sim_url, "not-the-sim-action-token", timeout=5) as wrong:
        with pytest.raises(TargetRejected) as caught:
            wrong.apply("scale", "production/checkout-api", {"replicas": 3}, "intruder", 9, "mallory")
        assert (caught.value.status, caught.value.retryable) == (401, False)
        with pytest.raises(TargetRejected) as looked:  # the ledger is the executor's too
            wrong.lookup(KEY)
        assert looked.value.status == 401
    assert httpx.get(f"{sim_url}/services/checkout-api").json()["replicas"] == 12
    assert sim.lookup("intruder") is None and sim.lookup(KEY) == applied


def test_sim_target_needs_a_token() -> None:
    with pytest.raises(ValueError, match="token"):
        SimTarget("http://sim", "")


@pytest.mark.usefixtures("clean_env")
def test_the_executor_does_not_build_a_sim_target_without_the_token(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="FLOTILLA_SIM_ACTION_TOKEN is not set"):
        ExecutorSettings.load().build_target()
    monkeypatch.setenv("FLOTILLA_SIM_ACTION_TOKEN", "  ")
    with pytest.raises(ValidationError, match="FLOTILLA_SIM_ACTION_TOKEN is empty"):
        ExecutorSettings.load()
    monkeypatch.setenv("FLOTILLA_SIM_ACTION_TOKEN", SIM_TOKEN)
    seen: list[httpx.Request] = []
    target = ExecutorSettings.load().build_target()
    assert isinstance(target, SimTarget)
    target._client._transport = httpx.MockTransport(lambda r: seen.append(r) or httpx.Response(404, json={}))
    assert target.lookup(KEY) is None
    assert seen[0].headers["authorization"] == f"Bearer {SIM_TOKEN}"


@pytest.mark.usefixtures("clean_env")
def test_the_executor_reads_the_sim_token_from_a_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    token = tmp_path / "sim-action-token"
    monkeypatch.setenv("FLOTILLA_SIM_ACTION_TOKEN_FILE", str(token))
    with pytest.raises(ValueError, match=f"FLOTILLA_SIM_ACTION_TOKEN_FILE {token}"):
        ExecutorSettings.load().build_target()  # missing
    token.write_text("\n")
    with pytest.raises(ValueError, match="is empty"):
        ExecutorSettings.load().build_target()
    token.write_text(SIM_TOKEN + "\n")
    target = ExecutorSettings.load().build_target()
    assert isinstance(target, SimTarget)
    seen: list[httpx.Request] = []
    target._client._transport = httpx.MockTransport(lambda r: seen.append(r) or httpx.Response(404, json={}))
    assert target.lookup(KEY) is None
    assert seen[0].headers["authorization"] == f"Bearer {SIM_TOKEN}"
    monkeypatch.setenv("FLOTILLA_SIM_ACTION_TOKEN", SIM_TOKEN)
    with pytest.raises(ValidationError, match="not both"):
        ExecutorSettings.load()


# -- a fake Kubernetes API -------------------------------------------------------------

PRODUCTION = "apps"  # production's namespace
DEV = "apps-dev"  # dev's
UNSERVED = "shop"  # a namespace the target is not configured for
NAMESPACES = {"production": PRODUCTION, "dev": DEV}
PROD_CHECKOUT = f"production/{CHECKOUT}"
PROD_SEARCH = "production/search-api"
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


def _dry(request: Request) -> bool:
    return request.query_params.get("dryRun") == "All"


def status(code: int, reason: str, message: str) -> JSONResponse:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "message": message}
    return JSONResponse(body, status_code=code)


class FakeKubernetes:
    """Deployments in namespaces, enough of apps/v1 for KubernetesTarget.

    Production (``apps``) has checkout-api (4 replicas) and search-api (2); dev
    (``apps-dev``) has checkout-dev (2). ``replica_sets`` are listed as stored (no
    controller makes them); ``objects`` holds other objects by URL path (an HPA, a
    ScaledObject), read and merge-patched like a Deployment. The real API server's
    behaviour of these is proven in tests/k8s. ``requests`` logs every call as ``(method,
    path)``; ``patches`` every PATCH as ``(<namespace>/<name>[/scale], content type,
    body)``. ``before_patch`` holds callables run (one per PATCH, first in first out)
    just before a PATCH is handled: another writer slipping in between a read and a write.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.version = 100
        self.deployments: dict[tuple[str, str], dict[str, Any]] = {}
        self.replica_sets: list[dict[str, Any]] = []
        self.objects: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []
        self.patches: list[tuple[str, str, dict[str, Any]]] = []
        self.before_patch: list[Callable[[FakeKubernetes], None]] = []
        self.dry_runs: list[str] = []
        self.fail_with: int | None = None
        self.add(CHECKOUT, replicas=4)
        self.add("search-api", replicas=2)
        self.add("checkout-dev", replicas=2, namespace=DEV)

    def add(self, name: str, replicas: int, namespace: str = PRODUCTION) -> None:
        self.deployments[(namespace, name)] = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": f"uid-{namespace}-{name}",
                "resourceVersion": self._next(),
                "annotations": {},
            },
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name}},
                    "spec": {
                        "containers": [
                            {"name": "app", "image": f"{name}:2", "resources": {"limits": {"memory": "256Mi"}}}
                        ]
                    },
                },
            },
        }

    def _next(self) -> str:
        self.version += 1
        return str(self.version)

    def write(self, name: str, patch: dict[str, Any], namespace: str = PRODUCTION) -> None:
        """Another writer's unconditional merge patch."""
        with self.lock:
            self._apply((namespace, name), patch)

    def _apply(self, where: tuple[str, str], patch: dict[str, Any]) -> dict[str, Any]:
        patch = copy.deepcopy(patch)
        patch.get("metadata", {}).pop("resourceVersion", None)
        updated: dict[str, Any] = merge_patch(self.deployments[where], patch)
        updated["metadata"]["resourceVersion"] = self._next()
        self.deployments[where] = updated
        return updated

    def deployment(self, name: str = CHECKOUT, namespace: str = PRODUCTION) -> dict[str, Any]:
        return self.deployments[(namespace, name)]

    def replicas(self, name: str = CHECKOUT, namespace: str = PRODUCTION) -> int:
        replicas: int = self.deployment(name, namespace)["spec"]["replicas"]
        return replicas

    def annotations(self, name: str = CHECKOUT, namespace: str = PRODUCTION) -> dict[str, str]:
        annotations: dict[str, str] = self.deployment(name, namespace)["metadata"]["annotations"]
        return annotations

    def record(self, name: str, namespace: str, entry: dict[str, Any]) -> None:
        """A result in the history annotation, written by someone else (or by a target that
        ignored environments)."""
        self.write(name, {"metadata": {"annotations": {KubernetesTarget.ACTIONS: json.dumps([entry])}}}, namespace)

    @staticmethod
    def scale_of(deployment: dict[str, Any]) -> dict[str, Any]:
        meta = deployment["metadata"]
        return {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {
                "name": meta["name"],
                "namespace": meta["namespace"],
                "resourceVersion": meta["resourceVersion"],
            },
            "spec": {"replicas": deployment["spec"]["replicas"]},
            "status": {"replicas": deployment["spec"]["replicas"]},
        }

    @property
    def app(self) -> FastAPI:
        app = FastAPI()
        base = "/apis/apps/v1/namespaces/{namespace}/deployments"

        @app.middleware("http")
        async def guard(request: Request, call_next: Any) -> Any:
            self.requests.append((request.method, request.url.path))
            if request.headers.get("authorization") != f"Bearer {BEARER}":
                return status(401, "Unauthorized", "Unauthorized")
            if self.fail_with is not None:
                return status(self.fail_with, "InternalError", "etcd is having a bad day")
            return await call_next(request)

        @app.get(base)
        def list_deployments(namespace: str) -> dict[str, Any]:
            with self.lock:
                items = [d for (ns, _), d in self.deployments.items() if ns == namespace]
                return {"kind": "DeploymentList", "items": copy.deepcopy(items)}

        @app.get(base + "/{name}", response_model=None)
        def get_deployment(namespace: str, name: str) -> dict[str, Any] | JSONResponse:
            with self.lock:
                if (namespace, name) not in self.deployments:
                    return status(404, "NotFound", f'deployments.apps "{name}" not found')
                return copy.deepcopy(self.deployments[(namespace, name)])

        @app.patch(base + "/{name}", response_model=None)
        async def patch_deployment(namespace: str, name: str, request: Request) -> dict[str, Any] | JSONResponse:
            content_type = request.headers.get("content-type", "")
            return self._patch((namespace, name), content_type, await request.body(), scale=False, dry=_dry(request))

        @app.get("/apis/apps/v1/namespaces/{namespace}/replicasets")
        def list_replica_sets(namespace: str) -> dict[str, Any]:
            with self.lock:
                items = [rs for rs in self.replica_sets if rs["metadata"]["namespace"] == namespace]
                return {"kind": "ReplicaSetList", "items": copy.deepcopy(items)}

        @app.get("/apis/{group}/{version}/namespaces/{namespace}/{plural}/{name}", response_model=None)
        def get_object(request: Request) -> dict[str, Any] | JSONResponse:
            with self.lock:
                if request.url.path not in self.objects:
                    return status(404, "NotFound", f"{request.url.path} not found")
                return copy.deepcopy(self.objects[request.url.path])

        @app.patch("/apis/{group}/{version}/namespaces/{namespace}/{plural}/{name}", response_model=None)
        async def patch_object(request: Request) -> dict[str, Any] | JSONResponse:
            body = json.loads(await request.body())
            with self.lock:
                current = self.objects.get(request.url.path)
                if current is None:
                    return status(404, "NotFound", f"{request.url.path} not found")
                wanted = body.get("metadata", {}).get("resourceVersion")
                if wanted is not None and wanted != current["metadata"]["resourceVersion"]:
                    return status(409, "Conflict", "the object has been modified")
                body.get("metadata", {}).pop("resourceVersion", None)
                updated: dict[str, Any] = merge_patch(current, body)
                if _dry(request):
                    self.dry_runs.append(request.url.path)
                    return copy.deepcopy(updated)
                updated["metadata"]["resourceVersion"] = self._next()
                self.objects[request.url.path] = updated
                return copy.deepcopy(updated)

        @app.patch(base + "/{name}/scale", response_model=None)
        async def patch_scale(namespace: str, name: str, request: Request) -> dict[str, Any] | JSONResponse:
            content_type = request.headers.get("content-type", "")
            return self._patch((namespace, name), content_type, await request.body(), scale=True, dry=_dry(request))

        return app

    def _patch(
        self, where: tuple[str, str], content_type: str, raw: bytes, *, scale: bool, dry: bool = False
    ) -> dict[str, Any] | JSONResponse:
        """A PATCH; ``dry`` (``?dryRun=All``): the answer a write would give, nothing
        stored, logged in ``dry_runs`` (not ``patches``), no ``before_patch`` run."""
        if dry:
            with self.lock:
                saved, version = copy.deepcopy(self.deployments), self.version
            try:
                self.dry_runs.append("/".join(where) + ("/scale" if scale else ""))
                before, patches = list(self.before_patch), list(self.patches)
                self.before_patch.clear()
                return self._patch(where, content_type, raw, scale=scale)
            finally:
                with self.lock:
                    self.deployments, self.version = saved, version
                    self.before_patch[:], self.patches[:] = before, patches
        if content_type not in ("application/merge-patch+json", "application/json-patch+json") or (
            scale and content_type != "application/merge-patch+json"
        ):
            return status(
                415, "UnsupportedMediaType", f"the body of the request was in an unknown format: {content_type}"
            )
        if self.before_patch:
            self.before_patch.pop(0)(self)
        body = json.loads(raw)
        if content_type == "application/json-patch+json":
            with self.lock:
                self.patches.append(("/".join(where), content_type, {"ops": body}))
                return self._json_patch(where, body)
        with self.lock:
            self.patches.append(("/".join(where) + ("/scale" if scale else ""), content_type, body))
            if where not in self.deployments:
                return status(404, "NotFound", f'deployments.apps "{where[1]}" not found')
            current = self.deployments[where]
            wanted = body.get("metadata", {}).get("resourceVersion")
            if wanted is not None and wanted != current["metadata"]["resourceVersion"]:
                return status(
                    409, "Conflict", "the object has been modified; please apply your changes to the latest version"
                )
            if scale:
                return self.scale_of(self._apply(where, {"spec": {"replicas": body["spec"]["replicas"]}}))
            return copy.deepcopy(self._apply(where, body))

    def _json_patch(self, where: tuple[str, str], ops: list[dict[str, Any]]) -> dict[str, Any] | JSONResponse:
        """RFC 6902 ``replace``/``add`` as KubernetesTarget sends them; a replaced
        resourceVersion other than the current one is a 409, as on the API server."""
        if where not in self.deployments:
            return status(404, "NotFound", f'deployments.apps "{where[1]}" not found')
        updated = copy.deepcopy(self.deployments[where])
        for op in ops:
            *parents, leaf = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
            node: Any = updated
            for part in parents:
                node = node[int(part)] if isinstance(node, list) else node[part]
            if op["path"] == "/metadata/resourceVersion":
                if op["value"] != node[leaf]:
                    return status(409, "Conflict", "the object has been modified")
                continue
            assert op["op"] in ("replace", "add") and (op["op"] == "add" or leaf in node), op
            node[leaf] = copy.deepcopy(op["value"])
        updated["metadata"]["resourceVersion"] = self._next()
        self.deployments[where] = updated
        return copy.deepcopy(updated)

    def release(self, name: str = CHECKOUT, namespace: str = PRODUCTION) -> None:
        """Two ReplicaSets of the Deployment, as its controller would have made them:
        revision 1 (``<name>:1``) and revision 2, the running template."""
        deployment = self.deployment(name, namespace)
        for revision, image in (("1", f"{name}:1"), ("2", None)):
            template = copy.deepcopy(deployment["spec"]["template"])
            if image is not None:
                template["spec"]["containers"][0]["image"] = image
            template["metadata"]["labels"]["pod-template-hash"] = f"hash{revision}"
            meta = {
                "name": f"{name}-hash{revision}",
                "namespace": namespace,
                "labels": template["metadata"]["labels"],
                "annotations": {"deployment.kubernetes.io/revision": revision},
                "ownerReferences": [{"kind": "Deployment", "name": name, "uid": deployment["metadata"]["uid"]}],
            }
            self.replica_sets.append({"metadata": meta, "spec": {"template": template}})

    def autoscaler(self, path: str, spec: dict[str, Any]) -> None:
        self.objects[path] = {
            "metadata": {"name": path.rsplit("/", 1)[1], "resourceVersion": self._next()},
            "spec": spec,
        }


@pytest.fixture
def cluster() -> FakeKubernetes:
    return FakeKubernetes()


@pytest.fixture
def kube_url(cluster: FakeKubernetes) -> Iterator[str]:
    yield from serve(cluster.app)


@pytest.fixture
def kube(kube_url: str) -> Iterator[KubernetesTarget]:
    with KubernetesTarget(kube_url, BEARER, NAMESPACES, verify=False) as target:
        yield target


def test_kubernetes_target_is_an_action_target(kube: KubernetesTarget) -> None:
    assert isinstance(kube, ActionTarget)


def test_kubernetes_scale_goes_through_the_scale_subresource(kube: KubernetesTarget, cluster: FakeKubernetes) -> None:
    result = kube.apply("scale", PROD_CHECKOUT, {"replicas": 12}, KEY, 3, "executor-a")
    assert (result.before, result.after, result.replayed) == ({"replicas": 4}, {"replicas": 12}, False)
    assert result.resource == PROD_CHECKOUT
    assert cluster.replicas() == 12
    deployment = f"{PRODUCTION}/{CHECKOUT}"
    assert [(path, ctype) for path, ctype, _ in cluster.patches] == [
        (deployment, "application/merge-patch+json"),  # the claim: the token, on the resourceVersion read
        (deployment + "/scale", "application/merge-patch+json"),
        (deployment, "application/merge-patch+json"),  # the record
    ]
    assert all("resourceVersion" in body["metadata"] for _, _, body in cluster.patches)
    assert cluster.patches[1][2]["spec"] == {"replicas": 12}
    annotations = cluster.annotations()
    assert annotations[KubernetesTarget.TOKEN] == "3"
    assert annotations[KubernetesTarget.LAST_KEY] == KEY
    assert json.loads(annotations[KubernetesTarget.ACTIONS])[0]["idempotencyKey"] == KEY


def test_kubernetes_replay_writes_nothing(kube: KubernetesTarget, cluster: FakeKubernetes) -> None:
    first = kube.apply("scale", PROD_CHECKOUT, {"replicas": 12}, KEY, 1, "a")
    cluster.write(CHECKOUT, {"spec": {"replicas": 7}})  # someone scaled by hand since
    patches = len(cluster.patches)
    again = kube.apply("scale", PROD_CHECKOUT, {"replicas": 12}, KEY, 1, "a")
    assert again.replayed is True
    assert again.applied_at == first.applied_at and again.after == first.after
    assert len(cluster.patches) == patches
    assert cluster.replicas() == 7


def test_kubernetes_lookup(kube: KubernetesTarget) -> None:
    assert kube.lookup(KEY) is None
    first = kube.apply("scale", PROD_CHECKOUT, {"replicas": 12}, KEY, 1, "a")
    kube.apply("scale", PROD_CHECKOUT, {"replicas": 6}, "incident-205:scale:6", 1, "a")
    kube.apply("scale", PROD_SEARCH, {"replicas": 3}, "incident-206:scale:3", 1, "a")
    found = kube.lookup(KEY)  # not the last key on its Deployment any more
    assert found == first
    other = kube.lookup("incident-206:scale:3")
    assert other is not None and other.resource == PROD_SEARCH


def test_kubernetes_history_is_bounded(kube: KubernetesTarget, cluster: FakeKubernetes) -> None:
    for i in range(KubernetesTarget.HISTORY + 3):
        kube.apply("scale", PROD_CHECKOUT, {"replicas": 2 + i % 3}, f"k{i}", 1, "a")
    history = json.loads(cluster.annotations()[KubernetesTarget.ACTIONS])
    assert len(history) == KubernetesTarget.HISTORY
    assert history[-1]["idempotencyKey"] == f"k{KubernetesTarget.HISTORY + 2}"
    assert kube.lookup("k0") is None


def test_kubernetes_stale_token(kube: KubernetesTarget, cluster: FakeKubernetes) -> None:
    kube.apply("scale", PROD_CHECKOUT, {"replicas": 12}, KEY, 5, "b")
    with pytest.raises(StaleFencingToken) as caught:
        kube.apply("scale", PROD_CHECKOUT, {"replicas": 2}, "late", 4, "a")
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
        kube.apply("scale", PROD_CHECKOUT, {"replicas": 2}, "zombie", 6, "a")
    assert caught.value.newest == 7
    assert cluster.replicas() == 9
    assert KubernetesTarget.LAST_KEY not in cluster.annotations()


def test_kubernetes_newer_holder_between_claim_and_scale(kube: KubernetesTarget, cluster: FakeKubernetes) -> None:
    cluster.before_patch.extend([lambda c: None, _newer_holder(token=7, replicas=9)])
    with pytest.raises(StaleFencingToken):
        kube.apply("scale", PROD_CHECKOUT, {"replicas": 2}, "zombie", 6, "a")
    assert cluster.replicas() == 9
    deployment = f"{PRODUCTION}/{CHECKOUT}"
    assert [path for path, _, _ in cluster.patches] == [deployment, deployment + "/scale"]  # the scale was refused


def test_kubernetes_unrelated_write_is_retried(kube: KubernetesTarget, cluster: FakeKubernetes) -> None:
    cluster.before_patch.append(lambda c: c.write(CHECKOUT, {"metadata": {"labels": {"team": "shop"}}}))
    result = kube.apply("scale", PROD_CHECKOUT, {"replicas": 12}, KEY, 1, "a")
    assert result.after == {"replicas": 12}
    assert cluster.replicas() == 12
    assert cluster.deployment()["metadata"]["labels"] == {"team": "shop"}
    assert len(cluster.patches) == 4  # one refused claim, then claim, scale, record


def test_kubernetes_endless_conflicts_are_retryable(kube: KubernetesTarget, cluster: FakeKubernetes) -> None:
    def relabel(n: int) -> Callable[[FakeKubernetes], None]:
        return lambda c: c.write(CHECKOUT, {"metadata": {"labels": {"n": str(n)}}})

    cluster.before_patch.extend(relabel(i) for i in range(20))
    with pytest.raises(TargetUnavailable):
        kube.apply("scale", PROD_CHECKOUT, {"replicas": 12}, KEY, 1, "a")
    assert cluster.replicas() == 4


EXECUTOR_ROLE = Path(__file__).resolve().parents[3] / "infra" / "k8s" / "overlays" / "production" / "executor-rbac.yaml"


def _rbac(method: str, path: str) -> tuple[str, str, str]:
    """The RBAC (API group, verb, resource) of one call."""
    group, _, rest = path.removeprefix("/apis/").partition("/namespaces/")
    parts = rest.split("/")  # ns, plural[, name[, sub]]
    assert len(parts) <= 4, path
    resource = parts[1] + (f"/{parts[3]}" if len(parts) == 4 else "")
    if method == "GET":
        return group.split("/")[0], ("get" if len(parts) >= 3 else "list"), resource
    return (
        group.split("/")[0],
        {"PATCH": "patch", "PUT": "update", "POST": "create", "DELETE": "delete"}[method],
        resource,
    )


HPA = f"/apis/autoscaling/v2/namespaces/{PRODUCTION}/horizontalpodautoscalers/{CHECKOUT}"
SCALED_OBJECT = f"/apis/keda.sh/v1alpha1/namespaces/{PRODUCTION}/scaledobjects/{CHECKOUT}"


def test_the_executor_role_grants_exactly_what_the_target_calls(
    kube: KubernetesTarget, cluster: FakeKubernetes
) -> None:
    """Every call of every action (scale, restart, pause, rollback, raise-ceiling on an HPA
    and a ScaledObject, raise-memory, a replay, a conflict, lookup, the refused ones)
    against the Role the production executor runs with: nothing used is missing, and
    nothing granted goes unused."""
    import yaml

    cluster.release()
    cluster.autoscaler(HPA, {"scaleTargetRef": {"kind": "Deployment", "name": CHECKOUT}, "maxReplicas": 4})
    cluster.autoscaler(SCALED_OBJECT, {"scaleTargetRef": {"name": CHECKOUT}, "maxReplicaCount": 3})
    kube.apply("scale", PROD_CHECKOUT, {"replicas": 12}, KEY, 3, "a")
    kube.apply("scale", PROD_CHECKOUT, {"replicas": 12}, KEY, 3, "a")  # replayed
    cluster.before_patch.append(lambda c: c.write("search-api", {"metadata": {"labels": {"x": "y"}}}))
    kube.apply("scale", PROD_SEARCH, {"replicas": 3}, "incident-9:scale:3", 3, "a")  # after a conflict
    kube.apply("pause", PROD_CHECKOUT, {"paused": True}, "incident-3:pause", 4, "a")
    kube.apply("pause", PROD_CHECKOUT, {"paused": False}, "incident-3:resume", 4, "a")
    rollback = {"toRevision": "1", "fromRevision": "2", "toImages": [f"app={CHECKOUT}:1"]}
    rolled = kube.apply("rollback", PROD_CHECKOUT, rollback, "incident-3:rollback", 4, "a").after
    # revision 1's template, which the controller takes back as revision 3 (the highest owned + 1)
    assert (rolled["revision"], rolled["restoredRevision"]) == ("3", "1")
    kube.apply("restart", PROD_CHECKOUT, {"rolling": True}, "incident-3:restart", 4, "a")
    for kind, before in (("HorizontalPodAutoscaler", 4), ("ScaledObject", 3)):
        params = {"autoscalerKind": kind, "autoscaler": CHECKOUT, "fromMaxReplicas": before, "maxReplicas": 6}
        assert kube.apply("raise-ceiling", PROD_CHECKOUT, params, f"incident-3:{kind}", 4, "a").after == {
            "maxReplicas": 6
        }
    memory = {"container": "app", "fromMemoryLimitBytes": 256 * 2**20, "memoryLimitBytes": 384 * 2**20}
    kube.apply("raise-memory", PROD_CHECKOUT, memory, "incident-3:memory", 4, "a")
    assert cluster.deployment()["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] == {
        "memory": "384Mi"
    }
    assert (
        cluster.objects[HPA]["spec"]["maxReplicas"] == 6
        and cluster.objects[SCALED_OBJECT]["spec"]["maxReplicaCount"] == 6
    )
    kube.lookup(KEY)
    kube.lookup("never-applied")
    for action, params in (("rollback", {"toRevision": "r1"}), ("failover", {})):
        with pytest.raises(TargetRejected):
            kube.apply(action, PROD_CHECKOUT, params, f"incident-4:{action}", 5, "a")
    used = {_rbac(method, path) for method, path in cluster.requests}
    [role] = [d for d in yaml.safe_load_all(EXECUTOR_ROLE.read_text()) if d["kind"] == "Role"]
    granted = set()
    for rule in role["rules"]:
        granted |= {(g, v, r) for g in rule["apiGroups"] for v in rule["verbs"] for r in rule["resources"]}
    assert (
        used
        == granted
        == {
            ("apps", "get", "deployments"),
            ("apps", "list", "deployments"),
            ("apps", "patch", "deployments"),
            ("apps", "patch", "deployments/scale"),
            ("apps", "list", "replicasets"),
            ("autoscaling", "get", "horizontalpodautoscalers"),
            ("autoscaling", "patch", "horizontalpodautoscalers"),
            ("keda.sh", "get", "scaledobjects"),
            ("keda.sh", "patch", "scaledobjects"),
        }
    )


def test_kubernetes_restart_is_one_write(kube: KubernetesTarget, cluster: FakeKubernetes) -> None:
    result = kube.apply("restart", PROD_CHECKOUT, {"rolling": True}, "incident-3:restart", 2, "a")
    assert result.before == {"restartedAt": None}
    template = cluster.deployment()["spec"]["template"]["metadata"]
    assert template["annotations"][KubernetesTarget.RESTARTED_AT] == result.after["restartedAt"]
    assert template["labels"] == {"app": CHECKOUT}  # merged, not replaced
    assert len(cluster.patches) == 1
    assert cluster.annotations()[KubernetesTarget.LAST_KEY] == "incident-3:restart"
    assert cluster.annotations()[KubernetesTarget.TOKEN] == "2"
    assert kube.apply("restart", PROD_CHECKOUT, {"rolling": True}, "incident-3:restart", 2, "a").replayed
    assert len(cluster.patches) == 1


@pytest.mark.parametrize(
    ("action", "params", "fragment"),
    [
        ("rollback", {"toRevision": "1"}, "must name the revision it rolls back from"),
        ("rollback", {"toRevision": "v1", "fromRevision": "2"}, "revision number"),
        ("pause", {"paused": "yes"}, "paused must be boolean"),
        ("raise-ceiling", {"autoscalerKind": "Vpa", "autoscaler": "x", "fromMaxReplicas": 2, "maxReplicas": 3}, "Vpa"),
        ("raise-memory", {"container": "app", "fromMemoryLimitBytes": 10, "memoryLimitBytes": 21}, "twice"),
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
        kube.apply(action, PROD_CHECKOUT, params, "k", 1, "a")
    assert cluster.patches == []


def test_kubernetes_unknown_deployment(kube: KubernetesTarget) -> None:
    with pytest.raises(TargetRejected) as caught:
        kube.apply("scale", "production/nope", {"replicas": 2}, "k", 1, "a")
    assert caught.value.status == 404


def test_kubernetes_wrong_credentials(kube_url: str) -> None:
    with KubernetesTarget(kube_url, "wrong", NAMESPACES) as target, pytest.raises(TargetRejected) as caught:
        target.apply("scale", PROD_CHECKOUT, {"replicas": 2}, "k", 1, "a")
    assert caught.value.status == 401


def test_kubernetes_server_errors_are_retryable(kube: KubernetesTarget, cluster: FakeKubernetes) -> None:
    cluster.fail_with = 503
    with pytest.raises(TargetUnavailable):
        kube.apply("scale", PROD_CHECKOUT, {"replicas": 2}, "k", 1, "a")
    with pytest.raises(TargetUnavailable):
        kube.lookup("k")


def test_kubernetes_unreachable() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with KubernetesTarget(url, BEARER, NAMESPACES, timeout=1) as target, pytest.raises(TargetUnavailable):
        target.apply("scale", PROD_CHECKOUT, {"replicas": 2}, "k", 1, "a")


# -- environments: a namespace each, and nothing across ---------------------------------


def _untouched(cluster: FakeKubernetes, before: dict[str, Any], name: str = CHECKOUT) -> None:
    """Production's Deployment is exactly as it was: no replica, annotation or version change."""
    assert cluster.deployment(name, PRODUCTION) == before


def test_a_dev_command_never_touches_the_production_deployment_of_the_same_name(
    kube: KubernetesTarget, cluster: FakeKubernetes
) -> None:
    before = copy.deepcopy(cluster.deployment(CHECKOUT, PRODUCTION))
    with pytest.raises(TargetRejected) as caught:  # dev has no checkout-api: 404 from dev's namespace
        kube.apply("scale", f"dev/{CHECKOUT}", {"replicas": 20}, "incident-9:scale:20", 1, "a")
    assert caught.value.status == 404
    with pytest.raises(TargetRejected):
        kube.apply("restart", f"dev/{CHECKOUT}", {"rolling": True}, "incident-9:restart", 1, "a")
    _untouched(cluster, before)
    assert cluster.patches == []
    assert {path for _, path in cluster.requests} == {f"/apis/apps/v1/namespaces/{DEV}/deployments/{CHECKOUT}"}


def test_a_dev_command_acts_in_devs_namespace_only(kube: KubernetesTarget, cluster: FakeKubernetes) -> None:
    cluster.add(CHECKOUT, replicas=2, namespace=DEV)  # the same name in both environments
    before = copy.deepcopy(cluster.deployment(CHECKOUT, PRODUCTION))
    result = kube.apply("scale", f"dev/{CHECKOUT}", {"replicas": 6}, "incident-9:scale:6", 1, "a")
    assert (result.resource, result.before, result.after) == (f"dev/{CHECKOUT}", {"replicas": 2}, {"replicas": 6})
    assert cluster.replicas(CHECKOUT, DEV) == 6
    _untouched(cluster, before)
    assert all(path.startswith(f"{DEV}/") for path, _, _ in cluster.patches)


def test_an_environment_the_target_does_not_serve_is_refused_before_any_call(
    kube_url: str, cluster: FakeKubernetes
) -> None:
    before = copy.deepcopy(cluster.deployment(CHECKOUT, PRODUCTION))
    with KubernetesTarget(kube_url, BEARER, {"production": PRODUCTION}) as production_only:
        with pytest.raises(TargetRejected) as caught:
            production_only.apply("scale", f"dev/{CHECKOUT}", {"replicas": 20}, "incident-9:scale:20", 1, "a")
        message = str(caught.value)
        assert "'dev'" in message and "production (namespace apps)" in message  # what was asked, what is served
        assert not caught.value.retryable
        with pytest.raises(TargetRejected, match="staging"):
            production_only.apply("restart", f"staging/{CHECKOUT}", {"rolling": True}, "k", 1, "a")
    _untouched(cluster, before)
    assert cluster.requests == []


@pytest.mark.parametrize(
    ("resource", "fragment"),
    [
        (CHECKOUT, "names no environment"),  # the old form: the namespace's Deployment, whatever the environment
        (f"/{CHECKOUT}", "names no environment"),
        ("production/", "cannot be a Deployment name"),
        ("production/Checkout-API", "cannot be a Deployment name"),
        (f"production/{CHECKOUT}/scale", "cannot be a Deployment name"),  # no path tricks into a subresource
        ("production/../apps-dev", "cannot be a Deployment name"),
        ("production/" + "a" * 254, "cannot be a Deployment name"),
    ],
)
def test_resources_that_name_no_deployment_of_a_served_environment_are_refused(
    kube: KubernetesTarget, cluster: FakeKubernetes, resource: str, fragment: str
) -> None:
    with pytest.raises(TargetRejected, match=fragment):
        kube.apply("scale", resource, {"replicas": 2}, "k", 1, "a")
    assert cluster.requests == []


def test_lookup_searches_the_served_namespaces_only(kube: KubernetesTarget, cluster: FakeKubernetes) -> None:
    cluster.add(CHECKOUT, replicas=4, namespace=UNSERVED)
    applied = _applied("elsewhere", PROD_CHECKOUT)
    cluster.record(CHECKOUT, UNSERVED, applied)  # looks like production's, lives in a namespace not served
    assert kube.lookup("elsewhere") is None
    listed = [path for method, path in cluster.requests if method == "GET"]
    assert sorted(listed) == sorted(f"/apis/apps/v1/namespaces/{ns}/deployments" for ns in (PRODUCTION, DEV))


def test_lookup_finds_each_environments_keys_in_its_own_namespace(
    kube: KubernetesTarget, cluster: FakeKubernetes
) -> None:
    dev = kube.apply("scale", "dev/checkout-dev", {"replicas": 6}, "incident-9:scale:6", 1, "a")
    production = kube.apply("scale", PROD_CHECKOUT, {"replicas": 12}, KEY, 1, "a")
    assert kube.lookup("incident-9:scale:6") == dev
    assert kube.lookup(KEY) == production
    assert cluster.replicas("checkout-dev", DEV) == 6 and cluster.replicas() == 12


def _applied(key: str, resource: str) -> dict[str, Any]:
    """A scale of ``resource`` to 20 as the history annotation holds it."""
    at = datetime(2025, 3, 1, 10, tzinfo=UTC)
    return ActionResult(key, "scale", resource, "applied", {"replicas": 4}, {"replicas": 20}, at, False, 12).to_json()


def test_a_dev_result_on_the_production_deployment_is_never_productions(
    kube: KubernetesTarget, cluster: FakeKubernetes
) -> None:
    """What a target that ignored environments left behind: dev/checkout-api's scale,
    recorded on apps/checkout-api. It answers for neither resource."""
    key = "incident-9:scale:20"
    cluster.record(CHECKOUT, PRODUCTION, _applied(key, f"dev/{CHECKOUT}"))
    before = copy.deepcopy(cluster.deployment(CHECKOUT, PRODUCTION))
    assert kube.lookup(key) is None  # not "applied": it never applied in dev, and is not production's
    with pytest.raises(TargetRejected, match="recorded on apps/checkout-api for 'dev/checkout-api'"):
        kube.apply("scale", PROD_CHECKOUT, {"replicas": 20}, key, 1, "a")  # no replay of another resource's result
    _untouched(cluster, before)


def test_a_record_naming_another_deployment_is_not_taken_for_this_one(
    kube: KubernetesTarget, cluster: FakeKubernetes
) -> None:
    cluster.record("search-api", PRODUCTION, _applied("moved", PROD_CHECKOUT))
    assert kube.lookup("moved") is None


@pytest.mark.parametrize(
    ("mapping", "fragment"),
    [
        ({}, "empty"),
        ({"production": "Apps"}, "not a Kubernetes namespace name"),
        ({"production": "apps_prod"}, "not a Kubernetes namespace name"),
        ({"production": "-apps"}, "not a Kubernetes namespace name"),
        ({"production": "a" * 64}, "not a Kubernetes namespace name"),
        ({"production": ""}, "not a Kubernetes namespace name"),
        ({"production": "apps", "dev": "apps"}, "both 'production' and 'dev'"),
        ({"": "apps"}, "not a name"),
        ({"production/x": "apps"}, "not a name"),
        ({" production": "apps"}, "not a name"),
    ],
)
def test_bad_namespace_mappings_are_refused_at_start(mapping: dict[str, str], fragment: str) -> None:
    with pytest.raises(NamespaceMapError, match=fragment):
        KubernetesTarget("https://kubernetes.default.svc", BEARER, mapping)


@pytest.mark.usefixtures("clean_env")
def test_the_namespace_mapping_is_read_and_checked_with_the_settings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("FLOTILLA_EXECUTOR_TARGET", "kubernetes")
    monkeypatch.setenv("FLOTILLA_KUBERNETES_NAMESPACES", json.dumps(NAMESPACES))
    token = tmp_path / "token"
    token.write_text(BEARER + "\n")
    monkeypatch.setenv("FLOTILLA_KUBERNETES_TOKEN_FILE", str(token))
    target = ExecutorSettings.load().build_target()
    assert isinstance(target, KubernetesTarget)
    assert dict(target.namespaces) == NAMESPACES

    monkeypatch.setenv("FLOTILLA_KUBERNETES_NAMESPACES", '{"production": "apps", "dev": "apps"}')
    with pytest.raises(ValidationError, match="each environment needs a namespace of its own"):
        ExecutorSettings.load()
    monkeypatch.delenv("FLOTILLA_KUBERNETES_NAMESPACES")
    with pytest.raises(ValidationError, match="FLOTILLA_KUBERNETES_NAMESPACES is empty"):
        ExecutorSettings.load()
    # The single namespace that served every environment is refused, not ignored.
    monkeypatch.setenv("FLOTILLA_KUBERNETES_NAMESPACE", "apps")
    with pytest.raises(ValidationError, match=r'FLOTILLA_KUBERNETES_NAMESPACES.*\{"production": "apps"\}'):
        ExecutorSettings.load()
    # The sim target does not need the mapping.
    monkeypatch.delenv("FLOTILLA_KUBERNETES_NAMESPACE")
    monkeypatch.setenv("FLOTILLA_EXECUTOR_TARGET", "sim")
    assert ExecutorSettings.load().kubernetes_namespaces == {}


@pytest.mark.parametrize(
    ("text", "count", "canonical"),
    [
        ("512Mi", 512 * 2**20, "512Mi"),
        ("1Gi", 2**30, "1Gi"),
        ("1.5Gi", 3 * 2**29, "1536Mi"),
        ("1G", 10**9, "1G"),
        ("1e9", 10**9, "1G"),
        ("1.5E3", 1500, "1500"),
        ("1E", 10**18, "1E"),
        ("128974848", 128974848, "123Mi"),
        ("129e6", 129 * 10**6, "129M"),
        ("0.5Ki", 512, "512"),
        ("1500m", 2, "2"),  # a fraction of a byte rounds up, as Quantity.Value() does
        ("0", 0, "0"),
    ],
)
def test_memory_quantities_are_read_and_written_as_kubernetes_does(text: str, count: int, canonical: str) -> None:
    assert parse_bytes(text) == count
    assert format_bytes(count) == canonical
    assert parse_bytes(canonical) == count


@pytest.mark.parametrize("text", ["", "Mi", "-1Mi", "1.2.3", "1Mb", "1e", "1 Gi", "10E", "1e999"])
def test_what_is_no_memory_quantity_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_bytes(text)


# -- the approved change, dry-run again before the write ----------------------------------


def previewed(kube_url: str, cluster: FakeKubernetes, action: str, params: dict[str, Any]) -> Change:
    """What the policy service shows a person: the shared planning of the write, sent with
    dryRun=All (as services/policy/preview_kubernetes.py does), nothing stored."""
    deployment = copy.deepcopy(cluster.deployment())
    with httpx.Client(base_url=kube_url, headers={"Authorization": f"Bearer {BEARER}"}) as api:

        def read(path: str, **query: str) -> dict[str, Any] | None:
            answer = api.get(path, params=query or None)
            return None if answer.status_code == 404 else dict(answer.json())

        write = planned_write(action, params, namespace=PRODUCTION, deployment=deployment, read=read)
        assert write is not None
        answer = api.patch(
            write.path,
            params={"dryRun": "All"},
            content=json.dumps(write.body),
            headers={"Content-Type": write.content_type},
        )
        return write.change(answer.json())


ROLLBACK = {"toRevision": "1", "fromRevision": "2", "toImages": [f"app={CHECKOUT}:1"]}
MEMORY = {"container": "app", "fromMemoryLimitBytes": 256 * 2**20, "memoryLimitBytes": 384 * 2**20}


@pytest.mark.parametrize(
    ("action", "params"),
    [
        ("rollback", ROLLBACK),
        ("raise-memory", MEMORY),
        ("restart", {"rolling": True}),
        ("pause", {"paused": True}),
        ("scale", {"replicas": 6}),
    ],
)
def test_a_step_whose_dry_run_is_the_approved_change_is_applied(
    kube: KubernetesTarget, kube_url: str, cluster: FakeKubernetes, action: str, params: dict[str, Any]
) -> None:
    cluster.release()
    approved = previewed(kube_url, cluster, action, params)
    assert cluster.patches == [] and cluster.dry_runs  # the preview stored nothing
    if action == "restart":
        time.sleep(1.1)  # a restart time a second later: the same change all the same
    result = kube.apply(action, PROD_CHECKOUT, params, f"incident-5:{action}", 2, "a", expected_change=approved.digest)
    assert not result.replayed and len(cluster.dry_runs) == 2
    assert cluster.patches  # written for real after the check


def test_a_deployment_changed_since_the_approval_is_refused_with_what_differs(
    kube: KubernetesTarget, kube_url: str, cluster: FakeKubernetes
) -> None:
    cluster.release()
    approved = previewed(kube_url, cluster, "raise-memory", MEMORY)
    assert approved.lines()[0] == "memoryLimits: app=256Mi → app=384Mi"
    assert approved.lines()[1].startswith("templateDigest: sha256:")
    # someone adds an env var (a new release) after the person approved
    added = {"name": "app", "image": f"{CHECKOUT}:2", "resources": {"limits": {"memory": "256Mi"}}}
    cluster.write(
        CHECKOUT,
        {"spec": {"template": {"spec": {"containers": [{**added, "env": [{"name": "DEBUG", "value": "1"}]}]}}}},
    )
    before = copy.deepcopy(cluster.deployment())
    with pytest.raises(TargetRejected, match="the change differs from what was approved") as refused:
        kube.apply("raise-memory", PROD_CHECKOUT, MEMORY, "incident-5:memory", 2, "a", expected_change=approved.digest)
    assert "DEBUG=1" in str(refused.value) and "memoryLimits: app=256Mi → app=384Mi" in str(refused.value)
    assert not refused.value.retryable
    assert cluster.deployment() == before and cluster.patches == []


def test_a_raise_ceiling_checks_the_autoscalers_dry_run_before_it_claims(
    kube: KubernetesTarget, kube_url: str, cluster: FakeKubernetes
) -> None:
    cluster.autoscaler(HPA, {"scaleTargetRef": {"kind": "Deployment", "name": CHECKOUT}, "maxReplicas": 4})
    params = {
        "autoscalerKind": "HorizontalPodAutoscaler",
        "autoscaler": CHECKOUT,
        "fromMaxReplicas": 4,
        "maxReplicas": 6,
    }
    approved = previewed(kube_url, cluster, "raise-ceiling", params)
    assert approved.lines() == ["maxReplicas: 4 → 6"]
    with pytest.raises(TargetRejected, match="differs"):
        kube.apply(
            "raise-ceiling", PROD_CHECKOUT, {**params, "maxReplicas": 7}, "k7", 2, "a", expected_change=approved.digest
        )
    assert cluster.patches == [] and cluster.objects[HPA]["spec"]["maxReplicas"] == 4  # not even the claim
    kube.apply("raise-ceiling", PROD_CHECKOUT, params, "k6", 2, "a", expected_change=approved.digest)
    assert cluster.objects[HPA]["spec"]["maxReplicas"] == 6


def test_the_sim_refuses_a_change_it_cannot_check(sim: SimTarget, sim_url: str) -> None:
    with pytest.raises(TargetRejected, match="the sim cannot dry-run, so it cannot check the approved change"):
        sim.apply("scale", "checkout-api", {"replicas": 6}, "k-sim", 1, "a", expected_change="sha256:00")
    assert sim.lookup("k-sim") is None
