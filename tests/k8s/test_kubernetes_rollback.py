"""Rollback to an exact revision on a real API server, with the executor's own token.

The controller manager of the lane makes the ReplicaSets and their revision numbers (no
pod runs: there is no node); the target reads them, checks the plan against them and
writes the "to" ReplicaSet's pod template into the Deployment. Each refusal is shown to
leave the Deployment as it was.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from flotilla import actions
from services.executor.targets import KubernetesTarget, StaleFencingToken, TargetRejected

from .conftest import MERGE, TARGET_NAMESPACE, Cluster, apps, deployment
from .test_kubernetes_target import ENVIRONMENT, hooked, live, target

pytestmark = pytest.mark.timeout(300)

REVISION = "deployment.kubernetes.io/revision"
HASH = "pod-template-hash"
OLD_IMAGE = "registry.example.com/app:1"
NEW_IMAGE = "registry.example.com/app:2"
LATENCIES: dict[str, list[float]] = {"applied": [], "refused": []}


@pytest.fixture(scope="module")
def executor_token(production: Cluster) -> str:
    return production.token_for("executor", "flotilla")


def replica_sets(cluster: Cluster, name: str) -> list[dict[str, Any]]:
    """The ReplicaSets the controller made for ``name``, oldest revision first."""
    with cluster.client() as api:
        items: list[dict[str, Any]] = api.get(
            f"/apis/apps/v1/namespaces/{TARGET_NAMESPACE}/replicasets", params={"labelSelector": f"app={name}"}
        ).json()["items"]
    return sorted(items, key=lambda rs: int(rs["metadata"].get("annotations", {}).get(REVISION, "0")))


def wait_for(cluster: Cluster, name: str, revisions: list[str], timeout: float = 60) -> list[dict[str, Any]]:
    """The ReplicaSets once their revisions (oldest first) are ``revisions``."""
    deadline = time.monotonic() + timeout
    while True:
        found = replica_sets(cluster, name)
        if [rs["metadata"]["annotations"].get(REVISION) for rs in found] == revisions:
            return found
        assert time.monotonic() < deadline, [(rs["metadata"]["name"], rs["metadata"]["annotations"]) for rs in found]
        time.sleep(0.3)


def written(deployment: dict[str, Any]) -> tuple[Any, ...]:
    """What a write of the executor would change: the spec (its generation) and the
    annotations but the controller's revision. Not the resourceVersion: the controller
    writes the status and that annotation."""
    annotations = dict(deployment["metadata"].get("annotations") or {})
    annotations.pop(REVISION, None)
    return deployment["metadata"]["generation"], annotations


def images(template: dict[str, Any]) -> list[str]:
    return [f"{c['name']}={c['image']}" for c in template["spec"]["containers"]]


@pytest.fixture()
def released(production: Cluster) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A Deployment with two revisions: 1 (app:1) and 2 (app:2, with an env var, a label
    and an annotation revision 1 does not have), and its two ReplicaSets."""
    name = f"shop-{uuid.uuid4().hex[:8]}"
    with production.client() as api:
        assert api.post(apps(), json=deployment(name, replicas=2)).status_code == 201
        wait_for(production, name, ["1"])
        release = {
            "spec": {
                "template": {
                    "metadata": {"labels": {"track": "bad"}, "annotations": {"release": "2"}},
                    "spec": {
                        "containers": [{"name": "app", "image": NEW_IMAGE, "env": [{"name": "FLAG", "value": "on"}]}]
                    },
                }
            }
        }
        assert api.patch(apps(f"/{name}"), json=release, headers=MERGE).status_code == 200
    yield name, wait_for(production, name, ["1", "2"])
    with production.client() as api:
        api.delete(apps(f"/{name}"))


def plan(rs_sets: list[dict[str, Any]], **overrides: Any) -> dict[str, Any]:
    """The rollback a planner would propose from what the ReplicaSets show: the newest
    revision back to the one before (2 -> 1 on a fresh ``released``)."""
    old, new = rs_sets
    return {
        "toRevision": old["metadata"]["annotations"][REVISION],
        "fromRevision": new["metadata"]["annotations"][REVISION],
        "fromTemplateHash": new["metadata"]["labels"][HASH],
        "toTemplateHash": old["metadata"]["labels"][HASH],
        "fromImages": images(new["spec"]["template"]),
        "toImages": images(old["spec"]["template"]),
        **overrides,
    }


