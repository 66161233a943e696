"""The sim: its latency model (pure) and its HTTP API (through fastapi's TestClient)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from services.sim import SimModel, create_sim_app
from services.sim.model import MAX_REPLICAS, InvalidAction, Service, UnknownResource
from services.sim.state import SimState

CHECKOUT = "checkout-api"
FAILOVER = {"dependency": "payments-api", "toTarget": "payments-api-secondary"}
ACTION_TOKEN = "executor-only-sim-action-token"
EXECUTOR = {"Authorization": f"Bearer {ACTION_TOKEN}"}  # what the executor's SimTarget sends

# -- the model -----------------------------------------------------------------------


def test_default_topology() -> None:
    model = SimModel.default()
    assert model.names == [
        "checkout-api",
        "payments-api",
        "payments-api-secondary",
        "inventory-db",
        "search-api",
        "checkout-dev",
        "payments-dev",
    ]
    checkout = model.describe(CHECKOUT)
    assert checkout["replicas"] == 4
    assert checkout["thresholdMs"] == 500.0
    assert checkout["dependencies"] == ["payments-api", "inventory-db"]
    assert checkout["failoverTargets"] == {"payments-api": "payments-api-secondary"}
    assert checkout["activeDependencies"] == {"payments-api": "payments-api", "inventory-db": "inventory-db"}
    assert [model.service(n).replicas for n in model.names] == [4, 3, 2, 2, 2, 2, 2]
    assert {n: model.service(n).environment for n in model.names if model.service(n).environment != "production"} == {
        "checkout-dev": "dev",
        "payments-dev": "dev",
    }


def test_healthy_topology_is_under_every_threshold() -> None:
    model = SimModel.default()
    assert model.p95(CHECKOUT) == 180.0
    for name in model.names:
        assert model.p95(name) < model.service(name).threshold_ms, name


def test_slow_dependency_saturates_the_callers_pool() -> None:
    model = SimModel.default()
    model.add_fault("payments-api", "dependency-slow")
    assert model.p95("payments-api") == 35.0 * 8
    latency = model.latency(CHECKOUT)
    assert latency.dependencies_ms["payments-api"] == 280.0
    assert latency.utilization > 2  # each request holds a slot 2.4x longer
    assert latency.penalty_ms > 1000  # the p95 is mostly waiting for the pool
    assert latency.p95_ms == 1831.2
    assert model.p95("search-api") == 60.0  # not a caller of payments-api


def test_slow_dependency_named_from_the_caller_is_the_same_fault() -> None:
    by_dependency, by_caller = SimModel.default(), SimModel.default()
    by_dependency.add_fault("payments-api", "dependency-slow")
    by_caller.add_fault(CHECKOUT, "dependency-slow", dependency="payments-api")
    assert by_caller.p95(CHECKOUT) == by_dependency.p95(CHECKOUT) == 1831.2
    assert by_caller.p95("payments-api") == 280.0


def test_scaling_to_twelve_brings_checkout_under_its_threshold() -> None:
    model = SimModel.default()
    model.add_fault("payments-api", "dependency-slow")
    model.apply("scale", CHECKOUT, {"replicas": 12})
    latency = model.latency(CHECKOUT)
    assert latency.utilization < 1 and latency.penalty_ms == 0
    assert latency.p95_ms == 425.0 < 500


def test_doubling_is_not_quite_enough() -> None:
    """8 replicas leave demand just over the pool: the demo needs the approved 12."""
    model = SimModel.default()
    model.add_fault("payments-api", "dependency-slow")
    model.apply("scale", CHECKOUT, {"replicas": 8})
    assert model.p95(CHECKOUT) > 500


def test_failover_routes_around_the_slow_dependency() -> None:
    model = SimModel.default()
    model.add_fault("payments-api", "dependency-slow")
    before, after = model.apply("failover", CHECKOUT, FAILOVER)
    assert before == {"dependency": "payments-api", "activeTarget": "payments-api", "p95Ms": 1831.2}
    assert after == {"dependency": "payments-api", "activeTarget": "payments-api-secondary", "p95Ms": 190.0}
    assert model.p95("payments-api") == 280.0  # still slow, just not used
    assert model.describe(CHECKOUT)["activeDependencies"]["payments-api"] == "payments-api-secondary"
    model.apply("failover", CHECKOUT, {"dependency": "payments-api", "toTarget": "payments-api"})
    assert model.p95(CHECKOUT) == 1831.2  # failing back brings the slowness back


def test_pool_exhausted_is_fixed_by_scaling() -> None:
    model = SimModel.default()
    model.add_fault(CHECKOUT, "pool-exhausted")
    assert model.p95(CHECKOUT) > 1500
    model.apply("restart", CHECKOUT, {"rolling": True})
    assert model.p95(CHECKOUT) > 1500  # a restart is the wrong remedy
    model.apply("scale", CHECKOUT, {"replicas": 12})
    assert model.p95(CHECKOUT) == 180.0


def test_bad_deploy_is_fixed_by_rollback_not_by_scaling() -> None:
    model = SimModel.default()
    fault = model.add_fault(CHECKOUT, "bad-deploy")
    assert fault.revision == "v42"
    described = model.describe(CHECKOUT)
    assert (described["revision"], described["previousRevision"]) == ("v42", "v41")
    assert described["faults"] == [fault.as_json()]
    assert model.p95(CHECKOUT) > 2000
    model.apply("scale", CHECKOUT, {"replicas": 12})
    assert model.p95(CHECKOUT) > 500  # the bad revision is slow on its own
    before, after = model.apply("rollback", CHECKOUT, {"toRevision": "v41", "fromRevision": "v42"})
    assert (before["revision"], after["revision"], after["previousRevision"]) == ("v42", "v41", "v42")
    assert model.p95(CHECKOUT) == 180.0
    model.apply("rollback", CHECKOUT, {"toRevision": "v42", "fromRevision": "v41"})  # rolling forward again
    assert model.p95(CHECKOUT) > 500


def test_restart_counts_but_changes_no_latency() -> None:
    model = SimModel.default()
    model.add_fault("payments-api", "dependency-slow")
    before, after = model.apply("restart", CHECKOUT, {"rolling": False})
    assert (before["restarts"], after["restarts"]) == (0, 1)
    assert before["p95Ms"] == after["p95Ms"] == 1831.2


def test_removing_a_fault_restores_latency() -> None:
    model = SimModel.default()
    fault = model.add_fault("payments-api", "dependency-slow")
    assert model.remove_fault(fault.id) == fault
    assert model.p95(CHECKOUT) == 180.0
    with pytest.raises(UnknownResource):
        model.remove_fault(fault.id)


@pytest.mark.parametrize(
    ("action", "params"),
    [
        ("scale", {}),
        ("scale", {"replicas": 0}),
        ("scale", {"replicas": MAX_REPLICAS + 1}),
        ("scale", {"replicas": True}),
        ("scale", {"replicas": 12.0}),
        ("scale", {"replicas": 12, "extra": 1}),
        ("restart", {"rolling": "yes"}),
        ("rollback", {"toRevision": "v7"}),
        ("rollback", {"toRevision": "v7", "fromRevision": "v41"}),
        ("rollback", {"toRevision": "v40"}),  # names no revision it rolls back from
        ("pause", {"paused": "yes"}),
        ("raise-ceiling", {"autoscalerKind": "HorizontalPodAutoscaler", "autoscaler": CHECKOUT}),
        ("failover", {"dependency": "search-api", "toTarget": "payments-api-secondary"}),
        ("failover", {"dependency": "inventory-db", "toTarget": "payments-api-secondary"}),
        ("delete", {}),
    ],
)
def test_invalid_actions_change_nothing(action: str, params: dict[str, Any]) -> None:
    model = SimModel.default()
    snapshot = model.describe(CHECKOUT)
    with pytest.raises(InvalidAction):
        model.apply(action, CHECKOUT, params)
    assert model.describe(CHECKOUT) == snapshot


@pytest.mark.parametrize(
    ("service", "kind", "dependency", "error"),
    [
        ("nope", "pool-exhausted", None, UnknownResource),
        (CHECKOUT, "meteor", None, InvalidAction),
        (CHECKOUT, "dependency-slow", "search-api", InvalidAction),
        (CHECKOUT, "pool-exhausted", "payments-api", InvalidAction),
    ],
)
def test_invalid_faults(service: str, kind: str, dependency: str | None, error: type[Exception]) -> None:
    model = SimModel.default()
    with pytest.raises(error):
        model.add_fault(service, kind, dependency)
    assert model.faults == []


def test_resource_names_with_environment() -> None:
    model = SimModel.default()
    assert model.resolve("production/checkout-api") == model.resolve(CHECKOUT) == CHECKOUT
    with pytest.raises(UnknownResource):
        model.resolve("dev/checkout-api")
    with pytest.raises(UnknownResource):
        model.resolve("checkout")


def test_topology_is_checked() -> None:
    def svc(name: str, deps: list[str]) -> Service:
        return Service(name, 1, 10.0, 10.0, 10, 100.0, "v1", dependencies=deps)

    with pytest.raises(ValueError, match="unknown service"):
        SimModel([svc("a", ["b"])])
    with pytest.raises(ValueError, match="cycle"):
        SimModel([svc("a", ["b"]), svc("b", ["a"])])
    caller = svc("a", ["b"])
    caller.active = {"b": "c"}
    with pytest.raises(ValueError, match="not its failover target"):
        SimModel([caller, svc("b", []), svc("c", [])])


OPS: list[tuple[str, Callable[[SimModel], object]]] = [
    ("slow", lambda m: m.add_fault("payments-api", "dependency-slow")),
    ("exhaust", lambda m: m.add_fault(CHECKOUT, "pool-exhausted")),
    ("bad", lambda m: m.add_fault(CHECKOUT, "bad-deploy")),
    ("scale6", lambda m: m.apply("scale", CHECKOUT, {"replicas": 6})),
    ("scale12", lambda m: m.apply("scale", CHECKOUT, {"replicas": 12})),
    ("failover", lambda m: m.apply("failover", CHECKOUT, FAILOVER)),
    ("restart", lambda m: m.apply("restart", CHECKOUT, {"rolling": True})),
    (
        "rollback",
        lambda m: m.apply(
            "rollback",
            CHECKOUT,
            {"toRevision": m.service(CHECKOUT).previous_revision, "fromRevision": m.service(CHECKOUT).revision},
        ),
    ),
    ("pause", lambda m: m.apply("pause", CHECKOUT, {"paused": not m.service(CHECKOUT).paused})),
]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(range(len(OPS))), max_size=8))
def test_p95_is_deterministic(ops: list[int]) -> None:
    first, second = SimModel.default(), SimModel.default()
    for i in ops:
        for model in (first, second):
            with contextlib.suppress(InvalidAction):  # a rollback of a paused service: refused on both alike
                OPS[i][1](model)
    assert [first.describe(n) for n in first.names] == [second.describe(n) for n in second.names]
    assert first.latency(CHECKOUT) == first.latency(CHECKOUT)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.sampled_from(range(3))), max_size=12))
def test_each_service_shows_exactly_the_faults_that_touch_it_as_they_come_and_go(
    steps: list[tuple[bool, int]],
) -> None:
    # The per-service fault index (latency() must not scan every fault) against the plain
    # definition: the faults raised on a service or naming it as the slow dependency.
    model = SimModel.default()
    for add, op in steps:
        if add or not model.faults:
            OPS[op][1](model)
        else:
            model.remove_fault(model.faults[op % len(model.faults)].id)
        for name in model.names:
            touching = [f.as_json() for f in model.faults if name in (f.service, f.dependency)]
            assert model.describe(name)["faults"] == touching


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(range(3)), max_size=3), st.integers(1, MAX_REPLICAS - 1))
def test_more_replicas_never_slow_a_service_down(faults: list[int], replicas: int) -> None:
    model = SimModel.default()
    for i in faults:
        OPS[i][1](model)
    model.apply("scale", CHECKOUT, {"replicas": replicas})
    fewer = model.p95(CHECKOUT)
    model.apply("scale", CHECKOUT, {"replicas": replicas + 1})
    assert model.p95(CHECKOUT) <= fewer


# -- the HTTP API ----------------------------------------------------------------------


def _client(action_seconds: float = 0.0) -> TestClient:
    """A client that holds the action token, as the executor does."""
    return TestClient(create_sim_app(action_seconds=action_seconds, action_token=ACTION_TOKEN), headers=EXECUTOR)


def _state(client: TestClient) -> SimState:
    state: SimState = client.app.state.sim  # type: ignore[attr-defined]
    return state


def _action(
    resource: str = CHECKOUT,
    params: dict[str, Any] | None = None,
    key: str = "incident-204:scale:12",
    token: int = 1,
    holder: str = "executor-a",
) -> dict[str, Any]:
    return {
        "resource": resource,
        "params": {"replicas": 12} if params is None else params,
        "idempotencyKey": key,
        "fencingToken": token,
        "holder": holder,
    }


def _replicas(client: TestClient, name: str = CHECKOUT) -> int:
    replicas: int = client.get(f"/services/{name}").json()["replicas"]
    return replicas


def _metrics(client: TestClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def test_healthz() -> None:
    assert _client().get("/healthz").json() == {"status": "ok", "service": "sim"}


def test_services_listing_has_the_contract_fields() -> None:
    client = _client()
    listing = client.get("/services").json()
    assert [s["name"] for s in listing] == SimModel.default().names
    fields = {
        "name",
        "environment",
        "replicas",
        "revision",
        "previousRevision",
        "earlierRevisions",
        "images",
        "paused",
        "rollbackForbidden",
        "dependencies",
        "failoverTargets",
        "activeDependencies",
        "p95Ms",
        "thresholdMs",
        "faults",
        "newestFencingToken",
    }
    assert all(set(s) == fields for s in listing)
    one = client.get("/services/checkout-api")
    assert one.status_code == 200
    assert one.json() == listing[0]
    assert client.get("/services/production/checkout-api").json() == listing[0]
    missing = client.get("/services/nope")
    assert missing.status_code == 404
    assert "nope" in missing.json()["error"]


def test_services_and_metrics_narrow_to_the_named_services() -> None:
    """``?name=`` and ``?service=`` give only the services asked for (in the model's order,
    each once, unknown names left out): what an agent reads for one incident."""
    client = _client()
    listing = {s["name"]: s for s in client.get("/services").json()}
    narrowed = client.get("/services", params={"name": ["payments-api", "nope", CHECKOUT, "production/checkout-api"]})
    assert narrowed.status_code == 200
    assert narrowed.json() == [listing[CHECKOUT], listing["payments-api"]]
    assert client.get("/services", params={"name": ["nope"]}).json() == []

    everything = _metrics(client)
    response = client.get("/metrics", params={"service": [CHECKOUT, "nope"]})
    assert response.status_code == 200
    # the sim's own series; the estate's (which grow between scrapes): test_sim_telemetry.py
    scoped = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
        if s.name.startswith("sim_")
    }
    assert scoped == {
        key: value
        for key, value in everything.items()
        if key[0].startswith("sim_") and dict(key[1])["service"] == CHECKOUT
    }
    assert ("sim_dependency_latency_p95_ms", (("dependency", "payments-api"), ("service", CHECKOUT))) in scoped
    nothing = client.get("/metrics", params={"service": ["nope"]}).text
    assert not [s for family in text_string_to_metric_families(nothing) for s in family.samples]


def test_faults_api() -> None:
    client = _client()
    created = client.post("/faults", json={"service": "payments-api", "kind": "dependency-slow"})
    assert created.status_code == 201
    fault = created.json()
    assert fault["id"] and fault["kind"] == "dependency-slow" and fault["service"] == "payments-api"
    assert client.get("/faults").json() == [fault]
    assert client.get("/services/checkout-api").json()["p95Ms"] == 1831.2
    assert client.get("/services/payments-api").json()["faults"] == [fault]
    assert client.delete(f"/faults/{fault['id']}").json() == fault
    assert client.get("/faults").json() == []
    assert client.get("/services/checkout-api").json()["p95Ms"] == 180.0
    assert client.delete(f"/faults/{fault['id']}").status_code == 404


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"service": "nope", "kind": "pool-exhausted"}, 404),
        ({"service": CHECKOUT, "kind": "meteor"}, 422),
        ({"service": CHECKOUT, "kind": "dependency-slow", "dependency": "search-api"}, 422),
        ({"service": CHECKOUT}, 400),
        ({"service": 7, "kind": "bad-deploy"}, 400),
    ],
)
def test_bad_faults(body: dict[str, Any], status: int) -> None:
    client = _client()
    response = client.post("/faults", json=body)
    assert response.status_code == status
    assert response.json()["error"]
    assert client.get("/faults").json() == []


def test_metrics_follow_the_model() -> None:
    client = _client()
    client.post("/faults", json={"service": "payments-api", "kind": "dependency-slow"})
    metrics = _metrics(client)
    assert metrics[("sim_latency_p95_ms", (("environment", "production"), ("service", CHECKOUT)))] == 1831.2
    assert metrics[("sim_latency_p95_ms", (("environment", "production"), ("service", "payments-api")))] == 280.0
    assert metrics[("sim_replicas", (("environment", "production"), ("service", CHECKOUT)))] == 4
    assert metrics[("sim_latency_threshold_ms", (("environment", "production"), ("service", CHECKOUT)))] == 500
    dep = ("sim_dependency_latency_p95_ms", (("dependency", "payments-api"), ("service", CHECKOUT)))
    assert metrics[dep] == 280.0
    assert metrics[("sim_pool_utilization_ratio", (("service", CHECKOUT),))] > 1
    client.post("/actions/scale", json=_action())
    metrics = _metrics(client)
    assert metrics[("sim_latency_p95_ms", (("environment", "production"), ("service", CHECKOUT)))] == 425.0
    assert metrics[("sim_replicas", (("environment", "production"), ("service", CHECKOUT)))] == 12


def test_two_apps_do_not_share_metrics() -> None:
    first, second = _client(), _client()
    first.post("/actions/scale", json=_action())
    assert _metrics(first)[("sim_replicas", (("environment", "production"), ("service", CHECKOUT)))] == 12
    assert _metrics(second)[("sim_replicas", (("environment", "production"), ("service", CHECKOUT)))] == 4


def test_action_applies_and_reports() -> None:
    client = _client()
    response = client.post("/actions/scale", json=_action())
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {
        "idempotencyKey",
        "action",
        "resource",
        "status",
        "before",
        "after",
        "appliedAt",
        "replayed",
        "durationMs",
    }
    assert body["idempotencyKey"] == "incident-204:scale:12"
    assert (body["action"], body["resource"], body["status"], body["replayed"]) == (
        "scale",
        CHECKOUT,
        "applied",
        False,
    )
    assert body["before"] == {"replicas": 4, "p95Ms": 180.0}
    assert body["after"] == {"replicas": 12, "p95Ms": 180.0}
    assert body["appliedAt"].endswith("Z")
    assert _replicas(client) == 12


def test_repeated_key_replays_the_recorded_result() -> None:
    client = _client()
    first = client.post("/actions/scale", json=_action()).json()
    client.post("/actions/scale", json=_action(key="other", params={"replicas": 6}))
    again = client.post("/actions/scale", json=_action())
    assert again.status_code == 200
    assert again.json() == {**first, "replayed": True}
    assert _replicas(client) == 6  # the replay did not scale back to 12
    assert _state(client).applied == 2


def test_key_reused_for_a_different_request_is_refused() -> None:
    client = _client()
    client.post("/actions/scale", json=_action())
    response = client.post("/actions/scale", json=_action(params={"replicas": 6}))
    assert response.status_code == 422
    assert "already used" in response.json()["error"]
    assert _replicas(client) == 12


def test_lookup_by_key() -> None:
    client = _client()
    assert client.get("/actions/incident-204:scale:12").status_code == 404
    applied = client.post("/actions/scale", json=_action()).json()
    found = client.get("/actions/incident-204:scale:12")
    assert found.status_code == 200
    assert found.json() == applied
    odd = "incident 7/scale:12?x"
    client.post("/actions/scale", json=_action(key=odd))
    assert client.get("/actions/incident%207%2Fscale:12%3Fx").json()["idempotencyKey"] == odd


def test_stale_token_is_refused_and_nothing_applied() -> None:
    client = _client()
    client.post("/actions/scale", json=_action(token=5))
    stale = client.post("/actions/scale", json=_action(key="late", params={"replicas": 3}, token=4))
    assert stale.status_code == 409
    assert stale.json() == {"error": "stale fencing token", "fencingToken": 4, "newestToken": 5}
    assert _replicas(client) == 12
    assert client.get("/actions/late").status_code == 404
    same = client.post("/actions/scale", json=_action(key="same", params={"replicas": 5}, token=5))
    assert same.status_code == 200
    newer = client.post("/actions/scale", json=_action(key="newer", params={"replicas": 6}, token=9))
    assert newer.status_code == 200
    assert client.post("/actions/scale", json=_action(key="older", token=5)).status_code == 409


def test_tokens_are_per_resource_whatever_the_spelling() -> None:
    client = _client()
    client.post("/actions/scale", json=_action(resource="production/checkout-api", token=3))
    assert client.post("/actions/scale", json=_action(resource=CHECKOUT, key="k2", token=2)).status_code == 409
    other = _action(resource="search-api", key="k3", token=1, params={"replicas": 3})
    assert client.post("/actions/scale", json=other).status_code == 200


def test_replay_is_answered_even_for_an_older_token() -> None:
    """Nothing is applied by a replay, so it reports the truth about the key."""
    client = _client()
    first = client.post("/actions/scale", json=_action(token=1)).json()
    client.post("/actions/scale", json=_action(key="newer", params={"replicas": 5}, token=2))
    again = client.post("/actions/scale", json=_action(token=1))
    assert again.status_code == 200
    assert again.json() == {**first, "replayed": True}
    assert _replicas(client) == 5


@pytest.mark.parametrize(
    ("path", "body", "status", "fragment"),
    [
        ("/actions/scale", {k: v for k, v in _action().items() if k != "idempotencyKey"}, 400, "idempotencyKey"),
        ("/actions/scale", {**_action(), "idempotencyKey": ""}, 400, "idempotencyKey"),
        ("/actions/scale", {k: v for k, v in _action().items() if k != "fencingToken"}, 400, "fencingToken"),
        ("/actions/scale", {**_action(), "fencingToken": "1"}, 400, "fencingToken"),
        ("/actions/scale", {**_action(), "fencingToken": -1}, 400, "fencingToken"),
        ("/actions/scale", {k: v for k, v in _action().items() if k != "resource"}, 400, "resource"),
        ("/actions/scale", [1, 2], 400, "malformed"),
        ("/actions/scale", _action(resource="nope"), 404, "nope"),
        ("/actions/scale", _action(resource="dev/checkout-api"), 404, "checkout-api"),
        ("/actions/explode", _action(), 404, "explode"),
        ("/actions/scale", _action(params={"replicas": 0}), 422, "replicas"),
        ("/actions/scale", _action(params={"count": 3}), 422, "replicas"),
        ("/actions/restart", _action(params={}), 422, "rolling"),
        ("/actions/rollback", _action(params={"toRevision": "v1", "fromRevision": "v41"}), 422, "v1"),
        ("/actions/rollback", _action(params={"toRevision": "v40"}), 422, "rolls back from"),
        ("/actions/pause", _action(params={}), 422, "paused"),
        ("/actions/raise-memory", _action(params={}), 422, "no memory limits"),
        ("/actions/failover", _action(params={"dependency": "payments-api", "toTarget": "x"}), 422, "x"),
    ],
)
def test_bad_requests(path: str, body: Any, status: int, fragment: str) -> None:
    client = _client()
    response = client.post(path, json=body)
    assert response.status_code == status, response.text
    assert fragment in response.json()["error"]
    assert _state(client).applied == 0
    assert _replicas(client) == 4
    # a refused request leaves no record and no token behind
    assert client.get("/actions/incident-204:scale:12").status_code == 404
    assert client.post("/actions/scale", json=_action(token=0)).status_code == 200


def test_body_that_is_not_json() -> None:
    response = _client().post("/actions/scale", content=b"{", headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert "JSON" in response.json()["error"]


def test_every_action_over_http() -> None:
    client = _client()
    client.post("/faults", json={"service": CHECKOUT, "kind": "bad-deploy"})
    to_v41 = {"toRevision": "v41", "fromRevision": "v42", "toImages": ["checkout-api=checkout-api:v41"]}
    rollback = client.post("/actions/rollback", json=_action(key="r", params=to_v41)).json()
    assert (rollback["before"]["revision"], rollback["after"]["revision"]) == ("v42", "v41")
    restart = client.post("/actions/restart", json=_action(key="s", params={"rolling": True})).json()
    assert restart["after"]["restarts"] == 1
    failover = client.post("/actions/failover", json=_action(key="f", params=FAILOVER)).json()
    assert failover["after"]["activeTarget"] == "payments-api-secondary"
    pause = client.post("/actions/pause", json=_action(key="p", params={"paused": True})).json()
    assert (pause["before"]["paused"], pause["after"]["paused"]) == (False, True)
    service = client.get("/services/checkout-api").json()
    assert service["revision"] == "v41"
    assert service["paused"] is True
    assert service["activeDependencies"]["payments-api"] == "payments-api-secondary"


def test_reset_restores_everything() -> None:
    client = _client()
    client.post("/faults", json={"service": "payments-api", "kind": "dependency-slow"})
    client.post("/actions/scale", json=_action(token=7))
    assert client.post("/reset").status_code == 200
    assert client.get("/faults").json() == []
    initial = [{**SimModel.default().describe(n), "newestFencingToken": None} for n in SimModel.default().names]
    assert client.get("/services").json() == initial  # the fencing ledger is reset too
    assert client.get("/actions/incident-204:scale:12").status_code == 404
    assert client.post("/actions/scale", json=_action(token=1)).json()["replayed"] is False


def test_reset_returns_to_the_model_the_app_was_given() -> None:
    model = SimModel.default()
    model.apply("scale", "search-api", {"replicas": 5})
    client = TestClient(create_sim_app(model, action_seconds=0, action_token=ACTION_TOKEN), headers=EXECUTOR)
    client.post("/actions/scale", json=_action(resource="search-api", params={"replicas": 9}))
    client.post("/reset")
    assert _replicas(client, "search-api") == 5


def test_actions_take_simulated_time() -> None:
    client = _client(action_seconds=0.3)
    started = time.monotonic()
    body = client.post("/actions/scale", json=_action()).json()
    assert time.monotonic() - started >= 0.3
    assert body["durationMs"] >= 300
    started = time.monotonic()
    assert client.post("/actions/scale", json=_action()).json()["replayed"] is True
    assert time.monotonic() - started < 0.3  # a replay does not act again


def test_concurrent_requests_with_one_key_apply_once() -> None:
    client = _client(action_seconds=0.2)
    barrier = threading.Barrier(8)

    def send(_: int) -> dict[str, Any]:
        barrier.wait()
        response = client.post("/actions/scale", json=_action())
        assert response.status_code == 200
        body: dict[str, Any] = response.json()
        return body

    with ThreadPoolExecutor(8) as pool:
        bodies = list(pool.map(send, range(8)))
    assert sorted(b["replayed"] for b in bodies) == [False] + [True] * 7
    original = next(b for b in bodies if not b["replayed"])
    assert all({**b, "replayed": False} == original for b in bodies)
    assert _state(client).applied == 1


def test_a_newer_token_fences_out_an_action_still_running() -> None:
    """Holder 1 is mid-action when holder 2 arrives: 1's write is refused at commit."""
    client = _client(action_seconds=0.4)
    results: dict[str, Any] = {}

    def old_holder() -> None:
        results["old"] = client.post("/actions/scale", json=_action(key="old", params={"replicas": 3}, token=1))

    thread = threading.Thread(target=old_holder)
    thread.start()
    time.sleep(0.15)
    newer = client.post("/actions/scale", json=_action(key="new", params={"replicas": 12}, token=2, holder="b"))
    thread.join()
    assert newer.status_code == 200
    assert results["old"].status_code == 409
    assert results["old"].json()["newestToken"] == 2
    assert _replicas(client) == 12
    assert client.get("/actions/old").status_code == 404
    assert _state(client).applied == 1


