"""The sim's rollback, pause and refusals: the Kubernetes target's semantics in the sim's terms
(issue 40, item 6). A rollback names the revision it rolls back from and an earlier revision
to return to; a release marked irreversible is not rolled back; a paused rollout holds."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from services.sim import SimModel, create_sim_app
from services.sim.ledger import Applied, Ledger
from services.sim.model import REVISION_HISTORY, InvalidAction
from services.sim.state import SimState, _fingerprint

CHECKOUT = "checkout-api"
TOKEN = "executor-only-sim-action-token"


def _deployed() -> SimModel:
    """checkout-api on a bad v42 that replaced v41 (which replaced v40)."""
    model = SimModel.default()
    model.add_fault(CHECKOUT, "bad-deploy")
    return model


def _rollback(to: str = "v41", source: str | None = "v42", **more: Any) -> dict[str, Any]:
    return {"toRevision": to, "fromRevision": source, "fromTemplateHash": None, "toTemplateHash": None, **more}


def test_a_rollback_names_both_revisions_and_returns_to_the_earlier_one() -> None:
    model = _deployed()
    images = {"fromImages": ["checkout-api=checkout-api:v42"], "toImages": ["checkout-api=checkout-api:v41"]}
    before, after = model.apply("rollback", CHECKOUT, _rollback(**images))
    assert before == {
        "revision": "v42",
        "templateHash": None,
        "images": ["checkout-api=checkout-api:v42"],
        "previousRevision": "v41",
        "p95Ms": before["p95Ms"],
    }
    assert (after["revision"], after["templateHash"], after["images"]) == (
        "v41",
        None,
        ["checkout-api=checkout-api:v41"],
    )
    assert model.p95(CHECKOUT) == 180.0
    # the revision rolled back from is now the newest earlier one, as a renumbered ReplicaSet
    assert model.describe(CHECKOUT)["earlierRevisions"] == ["v40", "v42"]
    model.apply("rollback", CHECKOUT, _rollback("v40", "v41"))  # any earlier revision, not only the last
    assert model.describe(CHECKOUT)["earlierRevisions"] == ["v42", "v41"]


@pytest.mark.parametrize(
    ("params", "reason"),
    [
        (_rollback(source=None), "must name the revision it rolls back from"),
        ({"toRevision": "v41"}, "must name the revision it rolls back from"),
        (_rollback(source="v41"), "runs 'v42', not 'v41'"),
        (_rollback(to="v42"), "not an earlier revision"),
        (_rollback(to="v39"), "not an earlier revision"),
        (_rollback(to=""), "toRevision must be"),
        (_rollback(fromTemplateHash="5d8f7c9b6"), "no pod-template hash"),
        (_rollback(toTemplateHash="5d8f7c9b6"), "no pod-template hash"),
        (_rollback(toImages=["checkout-api=checkout-api:v40"]), "toImages: the images of 'v41'"),
        (_rollback(toImages="checkout-api=checkout-api:v41"), "toImages: the images of 'v41'"),
        (_rollback(fromImages=["checkout-api=checkout-api:v41"]), "fromImages: the images of 'v42'"),
        ({**_rollback(), "force": True}, "takes params"),
    ],
)
def test_a_rollback_the_sim_cannot_take_changes_nothing(params: dict[str, Any], reason: str) -> None:
    model = _deployed()
    snapshot = model.describe(CHECKOUT)
    with pytest.raises(InvalidAction, match=reason):
        model.apply("rollback", CHECKOUT, params)
    assert model.describe(CHECKOUT) == snapshot


def test_a_release_marked_irreversible_is_not_rolled_back_while_it_runs() -> None:
    model = _deployed()
    mark = model.add_fault(CHECKOUT, "rollback-forbidden")
    assert mark.revision == "v42"
    assert model.p95(CHECKOUT) == _deployed().p95(CHECKOUT)  # the mark slows nothing
    reason = model.describe(CHECKOUT)["rollbackForbidden"]
    assert reason == f"release v42 of checkout-api is marked irreversible ({mark.id})"
    with pytest.raises(InvalidAction, match="may not be rolled back: release v42"):
        model.apply("rollback", CHECKOUT, _rollback())
    model.remove_fault(mark.id)
    assert model.describe(CHECKOUT)["rollbackForbidden"] is None
    model.apply("rollback", CHECKOUT, _rollback())


def test_the_mark_travels_with_its_release() -> None:
    model = SimModel.default()
    model.add_fault(CHECKOUT, "rollback-forbidden")  # v41 is irreversible
    model.add_fault(CHECKOUT, "bad-deploy")  # v42 is not: it may be rolled back (to v41)
    assert model.describe(CHECKOUT)["rollbackForbidden"] is None
    model.apply("rollback", CHECKOUT, _rollback())
    assert "release v41" in (model.describe(CHECKOUT)["rollbackForbidden"] or "")


def test_a_paused_rollout_holds_rollbacks_until_it_is_resumed() -> None:
    model = _deployed()
    before, after = model.apply("pause", CHECKOUT, {"paused": True})
    assert (before["paused"], after["paused"]) == (False, True)
    assert model.describe(CHECKOUT)["paused"] is True
    with pytest.raises(InvalidAction, match="paused: resume it"):
        model.apply("rollback", CHECKOUT, _rollback())
    model.apply("scale", CHECKOUT, {"replicas": 6})  # scaling a paused Deployment is allowed, as on Kubernetes
    again = model.apply("pause", CHECKOUT, {"paused": True})  # pausing twice changes nothing
    assert again[0]["paused"] is again[1]["paused"] is True
    model.apply("pause", CHECKOUT, {"paused": False})
    model.apply("rollback", CHECKOUT, _rollback())
    assert model.service(CHECKOUT).revision == "v41"


def test_earlier_revisions_are_bounded() -> None:
    model = SimModel.default()
    for _ in range(REVISION_HISTORY + 5):
        model.add_fault(CHECKOUT, "bad-deploy")
    earlier = model.describe(CHECKOUT)["earlierRevisions"]
    assert len(earlier) == REVISION_HISTORY
    assert earlier[-1] == model.describe(CHECKOUT)["previousRevision"]


# -- over HTTP: the status the executor's SimTarget maps, idempotency and fencing --------


def _client() -> TestClient:
    client = TestClient(
        create_sim_app(action_seconds=0, action_token=TOKEN), headers={"Authorization": f"Bearer {TOKEN}"}
    )
    client.post("/faults", json={"service": CHECKOUT, "kind": "bad-deploy"})
    return client


def _call(client: TestClient, action: str, params: dict[str, Any], key: str, token: int = 1) -> Any:
    body = {"resource": f"production/{CHECKOUT}", "params": params, "idempotencyKey": key, "fencingToken": token}
    return client.post(f"/actions/{action}", json=body)


@pytest.mark.parametrize(
    ("action", "reason"),
    [
        ("raise-ceiling", "the sim has no autoscaler"),
        ("raise-memory", "the sim has no memory limits"),
    ],
)
def test_actions_the_sim_does_not_model_are_refused_clearly(action: str, reason: str) -> None:
    params = (
        {"autoscalerKind": "HorizontalPodAutoscaler", "autoscaler": CHECKOUT, "fromMaxReplicas": 4, "maxReplicas": 8}
        if action == "raise-ceiling"
        else {"container": CHECKOUT, "fromMemoryLimitBytes": 2**28, "memoryLimitBytes": 2**29}
    )
    response = _call(_client(), action, params, "k")
    assert response.status_code == 422
    assert reason in response.json()["error"]


def test_a_forbidden_rollback_over_http_is_a_4xx_and_applies_nothing() -> None:
    client = _client()
    assert client.post("/faults", json={"service": CHECKOUT, "kind": "rollback-forbidden"}).status_code == 201
    refused = _call(client, "rollback", _rollback(), "incident-1:rollback")
    assert refused.status_code == 422
    assert "may not be rolled back" in refused.json()["error"]
    assert client.get(f"/services/{CHECKOUT}").json()["revision"] == "v42"
    assert client.get("/actions/incident-1:rollback").status_code == 404


def test_pause_is_applied_once_per_key_and_fenced() -> None:
    client = _client()
    first = _call(client, "pause", {"paused": True}, "p", token=3)
    assert first.status_code == 200
    assert (first.json()["before"], first.json()["after"]) == (
        {"paused": False, "p95Ms": first.json()["before"]["p95Ms"]},
        {"paused": True, "p95Ms": first.json()["after"]["p95Ms"]},
    )
    again = _call(client, "pause", {"paused": True}, "p", token=3)
    assert again.json() == {**first.json(), "replayed": True}
    stale = _call(client, "pause", {"paused": False}, "resume", token=2)
    assert stale.status_code == 409
    assert client.get(f"/services/{CHECKOUT}").json()["paused"] is True
    counts = client.get("/action-counts").json()["keys"]
    assert counts["p"] == {"requests": 2, "applied": 1}


def test_paused_and_forbidden_are_published_as_kube_state_metrics_would() -> None:
    client = _client()
    _call(client, "pause", {"paused": True}, "p")
    client.post("/faults", json={"service": CHECKOUT, "kind": "rollback-forbidden"})
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(client.get("/metrics").text)
        for s in family.samples
    }
    where = (("deployment", CHECKOUT), ("namespace", "production"))
    assert samples[("kube_deployment_spec_paused", where)] == 1
    assert samples[("kube_deployment_spec_paused", (("deployment", "search-api"), ("namespace", "production")))] == 0
    forbidden = [labels for name, labels in samples if name == "kube_deployment_annotations"]
    assert forbidden == [
        (
            (
                "annotation_flotilla_dev_rollback_forbidden",
                "release v42 of checkout-api is marked irreversible (fault-2)",
            ),
            *where,
        )
    ]


def test_a_ledger_rollback_from_before_from_revision_still_replays() -> None:
    """A ledger written before rollbacks named their "from" revision rebuilds its estate."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ledger.sqlite"
        first = SimState(SimModel.default(), action_seconds=0, sleep=lambda _: None, ledger=Ledger(path))
        first.add_fault(CHECKOUT, "bad-deploy", None)
        old = {"toRevision": "v41"}
        body = {"action": "rollback", "resource": CHECKOUT, "status": "applied"}
        Ledger(path).record(Applied("old-key", _fingerprint("rollback", CHECKOUT, old), old, body, None, 1))
        restarted = SimState(SimModel.default(), action_seconds=0, sleep=lambda _: None, ledger=Ledger(path))
        assert restarted.service(CHECKOUT)["revision"] == "v41"
