"""The cluster lane: a one-node Kubernetes cluster that runs pods
(``infra/k8s/cluster/clusterctl.py``), brought up once per session and torn down at the
end, with a view of the machine taken before it starts so the last test can check that
teardown left the machine as it was. What it proves and what it does not:
docs/operations/cluster.md.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.scripts import load_script

REPO_ROOT = Path(__file__).resolve().parents[2]
clusterctl = load_script("flotilla_clusterctl", REPO_ROOT / "infra" / "k8s" / "cluster" / "clusterctl.py")


def docker_containers() -> list[str]:
    """A Docker engine's containers, if one runs here: the cluster must not touch them."""
    if shutil.which("docker") is None or not Path("/var/run/docker.sock").exists():
        return []
    done = subprocess.run(["docker", "ps", "-a", "-q", "--no-trunc"], capture_output=True, text=True, timeout=30)
    return sorted(done.stdout.split())


@dataclass
class Cluster:
    """The running cluster as its admin sees it from the machine (127.0.0.1 only)."""

    paths: Any
    machine_before: dict[str, list[str]]
    docker_before: list[str]
    up_seconds: dict[str, float]
    namespaces: list[str] = field(default_factory=list)

    def kubectl(self, *args: str, input: str | None = None, timeout: float = 60) -> str:
        return str(clusterctl.kubectl(*args, paths=self.paths, input=input, timeout=timeout))

    def api(self, path: str) -> Any:
        return clusterctl.api(path, self.paths, timeout=10)

    def apply(self, *documents: dict[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(documents))

    def namespace(self, name: str) -> str:
        self.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        self.namespaces.append(name)
        return name

    def wait(self, what: str, check: Callable[[], Any], timeout: float = 90) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            try:
                result = check()
            except (AssertionError, KeyError, RuntimeError, OSError):
                result = None
            if result:
                return result
            assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f}s"
            time.sleep(1)

    def pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.api(f"/api/v1/namespaces/{namespace}/pods?labelSelector={selector}")["items"]
        return items

    def ready_pod(self, namespace: str, selector: str, timeout: float = 90) -> dict[str, Any]:
        def ready() -> dict[str, Any] | None:
            for pod in self.pods(namespace, selector):
                conditions = pod.get("status", {}).get("conditions") or []
                if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
                    return pod
            return None

        pod: dict[str, Any] = self.wait(f"a Ready pod {selector} in {namespace}", ready, timeout)
        return pod

    def finished_pod(self, namespace: str, name: str, timeout: float = 90) -> dict[str, Any]:
        def finished() -> dict[str, Any] | None:
            pod: dict[str, Any] = self.api(f"/api/v1/namespaces/{namespace}/pods/{name}")
            return pod if pod["status"].get("phase") in ("Succeeded", "Failed") else None

        pod: dict[str, Any] = self.wait(f"pod {namespace}/{name} finished", finished, timeout)
        return pod


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    paths = clusterctl.PATHS
    clusterctl.down(paths)  # whatever a crashed run left
    machine_before = clusterctl.machine_view(paths)
    docker_before = docker_containers()
    try:
        up_seconds = clusterctl.up(paths)
        yield Cluster(paths, machine_before, docker_before, up_seconds)
    finally:
        clusterctl.down(paths)


def forwarded_port(output: str) -> int | None:
    match = re.search(r"Forwarding from 127\.0\.0\.1:(\d+)", output)
    return int(match.group(1)) if match else None
