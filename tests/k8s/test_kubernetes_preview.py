"""The exact change a person approves, on a real API server: the policy service's preview
with its own token (a dry run the admission policy lets through), and the executor's
second dry run of the same write, which must show the same change or the step is refused.

Both sides plan the write with flotilla.actions.kubernetes.planned_write; what differs
between them (the executor's fencing token, record and resourceVersion, a restart's time)
must not change what a person is shown.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from flotilla_evidence.kubernetes import KubernetesApi

from flotilla.actions import Change, NoPreview
from services.executor.targets import TargetRejected
from services.policy.decide import StepFacts, Target
from services.policy.preview_kubernetes import KubernetesPreviewer

from . import test_kubernetes_rollback
from .conftest import FLEET_NAMESPACE, TARGET_NAMESPACE, Cluster, apps, deployment
from .test_kubernetes_rollback import NEW_IMAGE, OLD_IMAGE, plan
from .test_kubernetes_target import ENVIRONMENT, live, target

pytestmark = pytest.mark.timeout(300)

released = test_kubernetes_rollback.released  # the fixture: a Deployment with revisions 1 and 2

MiB = 2**20
STRATEGIC = {"Content-Type": "application/strategic-merge-patch+json"}  # containers merged by name
LATENCIES: list[float] = []


@pytest.fixture(scope="module")
def executor_token(production: Cluster) -> str:
    return production.token_for("executor", FLEET_NAMESPACE)


@pytest.fixture(scope="module")
def previewer(production: Cluster) -> Iterator[KubernetesPreviewer]:
    """The policy service's previewer, with the policy service's own token."""
    token = production.token_for("policy-service", FLEET_NAMESPACE)
    api = KubernetesApi(production.url, token, ca_file=production.ca, timeout=10)
    found = KubernetesPreviewer(api, {ENVIRONMENT: TARGET_NAMESPACE})
    yield found
    found.close()
    if LATENCIES:
        ordered = sorted(LATENCIES)
        print(
            f"\npreview latency over {len(ordered)} previews: median {ordered[len(ordered) // 2] * 1000:.0f} ms,"
            f" max {ordered[-1] * 1000:.0f} ms"
        )


def preview(previewer: KubernetesPreviewer, name: str, kind: str, params: dict[str, Any]) -> Change:
    step = StepFacts(f"c-{uuid.uuid4()}", kind, Target("service", ENVIRONMENT, name), params, expires_at_ms=0)
    started = time.perf_counter()
    shown = previewer.preview(step)
    LATENCIES.append(time.perf_counter() - started)
    assert isinstance(shown, Change), shown
    return shown


@pytest.fixture()
def limited(production: Cluster) -> Iterator[str]:
    """A Deployment whose container has a 256Mi memory limit."""
    name = f"shop-{uuid.uuid4().hex[:8]}"
    body = deployment(name, replicas=2)
    body["spec"]["template"]["spec"]["containers"][0]["resources"] = {"limits": {"memory": "256Mi"}}
    with production.client() as api:
        assert api.post(apps(), json=body).status_code == 201
    yield name
    with production.client() as api:
        api.delete(apps(f"/{name}"))


def generation(cluster: Cluster, name: str) -> int:
    return int(live(cluster, name)["metadata"]["generation"])


MEMORY = {"container": "app", "fromMemoryLimitBytes": 256 * MiB, "memoryLimitBytes": 384 * MiB}


def raise_memory(cluster: Cluster, token: str, name: str, approved: Change) -> None:
    """The executor's raise-memory of MEMORY, bound to the change a person approved."""
    with target(cluster, token) as k8s:
        k8s.apply(
            "raise-memory", f"{ENVIRONMENT}/{name}", MEMORY, f"k-{uuid.uuid4()}", 3, "e",
            expected_change=approved.digest,
        )  # fmt: skip


