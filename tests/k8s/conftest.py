"""The Kubernetes lane: a real API server (etcd, kube-apiserver, kube-controller-manager,
built from the Go module proxy by ``infra/k8s/controlplane.py``), started once per
session on 127.0.0.1 with an empty etcd and stopped at the end.

No kubelet and no scheduler run: Deployments get ReplicaSets and a rollout history, and
their pods are never scheduled. What this proves and what it does not:
docs/operations/kubernetes.md, "Tested against a real API server".
"""

from __future__ import annotations

import ssl
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support.scripts import load_script

REPO_ROOT = Path(__file__).resolve().parents[2]
K8S = REPO_ROOT / "infra" / "k8s"


controlplane = load_script("flotilla_k8s_controlplane", K8S / "controlplane.py")
crds = load_script("flotilla_k8s_crds", K8S / "crds.py")


@dataclass(frozen=True)
class Cluster:
    """The running control plane, as its admin sees it."""

    url: str
    ca: Path
    admin_token: str
    kubeconfig: Path
    kubectl_binary: Path

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [str(self.kubectl_binary), f"--kubeconfig={self.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({done.returncode}):\n{done.stderr}")
        return done

    def client(self, token: str | None = None) -> httpx.Client:
        """An HTTP client on the API server, as the admin or as the holder of ``token``."""
        return httpx.Client(
            base_url=self.url,
            verify=ssl.create_default_context(cafile=str(self.ca)),
            headers={"Authorization": f"Bearer {token or self.admin_token}"},
            timeout=30,
        )

    def ensure_namespace(self, name: str) -> None:
        with self.client() as api:
            answer = api.post("/api/v1/namespaces", json={"metadata": {"name": name}})
            assert answer.status_code in (201, 409), answer.text

    def token_for(self, service_account: str, namespace: str) -> str:
        """A bound token of the ServiceAccount (TokenRequest), as a pod of it would hold."""
        return self.kubectl("create", "token", service_account, "-n", namespace, "--duration=1h").stdout.strip()

    def render(self, target: str) -> list[dict[str, Any]]:
        out = self.kubectl("kustomize", str(K8S / target)).stdout
        return [doc for doc in yaml.safe_load_all(out) if doc]


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    paths = controlplane.PATHS
    controlplane.down(paths, wipe=True)  # an empty etcd: nothing left from an earlier run
    controlplane.up(paths)
    try:
        yield Cluster(
            url=controlplane.api_url(),
            ca=paths.ca,
            admin_token=paths.admin_token.read_text().strip(),
            kubeconfig=paths.kubeconfig,
            kubectl_binary=paths.binary("kubectl"),
        )
    finally:
        controlplane.down(paths, wipe=True)


@pytest.fixture(scope="session")
def crds_installed(cluster: Cluster) -> list[Path]:
    """Strimzi's and KEDA's CRDs (infra/k8s/crds.py: KEDA's from its Go module, Strimzi's
    generated from its Maven Central classes), installed and Established."""
    files = [crds.keda_dir() / name for name in crds.KEDA_CRDS] + [
        crds.strimzi_dir() / name for name in crds.STRIMZI_CLASSES
    ]
    cluster.kubectl("apply", "--server-side", "--field-manager=flotilla-test", *[f"--filename={f}" for f in files])
    deadline = time.monotonic() + 60
    with cluster.client() as api:
        while True:
            listed = api.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions").json()["items"]
            pending = [c["metadata"]["name"] for c in listed if not _established(c)]
            if listed and not pending:
                return files
            assert time.monotonic() < deadline, f"CRDs not Established within 60 s: {pending}"
            time.sleep(0.5)


def _established(crd: dict[str, Any]) -> bool:
    conditions = crd.get("status", {}).get("conditions") or []
    return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)


TARGET_NAMESPACE = "apps"  # FLOTILLA_KUBERNETES_NAMESPACES in the production overlay
FLEET_NAMESPACE = "flotilla"
MERGE = {"Content-Type": "application/merge-patch+json"}


def deployment(name: str, replicas: int = 1) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "app", "image": "registry.example.com/app:1"}]},
            },
        },
    }


@pytest.fixture(scope="session")
def production(cluster: Cluster, crds_installed: object) -> Iterator[Cluster]:
    """The production overlay applied (not a dry run), and a Deployment to act on in the
    target namespace and in one the executor does not serve."""
    objects = cluster.render("overlays/production")
    for namespace in {o["metadata"].get("namespace") for o in objects} - {None}:
        cluster.ensure_namespace(namespace)
    cluster.ensure_namespace("elsewhere")
    cluster.kubectl("apply", "--server-side", "--field-manager=flotilla-test", "-k", str(K8S / "overlays/production"))
    with cluster.client() as api:
        for namespace in (TARGET_NAMESPACE, "elsewhere", FLEET_NAMESPACE):
            url = f"/apis/apps/v1/namespaces/{namespace}/deployments"
            answer = api.post(url, json=deployment("checkout-api"))
            assert answer.status_code in (201, 409), answer.text
        secret = {"metadata": {"name": "database"}, "stringData": {"password": "s3cret"}}
        assert api.post(f"/api/v1/namespaces/{TARGET_NAMESPACE}/secrets", json=secret).status_code in (201, 409)
    yield cluster


def apps(path: str = "", namespace: str = TARGET_NAMESPACE) -> str:
    return f"/apis/apps/v1/namespaces/{namespace}/deployments{path}"
