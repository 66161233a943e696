"""Every overlay, applied to a real API server (server-side dry run), and a broken one refused.

The unit lane validates the rendered manifests against JSON schemas offline
(tests/unit/test_k8s_manifests.py); here the API server itself decides: its own
validation, defaulting and admission, the CRDs' structural schemas with strict field
validation, RBAC objects, and every name and reference it checks.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from .conftest import K8S, Cluster

OVERLAYS = ("overlays/dev", "overlays/production")

pytestmark = pytest.mark.timeout(300)


def namespaces_of(objects: list[dict[str, Any]]) -> set[str]:
    named = {o["metadata"]["namespace"] for o in objects if o["metadata"].get("namespace")}
    return named | {o["metadata"]["name"] for o in objects if o["kind"] == "Namespace"}


def dry_run(cluster: Cluster, objects: list[dict[str, Any]]) -> Any:
    return cluster.kubectl(
        "apply",
        "--server-side",
        "--dry-run=server",
        "--field-manager=flotilla-test",
        "--validate=strict",
        "--filename=-",
        input=yaml.safe_dump_all(objects),
        check=False,
    )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_overlay_is_accepted_by_the_api_server(cluster: Cluster, crds_installed: object, overlay: str) -> None:
    objects = cluster.render(overlay)
    # A dry run persists nothing, a Namespace included; the namespaces the overlay's
    # objects live in must exist for them to be checked at all.
    for namespace in namespaces_of(objects):
        cluster.ensure_namespace(namespace)
    done = cluster.kubectl(
        "apply", "--server-side", "--dry-run=server", "--field-manager=flotilla-test", "--validate=strict",
        "-k", str(K8S / overlay),
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    applied = [line for line in done.stdout.splitlines() if "serverside-applied (server dry run)" in line]
    assert len(applied) == len(objects), done.stdout


def deployment(objects: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == name)


@pytest.mark.parametrize(
    ("breakage", "refusal"),
    [
        # a field no Deployment has (a typo in a hand edit): strict validation names it
        (
            lambda d: d["spec"]["template"]["spec"]["containers"][0].update(resourcez={}),
            "resourcez: field not declared in schema",
        ),
        # a count written as a word
        (lambda d: d["spec"].update(replicas="three"), "replicas"),
        # a selector that does not select the pod template's labels
        (lambda d: d["spec"]["selector"].update(matchLabels={"app.kubernetes.io/name": "nobody"}), "selector"),
    ],
    ids=["unknown-field", "wrong-type", "selector-mismatch"],
)
def test_a_broken_manifest_is_refused(cluster: Cluster, crds_installed: object, breakage: Any, refusal: str) -> None:
    objects = cluster.render("overlays/production")
    for namespace in namespaces_of(objects):
        cluster.ensure_namespace(namespace)
    broken = copy.deepcopy(deployment(objects, "executor"))
    breakage(broken)
    done = dry_run(cluster, [broken])
    assert done.returncode != 0, f"the API server accepted a broken Deployment:\n{done.stdout}"
    assert refusal in done.stderr, done.stderr


def test_a_custom_resource_outside_its_crd_is_refused(cluster: Cluster, crds_installed: object) -> None:
    objects = cluster.render("overlays/production")
    for namespace in namespaces_of(objects):
        cluster.ensure_namespace(namespace)
    scaled = copy.deepcopy(next(o for o in objects if o["kind"] == "ScaledObject"))
    scaled["spec"]["minReplicaCount"] = "one"
    done = dry_run(cluster, [scaled])
    assert done.returncode != 0 and "minReplicaCount" in done.stderr, done.stderr