def rollback(k8s: KubernetesTarget, name: str, params: dict[str, Any], key: str | None = None, token: int = 3) -> Any:
    """apply("rollback"), its wall time kept (applied or refused) for the latency figure."""
    started = time.perf_counter()
    outcome = "refused"
    try:
        result = k8s.apply("rollback", f"{ENVIRONMENT}/{name}", params, key or f"k-{uuid.uuid4()}", token, "executor-0")
        outcome = "replayed" if result.replayed else "applied"
        return result
    finally:
        LATENCIES.setdefault(outcome, []).append(time.perf_counter() - started)


def test_rollback_restores_the_old_template_and_the_controller_makes_it_the_newest_revision(
    production: Cluster, executor_token: str, released: tuple[str, list[dict[str, Any]]]
) -> None:
    name, (old, new) = released
    with target(production, executor_token) as k8s:
        result = rollback(k8s, name, plan([old, new]))
    assert result.before == {
        "revision": "2",
        "templateHash": new["metadata"]["labels"][HASH],
        "images": [f"app={NEW_IMAGE}"],
    }
    assert result.after == {  # the number the controller gives the restored template (checked below)
        "revision": "3",
        "restoredRevision": "1",
        "templateHash": old["metadata"]["labels"][HASH],
        "images": [f"app={OLD_IMAGE}"],
    }
    template = live(production, name)["spec"]["template"]
    assert images(template) == [f"app={OLD_IMAGE}"]
    assert template["metadata"]["labels"] == {"app": name}  # no "track", no pod-template-hash
    assert "annotations" not in template["metadata"] and "env" not in template["spec"]["containers"][0]
    # The controller adopts the old ReplicaSet again: renumbered 3, no third ReplicaSet made.
    again = wait_for(production, name, ["2", "3"])
    assert again[-1]["metadata"]["uid"] == old["metadata"]["uid"]
    assert again[-1]["metadata"]["annotations"]["deployment.kubernetes.io/revision"] == result.after["revision"]
    assert images(again[-1]["spec"]["template"]) == [f"app={OLD_IMAGE}"]
    annotations = live(production, name)["metadata"]["annotations"]
    assert annotations[KubernetesTarget.TOKEN] == "3" and KubernetesTarget.LAST_KEY in annotations


def test_a_rollback_is_undone_by_the_compensation_its_kind_derives(
    production: Cluster, executor_token: str, released: tuple[str, list[dict[str, Any]]]
) -> None:
    """The saga's undo of a rollback (flotilla.actions.rollback) names the revision the
    controller renumbered the restored template to, so rolling forward again is accepted."""
    name, (old, new) = released
    with target(production, executor_token) as k8s:
        result = rollback(k8s, name, plan([old, new]))
        wait_for(production, name, ["2", "3"])
        undo = actions.by_action("rollback").undo(name, {}, result.before, result.after)
        assert undo.params is not None
        forward = rollback(k8s, name, dict(undo.params))
    assert forward.before["revision"] == "3" and forward.after["restoredRevision"] == "2"
    assert images(live(production, name)["spec"]["template"]) == [f"app={NEW_IMAGE}"]
    wait_for(production, name, ["3", "4"])


def test_the_same_key_twice_rolls_back_once(
    production: Cluster, executor_token: str, released: tuple[str, list[dict[str, Any]]]
) -> None:
    name, rs_sets = released
    key = f"incident-7:{uuid.uuid4()}:rollback:{name}:1"
    with target(production, executor_token) as k8s:
        first = rollback(k8s, name, plan(rs_sets), key)
        wait_for(production, name, ["2", "3"])
        version = written(live(production, name))
        again = rollback(k8s, name, plan(rs_sets), key)
    assert again.replayed and again.after == first.after and not first.replayed
    assert written(live(production, name)) == version  # not even a write


def test_a_persons_change_since_the_plan_is_refused_and_nothing_is_applied(
    production: Cluster, executor_token: str, released: tuple[str, list[dict[str, Any]]]
) -> None:
    name, rs_sets = released
    with production.client() as api:  # someone ships app:3 after the plan was made
        fix = {"spec": {"template": {"spec": {"containers": [{"name": "app", "image": "registry.example.com/app:3"}]}}}}
        assert api.patch(apps(f"/{name}"), json=fix, headers=MERGE).status_code == 200
    before = written(live(production, name))
    with target(production, executor_token) as k8s, pytest.raises(TargetRejected) as refused:
        rollback(k8s, name, plan(rs_sets))
    assert "no longer runs revision 2" in str(refused.value) or "none of its ReplicaSets" in str(refused.value)
    assert written(live(production, name)) == before