def test_many_holders_at_once_end_with_the_newest() -> None:
    client = _client(action_seconds=0.05)
    barrier = threading.Barrier(16)

    def send(token: int) -> int:
        barrier.wait()
        body = _action(key=f"k{token}", params={"replicas": token}, token=token)
        response = client.post("/actions/scale", json=body)
        if response.status_code == 409:
            assert response.json()["newestToken"] > token
        return response.status_code

    with ThreadPoolExecutor(16) as pool:
        statuses = list(pool.map(send, range(1, 17)))
    assert set(statuses) <= {200, 409}
    assert statuses[-1] == 200  # the newest token can never be fenced out
    assert _replicas(client) == 16
    assert _state(client).applied == statuses.count(200)
    assert _state(client).newest_token(CHECKOUT) == 16
    assert client.get(f"/services/{CHECKOUT}").json()["newestFencingToken"] == 16


def test_action_time_can_be_changed_at_run_time() -> None:
    from fastapi.testclient import TestClient

    from services.sim.app import create_sim_app

    client = TestClient(create_sim_app(action_seconds=0.0, action_token=ACTION_TOKEN))
    assert client.get("/settings").json() == {"actionSeconds": 0.0}
    assert client.put("/settings", json={"actionSeconds": 1.5}).json() == {"actionSeconds": 1.5}
    assert client.put("/settings", json={"actionSeconds": -1}).status_code == 422
    assert client.put("/settings", json={"actionSeconds": "slow"}).status_code == 422
    assert client.get("/settings").json() == {"actionSeconds": 1.5}