def test_a_rollbacks_preview_shows_the_images_and_the_executor_applies_exactly_it(
    production: Cluster,
    previewer: KubernetesPreviewer,
    executor_token: str,
    released: tuple[str, list[dict[str, Any]]],
) -> None:
    name, rs_sets = released
    written = generation(production, name)
    shown = preview(previewer, name, "RollbackDeployment", plan(rs_sets))
    assert (shown.before["images"], shown.after["images"]) == ([f"app={NEW_IMAGE}"], [f"app={OLD_IMAGE}"])
    assert shown.before["env"] == ["app: FLAG=on"] and shown.after["env"] == []
    assert shown.before["templateDigest"] != shown.after["templateDigest"]
    assert f"images: app={NEW_IMAGE} → app={OLD_IMAGE}" in shown.lines()
    assert generation(production, name) == written  # a dry run: nothing stored
    with target(production, executor_token) as k8s:
        result = k8s.apply(
            "rollback", f"{ENVIRONMENT}/{name}", plan(rs_sets), f"k-{uuid.uuid4()}", 3, "executor-0",
            expected_change=shown.digest,
        )  # fmt: skip
    assert not result.replayed
    assert [f"{c['name']}={c['image']}" for c in live(production, name)["spec"]["template"]["spec"]["containers"]] == [
        f"app={OLD_IMAGE}"
    ]


def test_a_memory_raise_is_previewed_and_applied_as_shown(
    production: Cluster, previewer: KubernetesPreviewer, executor_token: str, limited: str
) -> None:
    shown = preview(previewer, limited, "RaiseMemoryLimit", MEMORY)
    assert (shown.before["memoryLimits"], shown.after["memoryLimits"]) == (["app=256Mi"], ["app=384Mi"])
    assert shown.before["images"] == shown.after["images"]
    raise_memory(production, executor_token, limited, shown)
    limits = live(production, limited)["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"memory": "384Mi"}


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        ({"env": [{"name": "DEBUG", "value": "1"}]}, "app: DEBUG=1"),
        ({"image": "registry.example.com/app:9"}, "app=registry.example.com/app:9"),
    ],
    ids=["env-added", "image-changed"],
)
def test_a_deployment_changed_after_the_preview_is_refused_and_nothing_is_applied(
    production: Cluster,
    previewer: KubernetesPreviewer,
    executor_token: str,
    limited: str,
    edit: dict[str, Any],
    says: str,
) -> None:
    shown = preview(previewer, limited, "RaiseMemoryLimit", MEMORY)
    with production.client() as api:  # a person's edit after the approval, before the executor acts
        container = {"name": "app", **edit}
        patch = {"spec": {"template": {"spec": {"containers": [container]}}}}
        assert api.patch(apps(f"/{limited}"), json=patch, headers=STRATEGIC).status_code == 200
    before = live(production, limited)
    with pytest.raises(TargetRejected) as refused:
        raise_memory(production, executor_token, limited, shown)
    message = str(refused.value)
    assert message.startswith("the change differs from what was approved: ") and says in message, message
    after = live(production, limited)
    assert after["metadata"]["generation"] == before["metadata"]["generation"]
    assert after["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] == {"memory": "256Mi"}
    assert "flotilla.dev/fencing-token" not in (after["metadata"].get("annotations") or {})  # not even a claim


def test_a_restarts_preview_is_the_same_a_moment_later_and_the_executor_applies_it(
    production: Cluster, previewer: KubernetesPreviewer, executor_token: str, limited: str
) -> None:
    first = preview(previewer, limited, "RestartService", {"rolling": True})
    time.sleep(1.1)  # the restart time is to the second
    again = preview(previewer, limited, "RestartService", {"rolling": True})
    assert first == again and first.after["restartedAt"] == "at the write"
    time.sleep(1.1)
    with target(production, executor_token) as k8s:
        k8s.apply(
            "restart",
            f"{ENVIRONMENT}/{limited}",
            {"rolling": True},
            f"k-{uuid.uuid4()}",
            3,
            "e",
            expected_change=first.digest,
        )
    annotations = live(production, limited)["spec"]["template"]["metadata"]["annotations"]
    assert "kubectl.kubernetes.io/restartedAt" in annotations


def test_what_the_executor_would_refuse_is_shown_as_such(
    previewer: KubernetesPreviewer, released: tuple[str, list[dict[str, Any]]]
) -> None:
    name, rs_sets = released
    step = StepFacts(
        "c-x", "RollbackDeployment", Target("service", ENVIRONMENT, name), plan(rs_sets, toRevision="9"), 0
    )
    shown = previewer.preview(step)
    assert isinstance(shown, NoPreview) and "the executor would refuse this step: revision 9" in shown.reason