def test_a_change_between_the_read_and_the_write_is_refused_after_reading_again(
    production: Cluster, executor_token: str, released: tuple[str, list[dict[str, Any]]]
) -> None:
    """The person's edit lands after the target read the Deployment and its ReplicaSets:
    the write's resourceVersion is gone (409), the target reads again and finds the
    Deployment on another template."""
    name, rs_sets = released

    def someone_ships(request: httpx.Request, response: httpx.Response | None) -> None:
        if request.url.path.endswith("/replicasets") and not shipped:
            shipped.append(True)
            with production.client() as admin:
                fix = {"spec": {"template": {"spec": {"containers": [{"name": "app", "image": "app:hotfix"}]}}}}
                assert admin.patch(apps(f"/{name}"), json=fix, headers=MERGE).status_code == 200

    shipped: list[bool] = []
    with hooked(production, executor_token, someone_ships) as k8s, pytest.raises(TargetRejected):
        rollback(k8s, name, plan(rs_sets))
    assert images(live(production, name)["spec"]["template"]) == ["app=app:hotfix"]
    assert KubernetesTarget.LAST_KEY not in live(production, name)["metadata"].get("annotations", {})


def test_a_target_revision_that_is_gone_is_refused(
    production: Cluster, executor_token: str, released: tuple[str, list[dict[str, Any]]]
) -> None:
    name, (old, new) = released
    with production.client() as api:
        gone = api.delete(f"/apis/apps/v1/namespaces/{TARGET_NAMESPACE}/replicasets/{old['metadata']['name']}")
        assert gone.status_code == 200
    wait_for(production, name, ["2"])
    with target(production, executor_token) as k8s, pytest.raises(TargetRejected, match=r"revision 1 .* is gone"):
        rollback(k8s, name, plan([old, new]))
    assert images(live(production, name)["spec"]["template"]) == [f"app={NEW_IMAGE}"]


def test_a_replica_set_with_matching_labels_but_another_owner_is_not_taken(
    production: Cluster, executor_token: str, released: tuple[str, list[dict[str, Any]]]
) -> None:
    """Revision 1's ReplicaSet is handed to another controller (a ConfigMap stands in for
    it): it keeps the Deployment's labels, its revision "1" and its hash, so labels alone
    would take it; the owner uid does not."""
    name, (old, new) = released
    with production.client() as api:
        other = api.post(
            f"/api/v1/namespaces/{TARGET_NAMESPACE}/configmaps", json={"metadata": {"name": f"owner-{name}"}}
        ).json()
        owner = {"apiVersion": "v1", "kind": "ConfigMap", "name": f"owner-{name}", "uid": other["metadata"]["uid"]}
        url = f"/apis/apps/v1/namespaces/{TARGET_NAMESPACE}/replicasets/{old['metadata']['name']}"
        handed = [{"op": "replace", "path": "/metadata/ownerReferences", "value": [{**owner, "controller": True}]}]
        answer = api.patch(url, json=handed, headers={"Content-Type": "application/json-patch+json"})
        assert answer.status_code == 200, answer.text
    try:
        with target(production, executor_token) as k8s, pytest.raises(TargetRejected, match="not owned by it") as no:
            rollback(k8s, name, plan([old, new]))
        assert f"ConfigMap/owner-{name}" in str(no.value)
        assert images(live(production, name)["spec"]["template"]) == [f"app={NEW_IMAGE}"]
    finally:
        with production.client() as api:
            api.delete(f"/api/v1/namespaces/{TARGET_NAMESPACE}/configmaps/owner-{name}")


@pytest.mark.parametrize("where", ["deployment", "template"])
def test_a_rollback_forbidden_by_annotation_is_refused_with_its_reason(
    production: Cluster, executor_token: str, released: tuple[str, list[dict[str, Any]]], where: str
) -> None:
    name, rs_sets = released
    reason = "migration 0042 dropped the legacy column"
    forbid: dict[str, Any] = {"metadata": {"annotations": {"flotilla.dev/rollback-forbidden": reason}}}
    with production.client() as api:
        patch = forbid if where == "deployment" else {"spec": {"template": forbid}}
        assert api.patch(apps(f"/{name}"), json=patch, headers=MERGE).status_code == 200
    params = plan(rs_sets)
    if where == "template":  # the forbidden release is now revision 3
        params = plan(wait_for(production, name, ["1", "2", "3"])[::2], fromRevision="3")
    version = written(live(production, name))
    with target(production, executor_token) as k8s, pytest.raises(TargetRejected, match=reason):
        rollback(k8s, name, params)
    assert written(live(production, name)) == version