# -- who may act -----------------------------------------------------------------------


def _stranger(client: TestClient) -> TestClient:
    """A client of the same sim without the executor's token."""
    return TestClient(client.app)


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "Bearer not-the-sim-action-token",
        f"Bearer {ACTION_TOKEN}x",
        f"Bearer {ACTION_TOKEN[:-1]}",
        f"Basic {ACTION_TOKEN}",
        ACTION_TOKEN,
        "Bearer",
    ],
)
def test_an_action_without_the_action_token_is_refused_and_changes_nothing(authorization: str | None) -> None:
    client = _client()
    headers = {"Authorization": authorization} if authorization is not None else {}
    stranger = _stranger(client)
    response = stranger.post("/actions/scale", json=_action(params={"replicas": 20}, token=2**62), headers=headers)
    assert response.status_code == 401, response.text
    assert response.headers["www-authenticate"] == "Bearer"
    assert "action token" in response.json()["error"]
    assert _replicas(client) == 4
    assert _state(client).applied == 0
    assert _state(client).newest_token(CHECKOUT) is None  # no fencing token claimed either
    assert client.get(f"/services/{CHECKOUT}").json()["newestFencingToken"] is None


def test_the_ledger_is_the_executors_too() -> None:
    client = _client()
    applied = client.post("/actions/scale", json=_action()).json()
    stranger = _stranger(client)
    for key in ("incident-204:scale:12", "never-applied"):  # the same answer whether the key exists or not
        refused = stranger.get(f"/actions/{key}", headers={"Authorization": "Bearer not-the-sim-action-token"})
        assert refused.status_code == 401
        assert "incident-204" not in refused.text
    assert client.get("/actions/incident-204:scale:12").json() == applied


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/actions/scale", {k: v for k, v in _action().items() if k != "idempotencyKey"}),
        ("/actions/explode", _action()),
        ("/actions/scale", _action(resource="nope")),
        ("/actions/scale", _action(params={"replicas": 0})),
    ],
)
def test_the_token_is_checked_before_the_request(path: str, body: dict[str, Any]) -> None:
    """Without the token a caller learns nothing about actions, resources or parameters."""
    response = _stranger(_client()).post(path, json=body)
    assert response.status_code == 401
    assert "action token" in response.json()["error"]


