"""Item 2 of issue 41: the fleet deployed into the one-node cluster by its own manifests
(``infra/k8s/overlays/cluster``: base/ unchanged, the stack as plain workloads), through
``infra/k8s/cluster/fleetdeploy.py``. On the real cluster:

- every member of libs/flotilla/fleet.py but the sim runs as a Ready pod of the image
  built here, beside Kafka, Connect, the registry and PostgreSQL, and the
  provisioning Job (base/provision-job.yaml) completed;
- the executor's own token, read from its pod, acts in `apps` and is refused (403)
  everywhere else; the cluster overlay's Roles are production's;
- each member's /readyz answers 200 through ``kubectl port-forward`` on 127.0.0.1;
- the NetworkPolicies as stored allow every connection the running fleet makes (evaluated:
  the bridge CNI does not enforce them);
- a record the health agent publishes to `incidents` (an alert delivered to its webhook
  with the alert senders' token) reaches the diagnostic agent, which consumes it.

The cluster is shared: this module starts it only when it is not running and never
stops it, and deploys the workload (infra/k8s/cluster/workload: the estate whose
Prometheus the agents read) only when it is not there; the fleet is left deployed
(``fleetdeploy.py down`` removes it). Run it alone
(``tests/cluster/test_base.py`` restarts the cluster) under /tmp/flotilla-cluster.lock.
"""

from __future__ import annotations

import json
import re
import ssl
import subprocess
import time
import urllib.error
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
import yaml

from flotilla.fleet import AGENTS, AUDIT, CONSOLE, DIAGNOSTIC, HEALTH, Member
from tests.cluster.conftest import REPO_ROOT, Cluster, clusterctl, forwarded_port
from tests.support import netpol
from tests.support.scripts import load_script

fleetdeploy = load_script("flotilla_fleetdeploy", REPO_ROOT / "infra" / "k8s" / "cluster" / "fleetdeploy.py")
workload = load_script("flotilla_workload", REPO_ROOT / "infra" / "k8s" / "cluster" / "workload" / "workload.py")

NS = "flotilla"
MEMBERS = (*AGENTS, CONSOLE)  # the sim is the dev overlay's
STACK = ("flotilla-kafka", "flotilla-connect-connect", "flotilla-registry", "flotilla-postgres")
JOBS = ("flotilla-provision", "flotilla-topics", "flotilla-registry-config")

pytestmark = pytest.mark.timeout(1800)


@pytest.fixture(scope="module")
def fleet() -> Iterator[Cluster]:
    """The running cluster (started if it is not; never stopped here) with the fleet up."""
    paths = clusterctl.PATHS
    if clusterctl.pid_of("kubelet", paths) is None:
        clusterctl.up(paths)
    # The estate the health agent watches: it is Ready only once it reads a latency from
    # the workload's Prometheus (its /readyz). Deployed here only when it is not there.
    try:
        cluster_api = clusterctl.api(f"/api/v1/namespaces/{workload.MONITORING_NAMESPACE}", paths)
    except urllib.error.HTTPError as exc:
        assert exc.code == 404, exc
        cluster_api = None
    if cluster_api is None:
        print(f"\n[fleet] the workload, for the agents' Prometheus: {json.dumps(workload.deploy(paths))}")
    took = fleetdeploy.up()
    print(f"\n[fleet] up (seconds): {json.dumps(took)}")
    cluster = Cluster(paths, {}, [], took)
    cluster.apply(CANARY)
    yield cluster


# The workload the overlay's estate catalogue declares in `apps` (estate.yaml), where the
# executor's Role lets it act: the probe image of the cluster's base checks.
CANARY: dict[str, Any] = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "canary", "namespace": "apps"},
    "spec": {
        "replicas": 1,
        "selector": {"matchLabels": {"app": "canary"}},
        "template": {
            "metadata": {"labels": {"app": "canary"}},
            "spec": {
                "containers": [
                    {
                        "name": "canary",
                        "image": clusterctl.PROBE_IMAGE,
                        "imagePullPolicy": "Never",
                        "args": ["serve", "-port", "8080"],
                        "resources": {"requests": {"cpu": "5m", "memory": "8Mi"}, "limits": {"memory": "32Mi"}},
                        "securityContext": {
                            "runAsNonRoot": True,
                            "runAsUser": 65534,
                            "allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]},
                            "seccompProfile": {"type": "RuntimeDefault"},
                        },
                    }
                ]
            },
        },
    },
}


def _pods(cluster: Cluster) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.api(f"/api/v1/namespaces/{NS}/pods")["items"]
    return items


def _ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions") or [])


def _pod_of(cluster: Cluster, name: str) -> dict[str, Any]:
    return cluster.ready_pod(NS, f"app.kubernetes.io/name={name}", timeout=120)