def test_a_plan_naming_other_hashes_or_images_is_refused(
    production: Cluster, executor_token: str, released: tuple[str, list[dict[str, Any]]]
) -> None:
    name, rs_sets = released
    version = written(live(production, name))
    with target(production, executor_token) as k8s:
        for params, fragment in (
            (plan(rs_sets, toTemplateHash="0000000000"), "not the template the plan names"),
            (plan(rs_sets, fromTemplateHash="0000000000"), "not the template the plan saw"),
            (plan(rs_sets, toImages=["app=registry.example.com/app:0"]), "as the plan says"),
            (plan(rs_sets, fromImages=["app=registry.example.com/app:9"]), "as the plan saw"),
            (plan(rs_sets, fromRevision="1", toRevision="2"), "no longer runs revision 1"),
            (plan(rs_sets, fromRevision=None), "must name the revision it rolls back from"),
        ):
            with pytest.raises(TargetRejected, match=fragment):
                rollback(k8s, name, params)
    assert written(live(production, name)) == version


def test_the_executor_fenced_out_between_its_read_and_its_write_lands_nothing(
    production: Cluster, executor_token: str, released: tuple[str, list[dict[str, Any]]]
) -> None:
    """The older holder (token 5) reads the Deployment and its ReplicaSets; before it
    writes, a newer holder (token 6) pauses the rollout. The older's write carries a
    resourceVersion that is gone, so it reads again and finds itself stale."""
    name, rs_sets = released
    newer = target(production, executor_token)

    def a_newer_holder_acts(request: httpx.Request, response: httpx.Response | None) -> None:
        if request.url.path.endswith("/replicasets") and not acted:
            acted.append(newer.apply("pause", f"{ENVIRONMENT}/{name}", {"paused": True}, "k-newer", 6, "executor-1"))

    acted: list[Any] = []
    with hooked(production, executor_token, a_newer_holder_acts) as old, pytest.raises(StaleFencingToken) as stale:
        rollback(old, name, plan(rs_sets), "k-older", token=5)
    newer.close()
    assert (stale.value.token, stale.value.newest) == (5, 6)
    now = live(production, name)
    assert images(now["spec"]["template"]) == [f"app={NEW_IMAGE}"] and now["spec"]["paused"] is True
    assert now["metadata"]["annotations"][KubernetesTarget.LAST_KEY] == "k-newer"
    assert "k-older" not in now["metadata"]["annotations"][KubernetesTarget.ACTIONS]


def test_a_paused_deployment_is_not_rolled_back(
    production: Cluster, executor_token: str, released: tuple[str, list[dict[str, Any]]]
) -> None:
    name, rs_sets = released
    with production.client() as api:
        assert api.patch(apps(f"/{name}"), json={"spec": {"paused": True}}, headers=MERGE).status_code == 200
    with target(production, executor_token) as k8s, pytest.raises(TargetRejected, match="paused"):
        rollback(k8s, name, plan(rs_sets))


def test_rollback_latency(production: Cluster, executor_token: str, released: tuple[str, list[dict[str, Any]]]) -> None:
    """The wall time of apply("rollback") on this lane, printed for the report: ten
    rollbacks back and forth on one Deployment through one target (a warm connection, as
    the executor holds one), each once the controller has numbered the last; and every
    call of the tests above (a fresh connection each), by outcome. An applied rollback is
    a GET of the Deployment, a list of its ReplicaSets and one JSON Patch."""
    name, _ = released
    warm: list[float] = []
    with target(production, executor_token) as k8s:
        for turn in range(10):
            pair = wait_for(production, name, [str(turn + 1), str(turn + 2)])  # the last one numbered
            started = time.perf_counter()
            result = k8s.apply("rollback", f"{ENVIRONMENT}/{name}", plan(pair), f"k-{uuid.uuid4()}", 3, "executor-0")
            warm.append(time.perf_counter() - started)
            assert result.after["images"] == images(pair[0]["spec"]["template"])
    for outcome, seconds in {"warm, applied": warm, **LATENCIES}.items():
        ordered = sorted(seconds)
        if ordered:
            print(
                f"\nrollback apply() {outcome} on the lane: n={len(ordered)} "
                f"median={ordered[len(ordered) // 2] * 1000:.0f} ms max={ordered[-1] * 1000:.0f} ms"
            )