def test_the_read_api_and_the_harness_controls_need_no_token() -> None:
    client = _client()
    stranger = _stranger(client)
    assert stranger.get("/healthz").status_code == 200
    assert stranger.get("/services").status_code == 200
    assert stranger.get(f"/services/{CHECKOUT}").status_code == 200
    assert stranger.get("/metrics").status_code == 200
    fault = stranger.post("/faults", json={"service": "payments-api", "kind": "dependency-slow"})
    assert fault.status_code == 201
    assert stranger.delete(f"/faults/{fault.json()['id']}").status_code == 200
    assert stranger.put("/settings", json={"actionSeconds": 0.5}).status_code == 200
    assert stranger.post("/reset").status_code == 200


@pytest.mark.parametrize(
    ("token", "fragment"),
    [("", "at least 16"), ("short-token", "at least 16"), ("a token with spaces in it", "whitespace")],
)
def test_a_sim_is_not_made_without_a_usable_token(token: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        create_sim_app(action_token=token)


def test_the_token_is_kept_as_a_digest() -> None:
    from services.sim.auth import ActionToken

    kept = ActionToken(ACTION_TOKEN)
    assert ACTION_TOKEN not in repr(kept) and ACTION_TOKEN.encode() not in vars(kept).values()
    assert kept.admits(ACTION_TOKEN) and not kept.admits(None) and not kept.admits("")


@pytest.mark.usefixtures("clean_env")
def test_the_sim_refuses_to_start_without_a_token(monkeypatch: pytest.MonkeyPatch) -> None:
    import uvicorn
    from pydantic import ValidationError

    from flotilla import run_app
    from services.sim.app import build_app
    from services.sim.settings import SimSettings

    def main() -> None:  # what python -m services.sim runs
        run_app(build_app, SimSettings, address=lambda s: (s.sim_host, s.sim_port), access_log=False)

    served: list[Any] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: served.append(app))
    with pytest.raises(SystemExit) as refused:
        main()
    assert "FLOTILLA_SIM_ACTION_TOKEN is not set" in str(refused.value.code)
    monkeypatch.setenv("FLOTILLA_SIM_ACTION_TOKEN", "too-short")
    with pytest.raises(ValidationError, match="at least 16"):
        main()
    assert served == []

    monkeypatch.setenv("FLOTILLA_SIM_ACTION_TOKEN", ACTION_TOKEN)
    main()
    (app,) = served
    assert TestClient(app).post("/actions/scale", json=_action()).status_code == 401
    assert TestClient(app, headers=EXECUTOR).post("/actions/scale", json=_action()).status_code == 200


