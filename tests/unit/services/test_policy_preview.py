"""The exact change a person approves, on the policy side: the previewer seam, the digest
that binds the changes shown, the approval's check of it, and the Kubernetes previewer's
plumbing (namespace, Deployment, refusal, ``dryRun=All``), without the stack."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from flotilla_evidence.kubernetes import KubernetesApi

from flotilla.actions import Change, NoPreview
from services.policy import preview
from services.policy.approval_rules import (
    ProposalStatus,
    ProposalView,
    Refusal,
    check_change,
    check_stored_changes,
)
from services.policy.decide import StepFacts, Target
from services.policy.preview_kubernetes import KubernetesPreviewer
from services.policy.settings import PolicySettings

SHOP = Target("service", "production", "shop")
IMAGES = Change({"images": ["shop=shop:1.5"]}, {"images": ["shop=shop:1.4"]})
PAUSE = Change({"paused": False}, {"paused": True})


def facts(kind: str = "PauseRollout", params: Mapping[str, Any] | None = None, command_id: str = "c-1") -> StepFacts:
    return StepFacts(command_id, kind, SHOP, dict(params or {"paused": True}), expires_at_ms=0)


class Fixed:
    """Answers what it is given per command id (a Change, a NoPreview, or an error to raise)."""

    def __init__(self, answers: Mapping[str, Any], delay: float = 0.0) -> None:
        self.answers, self.delay = dict(answers), delay

    def preview(self, step: StepFacts) -> Change | NoPreview:
        time.sleep(self.delay)
        answer = self.answers[step.command_id]
        if isinstance(answer, Exception):
            raise answer
        assert isinstance(answer, Change | NoPreview)
        return answer


# ------------------------------------------------------------------ the seam


def test_the_default_previewer_says_the_sim_cannot_dry_run() -> None:
    settings = PolicySettings()
    assert settings.policy_preview == "none"
    shown = preview.previewer_from_settings(settings).preview(facts())
    assert shown == NoPreview(preview.SIM_CANNOT)
    assert shown.to_json() == {
        "unavailable": "the sim cannot dry-run a change: what it does is the step's own description"
    }


def test_previews_keep_step_order_and_a_failing_previewer_becomes_its_error_text() -> None:
    steps = [facts(command_id="a"), facts(command_id="b"), facts(command_id="c")]
    found = preview.preview_steps(
        Fixed({"a": IMAGES, "b": RuntimeError("API server said 403"), "c": NoPreview("no namespace")}),
        steps,
        timeout=2.0,
    )
    assert found[0] == IMAGES
    assert isinstance(found[1], NoPreview) and "API server said 403" in found[1].reason
    assert found[2] == NoPreview("no namespace")


def test_a_slow_previewer_costs_the_budget_once_for_all_steps_not_once_per_step() -> None:
    release = threading.Event()

    class Stuck:
        def preview(self, step: StepFacts) -> Change | NoPreview:
            release.wait(5)
            return IMAGES

    started = time.monotonic()
    try:
        found = preview.preview_steps(Stuck(), [facts(command_id=str(i)) for i in range(3)], timeout=0.3)
    finally:
        release.set()
    took = time.monotonic() - started
    assert took < 0.3 * 2, f"waited {took:.2f}s for a 0.3s budget"
    assert all(isinstance(p, NoPreview) and "within 0.3s" in p.reason for p in found)


# ---------------------------------------------------------------- the digests


def test_the_change_digest_binds_every_steps_change_in_order() -> None:
    unavailable = NoPreview("the sim cannot dry-run")
    assert preview.changes_digest([unavailable, unavailable]) is None  # nothing shown, nothing bound
    bound = preview.changes_digest([IMAGES, unavailable])
    assert bound is not None and bound.startswith("sha256:")
    assert bound == preview.changes_digest([IMAGES, NoPreview("another reason")])  # only changes are bound
    assert bound != preview.changes_digest([unavailable, IMAGES])  # which step changes what
    assert bound != preview.changes_digest([IMAGES])
    assert bound != preview.changes_digest(
        [Change({"images": ["shop=shop:1.5"]}, {"images": ["shop=shop:1.3"]}), unavailable]
    )
    assert preview.expected_changes([IMAGES, unavailable]) == [IMAGES.digest, None]
    stored = preview.to_json([IMAGES, unavailable])
    assert preview.changes_digest(preview.from_json(json.loads(json.dumps(stored)))) == bound


# ------------------------------------------------------- the approval's check


def view(change_digest: str | None) -> ProposalView:
    return ProposalView(
        proposal_id="9b2d7c1a-5e6f-4a3b-8c9d-0e1f2a3b4c5d",
        incident_id="incident-204",
        proposed_by="remediation-agent-1",
        digest="sha256:" + "ab" * 32,
        status=ProposalStatus.PENDING,
        deadline=datetime(2024, 5, 1, tzinfo=UTC) + timedelta(minutes=15),
        targets=(SHOP,),
        required_role="approver",
        change_digest=change_digest,
    )


def test_an_approval_must_name_the_change_it_was_shown() -> None:
    shown = preview.changes_digest([IMAGES])
    check_change(view(shown), shown)
    for named in (None, preview.changes_digest([PAUSE]), "sha256:" + "0" * 64):
        with pytest.raises(Refusal, match="you were shown another change") as refused:
            check_change(view(shown), named)
        assert refused.value.status == 409


def test_an_approval_of_a_proposal_without_a_change_needs_none_and_may_not_claim_one() -> None:
    check_change(view(None), None)
    with pytest.raises(Refusal, match="you were shown another change"):
        check_change(view(None), preview.changes_digest([IMAGES]))


def test_changes_edited_in_the_database_after_they_were_shown_are_refused() -> None:
    shown = [IMAGES.to_json()]
    digest = preview.changes_digest([IMAGES])
    check_stored_changes(view(digest), shown)
    check_stored_changes(view(None), None)  # decided before previews existed
    check_stored_changes(view(None), [NoPreview("sim").to_json()])
    edited = [{**IMAGES.to_json(), "after": {"images": ["shop=evil:1"]}}]
    for stored in (edited, None, [{"nonsense": True}]):
        with pytest.raises(Refusal, match="edited after they were shown"):
            check_stored_changes(view(digest), stored)


# ------------------------------------------------------- the Kubernetes side


def api_server(
    deployments: dict[str, dict[str, Any]], replica_sets: list[dict[str, Any]] | None = None
) -> tuple[KubernetesApi, list[httpx.Request]]:
    """An HTTP answer per request as the API server gives it: GET a Deployment (404 when
    absent) or the ReplicaSets, a dry-run PATCH answered with the patched object (a merge
    patch of spec, or a JSON Patch replace) and nothing stored."""
    asked: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(request)
        if request.url.path.endswith("/replicasets"):
            return httpx.Response(200, json={"items": replica_sets or []})
        name = request.url.path.rsplit("/", 1)[1]
        found = deployments.get(name)
        if found is None:
            return httpx.Response(404, json={"kind": "Status", "code": 404})
        if request.method == "GET":
            return httpx.Response(200, json=found)
        patch = json.loads(request.content)
        if isinstance(patch, list):  # JSON Patch: replace /spec/template
            (op,) = patch
            assert op["path"] == "/spec/template"
            return httpx.Response(200, json={**found, "spec": {**found["spec"], "template": op["value"]}})
        return httpx.Response(200, json={**found, "spec": {**found["spec"], **patch["spec"]}})

    return KubernetesApi("https://k8s.test", "t", transport=httpx.MockTransport(answer)), asked


def template(image: str, **labels: str) -> dict[str, Any]:
    return {
        "metadata": {"labels": {"app": "shop", **labels}},
        "spec": {"containers": [{"name": "shop", "image": image, "env": [{"name": "MODE", "value": "fast"}]}]},
    }


def deployment(name: str, **annotations: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "uid": "u-1", "annotations": annotations, "resourceVersion": "7"},
        "spec": {
            "paused": False,
            "replicas": 3,
            "selector": {"matchLabels": {"app": "shop"}},
            "template": template("shop:1.5"),
        },
    }


def replica_set(revision: str, image: str, owner: str = "u-1") -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"shop-h{revision}",
            "labels": {"app": "shop", "pod-template-hash": f"h{revision}"},
            "annotations": {"deployment.kubernetes.io/revision": revision},
            "ownerReferences": [{"kind": "Deployment", "name": "shop", "uid": owner}],
        },
        "spec": {"template": template(image, **{"pod-template-hash": f"h{revision}"})},
    }


def test_the_kubernetes_previewer_dry_runs_the_planned_write_and_stores_nothing() -> None:
    stored = {"shop": deployment("shop")}
    api, asked = api_server(stored)
    previewer = KubernetesPreviewer(api, {"production": "apps"})
    shown = previewer.preview(facts())
    assert isinstance(shown, Change) and shown.lines() == ["paused: False → True"]
    write = asked[-1]
    assert (write.method, write.url.params.get("dryRun")) == ("PATCH", "All")
    assert write.headers["content-type"] == "application/merge-patch+json"
    assert stored["shop"]["spec"]["paused"] is False


def test_a_rollbacks_preview_shows_the_images_and_the_template_it_writes() -> None:
    api, asked = api_server({"shop": deployment("shop")}, [replica_set("1", "shop:1.4"), replica_set("2", "shop:1.5")])
    params = {"toRevision": "1", "fromRevision": "2", "toImages": ["shop=shop:1.4"]}
    shown = KubernetesPreviewer(api, {"production": "apps"}).preview(facts("RollbackDeployment", params))
    assert isinstance(shown, Change)
    assert (shown.before["images"], shown.after["images"]) == (["shop=shop:1.5"], ["shop=shop:1.4"])
    assert shown.before["templateDigest"] != shown.after["templateDigest"]
    assert shown.after["env"] == ["shop: MODE=fast"]
    sent = json.loads(asked[-1].content)
    assert "pod-template-hash" not in sent[0]["value"]["metadata"]["labels"]  # as kubectl rollout undo


def test_what_the_kubernetes_previewer_cannot_show_it_says_and_never_writes() -> None:
    api, asked = api_server({"shop": deployment("shop", **{"flotilla.dev/rollback-forbidden": "migration 42"})})
    previewer = KubernetesPreviewer(api, {"staging": "apps"})
    assert "no namespace is configured for production" in str(previewer.preview(facts()))
    previewer = KubernetesPreviewer(api, {"production": "apps"})
    rollback = {"toRevision": "1", "fromRevision": "2"}
    refused = previewer.preview(facts("RollbackDeployment", rollback))
    assert isinstance(refused, NoPreview) and "would refuse this step" in refused.reason
    assert "migration 42" in refused.reason
    failover = previewer.preview(facts("FailoverDependency", {"dependency": "db", "toTarget": "db-2"}))
    assert isinstance(failover, NoPreview) and "nothing to dry-run" in failover.reason
    gone = KubernetesPreviewer(api_server({})[0], {"production": "apps"})
    assert "does not exist" in str(gone.preview(facts()))
    assert all(r.method == "GET" for r in asked)


def test_the_kubernetes_previewer_needs_the_namespace_map(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t\n")
    base: dict[str, Any] = {
        "policy_preview": "kubernetes",
        "kubernetes_token_file": token,
        "kubernetes_ca_file": None,
        "kubernetes_api_url": "https://k8s.test",
    }
    with pytest.raises(ValueError, match="FLOTILLA_KUBERNETES_NAMESPACES"):
        preview.previewer_from_settings(PolicySettings(**base))
    built = preview.previewer_from_settings(PolicySettings(**base, kubernetes_namespaces={"production": "apps"}))
    assert isinstance(built, KubernetesPreviewer)