def test_every_fleet_pod_is_ready_and_the_provisioning_job_complete(fleet: Cluster) -> None:
    deployments = {d["metadata"]["name"]: d for d in fleet.api(f"/apis/apps/v1/namespaces/{NS}/deployments")["items"]}
    assert set(deployments) == {m.name for m in MEMBERS} | set(STACK)
    tags = json.loads((fleetdeploy.HOME / "images.json").read_text())
    for name, deployment in deployments.items():
        status = deployment["status"]
        assert status.get("readyReplicas") == status.get("replicas") == 1, (name, status)
        selector = ",".join(f"{k}={v}" for k, v in deployment["spec"]["selector"]["matchLabels"].items())
        pod = fleet.ready_pod(NS, selector, timeout=60)
        container = pod["spec"]["containers"][0]
        assert container["imagePullPolicy"] == "Never"
        # the image loaded into the node, pinned by its content id
        image = re.fullmatch(r"flotilla\.local/([a-z]+):([0-9a-f]{12})", container["image"])
        assert image is not None, container["image"]
        assert tags[image.group(1)]["image_id"].split(":")[1].startswith(image.group(2))
        assert pod["status"]["containerStatuses"][0]["imageID"].endswith(tags[image.group(1)]["image_id"].split(":")[1])
        # real probes on every container
        assert "readinessProbe" in container and "livenessProbe" in container, name
    for member in MEMBERS:
        container = deployments[member.name]["spec"]["template"]["spec"]["containers"][0]
        assert container["command"][-1] == member.module
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    jobs = {j["metadata"]["name"]: j for j in fleet.api(f"/apis/batch/v1/namespaces/{NS}/jobs")["items"]}
    for name in JOBS:
        conditions = {c["type"]: c["status"] for c in jobs[name]["status"].get("conditions") or []}
        assert conditions.get("Complete") == "True", (name, jobs[name]["status"])
    # the provisioning registered every contract and made every outbox connector
    log = fleet.kubectl("logs", "-n", NS, "job/flotilla-provision", timeout=60)
    for member in AGENTS:
        assert f"{member.database}: outbox table and connector" in log, log[-2000:]


def test_the_cluster_overlay_grants_exactly_production_s_roles_and_admission_policy(fleet: Cluster) -> None:
    def key(o: dict[str, Any]) -> str:
        # kustomize gives the cluster-scoped admission policy a namespace here, which the API
        # server drops: those are compared by name
        namespace = o["metadata"].get("namespace") if o["kind"] in RBAC_KINDS else ""
        return f"{o['kind']}/{namespace}/{o['metadata']['name']}"

    def rbac(overlay: str) -> dict[str, Any]:
        out = fleet.kubectl("kustomize", str(REPO_ROOT / "infra" / "k8s" / "overlays" / overlay))
        return {
            key(o): o.get("rules") or o.get("spec") or [o["roleRef"], o["subjects"]]
            for o in yaml.safe_load_all(out)
            if o and (o["kind"] in RBAC_KINDS or o["kind"].startswith("ValidatingAdmissionPolicy"))
        }

    assert rbac("cluster") == rbac("production")


def _token_of(cluster: Cluster, member: str) -> str:
    pod = _pod_of(cluster, member)
    return cluster.kubectl(
        "exec", "-n", NS, pod["metadata"]["name"], "--",
        "cat", "/var/run/secrets/kubernetes.io/serviceaccount/token",
    ).strip()  # fmt: skip