@pytest.mark.usefixtures("clean_env")
def test_the_sim_reads_its_token_from_a_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """FLOTILLA_SIM_ACTION_TOKEN_FILE (docker compose): read at start, checked like the variable."""
    import uvicorn
    from pydantic import ValidationError

    from flotilla import run_app
    from services.sim.app import build_app
    from services.sim.settings import SimSettings

    def main() -> None:  # what python -m services.sim runs
        run_app(build_app, SimSettings, address=lambda s: (s.sim_host, s.sim_port), access_log=False)

    served: list[Any] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: served.append(app))
    token = tmp_path / "sim-action-token"
    monkeypatch.setenv("FLOTILLA_SIM_ACTION_TOKEN_FILE", str(token))
    with pytest.raises(SystemExit) as refused:
        main()
    assert f"FLOTILLA_SIM_ACTION_TOKEN_FILE {token}" in str(refused.value.code)  # missing
    token.write_text("too-short\n")
    with pytest.raises(SystemExit, match="at least 16"):
        main()
    assert served == []
    token.write_text(ACTION_TOKEN + "\n")
    main()
    (app,) = served
    assert TestClient(app).post("/actions/scale", json=_action()).status_code == 401
    assert TestClient(app, headers=EXECUTOR).post("/actions/scale", json=_action()).status_code == 200
    monkeypatch.setenv("FLOTILLA_SIM_ACTION_TOKEN", ACTION_TOKEN)
    with pytest.raises(ValidationError, match="not both"):
        SimSettings()


def test_the_token_file_is_given_kept_or_generated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """What compose's keys-init runs: no default token, ever."""
    from services.sim import token_file
    from services.sim.auth import check_action_token

    path = tmp_path / "volume" / "sim-action-token"
    assert token_file.ensure(path) == "generated"
    first = path.read_text().strip()
    assert check_action_token(first) == first and len(first) >= 43
    assert path.stat().st_mode & 0o777 == 0o600
    assert token_file.ensure(path) == "kept" and path.read_text().strip() == first
    assert token_file.ensure(tmp_path / "other") == "generated"
    assert (tmp_path / "other").read_text().strip() != first  # random, not a constant

    assert token_file.ensure(path, ACTION_TOKEN) == "given"
    assert path.read_text().strip() == ACTION_TOKEN
    assert token_file.ensure(path) == "kept" and path.read_text().strip() == ACTION_TOKEN

    with pytest.raises(ValueError, match="at least 16"):
        token_file.ensure(path, "short")
    assert path.read_text().strip() == ACTION_TOKEN  # nothing written
    path.write_text("unusable\n")
    assert token_file.ensure(path) == "generated"  # a file the sim would refuse is replaced

    monkeypatch.setenv("FLOTILLA_SIM_ACTION_TOKEN", "with a space in it, long enough")
    assert token_file.main([str(path)]) == 2
    assert token_file.main([]) == 2