def test_the_executor_s_own_token_acts_in_apps_and_is_refused_elsewhere(fleet: Cluster) -> None:
    token = _token_of(fleet, "executor")
    context = ssl.create_default_context(cafile=str(fleet.paths.controlplane.ca))
    api = httpx.Client(
        base_url=f"https://127.0.0.1:{clusterctl.API_PORT}",
        verify=context,
        headers={"Authorization": f"Bearer {token}"},
        timeout=15,
    )
    with api:
        who = api.post(
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            json={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
        )
        assert who.status_code == 201, who.text
        assert who.json()["status"]["userInfo"]["username"] == "system:serviceaccount:flotilla:executor"
        for path in ("/apis/apps/v1/namespaces/apps/deployments/canary", "/apis/apps/v1/namespaces/apps/deployments"):
            assert api.get(path).status_code == 200, path
        scaled = api.patch(
            "/apis/apps/v1/namespaces/apps/deployments/canary/scale",
            json={"spec": {"replicas": 1}},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        assert scaled.status_code == 200, scaled.text
        refused = [
            ("GET", "/api/v1/namespaces/apps/secrets"),
            ("GET", "/api/v1/namespaces/apps/pods"),
            ("GET", f"/api/v1/namespaces/{NS}/secrets"),
            ("GET", f"/apis/apps/v1/namespaces/{NS}/deployments"),
            ("GET", "/apis/apps/v1/namespaces/kube-system/deployments"),
            ("GET", "/apis/apps/v1/deployments"),
            ("GET", "/api/v1/namespaces"),
            ("DELETE", "/apis/apps/v1/namespaces/apps/deployments/canary"),
            ("GET", "/apis/apps/v1/namespaces/apps/deployments/canary/scale"),
        ]
        for method, path in refused:
            answer = api.request(method, path)
            assert answer.status_code == 403, (method, path, answer.status_code)
        created = api.post(
            "/apis/apps/v1/namespaces/apps/deployments",
            json={"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "not-mine"}},
        )
        assert created.status_code == 403, created.text
    # the members that hold no token have none mounted
    for member in ("health-agent", "remediation-agent", "audit", "dlq-reconciler", "console"):
        pod = _pod_of(fleet, member)
        assert pod["spec"].get("automountServiceAccountToken") is False, member
        done = subprocess.run(
            [str(clusterctl.PATHS.binary("kubectl")), f"--kubeconfig={fleet.paths.kubeconfig}",
             "exec", "-n", NS, pod["metadata"]["name"], "--", "ls", "/var/run/secrets/kubernetes.io/serviceaccount"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode != 0, (member, done.stdout)


@contextmanager
def port_forward(cluster: Cluster, target: str, port: int) -> Iterator[int]:
    """``kubectl port-forward`` of ``target`` on 127.0.0.1 (a free port); the local port."""
    forward = subprocess.Popen(
        [
            str(clusterctl.PATHS.binary("kubectl")),
            f"--kubeconfig={cluster.paths.kubeconfig}",
            "port-forward",
            "-n",
            NS,
            "--address=127.0.0.1",
            target,
            f":{port}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert forward.stdout is not None
        line = forward.stdout.readline()  # printed once the listener is up
        local = forwarded_port(line)
        assert local is not None, line
        yield local
    finally:
        forward.terminate()
        forward.wait(timeout=10)


def test_each_member_answers_readyz_through_port_forward_on_loopback(fleet: Cluster) -> None:
    for member in MEMBERS:
        with port_forward(fleet, f"service/{member.name}", member.http_port) as local:
            answer = httpx.get(f"http://127.0.0.1:{local}/readyz", timeout=10)
            assert answer.status_code == 200, (member.name, answer.text)


def _consumed(cluster: Cluster, member: Member) -> float:
    """The sum of the member's counters of records it consumed from `incidents`."""
    with port_forward(cluster, f"service/{member.name}", member.http_port) as local:
        text = httpx.get(f"http://127.0.0.1:{local}/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("flotilla_records_consumed_total{") and 'topic="incidents"' in line
    )


def test_an_alert_published_to_incidents_is_consumed(fleet: Cluster) -> None:
    """The health agent's records go out through its outbox, Debezium and our transforms
    to Kafka; the audit consumes them (and verifies the health agent's signature) and the
    diagnostic agent consumes them and answers in the same incident. The canary has no
    metrics, so the diagnosis waits for evidence and escalates after its deadline."""
    consumed = _consumed(fleet, DIAGNOSTIC)
    token = (fleetdeploy.HOME / "secrets" / "alert-token").read_text().strip()
    fingerprint = f"{time.time_ns():016x}"[-16:]
    alert = {
        "version": "4",
        "status": "firing",
        "receiver": "flotilla",
        "groupKey": '{}:{alertname="ClusterSmoke"}',
        "alerts": [
            {
                "status": "firing",
                "labels": {"alertname": "ClusterSmoke", "service": "canary", "severity": "page"},
                "annotations": {"summary": "a smoke alert from tests/cluster/test_fleet.py"},
                "startsAt": datetime.now(UTC).isoformat(),
                "endsAt": "0001-01-01T00:00:00Z",
                "fingerprint": fingerprint,
            }
        ],
    }
    with port_forward(fleet, f"service/{HEALTH.name}", HEALTH.http_port) as local:
        answer = httpx.post(
            f"http://127.0.0.1:{local}/alerts", json=alert, headers={"Authorization": f"Bearer {token}"}, timeout=15
        )
    assert answer.status_code == 200, answer.text
    (received,) = answer.json()["alerts"]
    assert received["outcome"] in ("opened", "joined"), received
    incident = received["incidentId"]

    def timeline() -> list[dict[str, Any]] | None:
        with port_forward(fleet, f"service/{AUDIT.name}", AUDIT.http_port) as local:
            page = httpx.get(f"http://127.0.0.1:{local}/incidents/{incident}/timeline", timeout=10)
        if page.status_code != 200:
            return None
        entries: list[dict[str, Any]] = page.json()["timeline"]
        ours = [e for e in entries if (e["value"].get("alert") or {}).get("fingerprint") == fingerprint]
        diagnostic = [e for e in entries if e["source"] == f"/flotilla/{DIAGNOSTIC.name}"]
        return entries if ours and diagnostic else None

    entries = fleet.wait(f"incident {incident} audited with the alert and the diagnostic agent's answer", timeline, 120)
    assert all(e["verified"] for e in entries if e["source"] == f"/flotilla/{HEALTH.name}"), entries
    assert _consumed(fleet, DIAGNOSTIC) > consumed


def _running_pods(cluster: Cluster) -> list[netpol.Pod]:
    namespaces = {
        n["metadata"]["name"]: n["metadata"].get("labels", {}) for n in cluster.api("/api/v1/namespaces")["items"]
    }
    found = []
    for pod in cluster.api("/api/v1/pods")["items"]:
        if pod["status"].get("phase") != "Running":
            continue
        ports = {
            p["name"]: p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports", []) if "name" in p
        }
        namespace = pod["metadata"]["namespace"]
        found.append(
            netpol.Pod(
                namespace, pod["metadata"].get("labels", {}), namespaces[namespace], ports, pod["metadata"]["name"]
            )
        )
    return found


def test_the_policies_as_stored_allow_what_the_running_fleet_does(fleet: Cluster) -> None:
    """The bridge CNI does not enforce NetworkPolicies (docs/operations/cluster.md): the
    policies the API server stores are evaluated over the pods that run, with their real
    labels, for every connection the fleet makes here. Before base/ admitted the fleet to
    the stack's pods beside it, every member's connection to its database, Kafka and the
    registry was denied by the base's own default deny."""
    pods = _running_pods(fleet)
    policies = fleet.api("/apis/networking.k8s.io/v1/networkpolicies")["items"]

    def pod(namespace: str, label: str, value: str) -> netpol.Pod:
        matching = [p for p in pods if p.namespace == namespace and p.labels.get(label) == value]
        assert matching, f"no running pod {label}={value} in {namespace}"
        return matching[0]

    name = "app.kubernetes.io/name"
    postgres, registry = pod(NS, name, "flotilla-postgres"), pod(NS, name, "flotilla-registry")
    kafka, connect = (
        pod(NS, "strimzi.io/name", "flotilla-kafka"),
        pod(NS, "strimzi.io/name", "flotilla-connect-connect"),
    )
    dns = pod("kube-system", "k8s-app", "kube-dns")
    needed: list[tuple[netpol.Pod, netpol.Pod, int, str]] = []
    for member in AGENTS:
        client = pod(NS, name, member.name)
        needed += [(client, postgres, 5432, "TCP"), (client, kafka, 9092, "TCP"), (client, registry, 8080, "TCP")]
        needed += [(client, connect, 8083, "TCP"), (client, dns, 53, "UDP")]
    needed += [(connect, kafka, 9092, "TCP"), (connect, postgres, 5432, "TCP"), (connect, dns, 53, "UDP")]
    needed += [(registry, postgres, 5432, "TCP")]
    console = pod(NS, name, "console")
    needed += [(console, pod(NS, name, m.name), m.http_port, "TCP") for m in AGENTS if m.name in API_MEMBERS]
    denied = [
        f"{s} -> {d}:{port}/{proto}" for s, d, port, proto in needed if not netpol.connects(policies, s, d, port, proto)
    ]
    assert not denied, denied
    # and they still have teeth: the console reaches no database, nothing outside reaches Kafka
    assert not netpol.connects(policies, console, postgres, 5432)
    assert not netpol.connects(policies, pod("kube-system", "k8s-app", "kube-dns"), kafka, 9092)


RBAC_KINDS = ("Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")
API_MEMBERS = ("policy-service", "executor", "audit", "dlq-reconciler")  # what the console calls


def test_the_policy_service_s_own_token_may_only_dry_run_a_write(fleet: Cluster) -> None:
    """Production's admission policy, enforced by this API server: the policy service's
    token previews a scale of the canary (dryRun=All) and is refused the same write made."""
    token = _token_of(fleet, "policy-service")
    context = ssl.create_default_context(cafile=str(fleet.paths.controlplane.ca))
    path = "/apis/apps/v1/namespaces/apps/deployments/canary/scale"
    patch = {"spec": {"replicas": 3}}
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/merge-patch+json"}
    with httpx.Client(base_url=f"https://127.0.0.1:{clusterctl.API_PORT}", verify=context, timeout=15) as api:
        previewed = api.patch(path, params={"dryRun": "All"}, json=patch, headers=headers)
        assert previewed.status_code == 200, previewed.text
        assert previewed.json()["spec"]["replicas"] == 3
        made = api.patch(path, json=patch, headers=headers)
        assert made.status_code == 403, made.text
        assert "may only dry-run a write" in made.text
    assert fleet.api("/apis/apps/v1/namespaces/apps/deployments/canary")["spec"]["replicas"] == 1