def test_a_generated_estate_is_pairs_that_breach_and_recover_like_checkout() -> None:
    model = SimModel.generated(200, production_share=0.25)
    assert len(model.names) == 200
    assert SimModel.generated(200).names == model.names  # deterministic
    shops = [n for n in model.names if n.startswith("shop-")]
    environments = [model.service(n).environment for n in shops]
    assert environments.count("production") == 25 and environments.count("dev") == 75
    shop, pay = "shop-0007", "pay-0007"
    assert model.service(shop).dependencies == [pay]
    healthy = model.describe(shop)["p95Ms"]
    assert healthy < model.service(shop).threshold_ms
    model.add_fault(pay, "dependency-slow", None)
    assert model.describe(shop)["p95Ms"] > model.service(shop).threshold_ms  # the incident
    assert model.describe("shop-0008")["p95Ms"] == SimModel.generated(200).describe("shop-0008")["p95Ms"]  # only it
    model.apply("scale", shop, {"replicas": 12})
    assert model.describe(shop)["p95Ms"] < model.service(shop).threshold_ms  # the recovery the rules propose
    for bad in (1, 3, 2002):
        with pytest.raises(ValueError, match="even number"):
            SimModel.generated(bad)


def test_the_sim_counts_action_requests_and_applications_per_key() -> None:
    client = TestClient(create_sim_app(action_token=ACTION_TOKEN, action_seconds=0), headers=EXECUTOR)
    first = client.post("/actions/scale", json=_action())
    again = client.post("/actions/scale", json=_action())  # the same key: a replay, not a second scale
    assert first.status_code == again.status_code == 200 and again.json()["replayed"]
    counts = client.get("/action-counts").json()
    (key,) = counts["keys"]
    assert counts["keys"][key] == {"requests": 2, "applied": 1}
    assert counts["appliedMoreThanOnce"] == [] and counts["requestedMoreThanOnce"] == [key]
    assert TestClient(create_sim_app(action_token=ACTION_TOKEN)).get("/action-counts").status_code == 401
