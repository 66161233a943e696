"""Who reaches Kafka Connect's REST API, as the API server stores the policies (M4).

The production overlay is applied for real (conftest's ``production``); its pods are
made by the ReplicaSet controller from the Deployments, as in a cluster; the Strimzi
operator, a Connect worker (Strimzi is not running here) and an impostor are Pods this
test creates with the labels the real ones carry. What the API server decides is real:
it accepts and stores the NetworkPolicies (defaults applied), sets every namespace's
``kubernetes.io/metadata.name`` itself, whatever the creator asked for. Whether a
connection is allowed is then *evaluated* from those stored objects with NetworkPolicy
semantics (tests/support/netpol.py): **no CNI runs in this lane, so nothing here is
enforced, and no packet is sent.** A cluster's CNI is what enforces it.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from flotilla.fleet import FLEET
from tests.support.netpol import Pod, admits, connects, lets_out

from .conftest import FLEET_NAMESPACE, Cluster

pytestmark = pytest.mark.timeout(300)

CONNECT = "flotilla-connect"
WORKER_LABELS = {
    "strimzi.io/cluster": CONNECT,
    "strimzi.io/kind": "KafkaConnect",
    "strimzi.io/name": f"{CONNECT}-connect",
}
OPERATOR_LABELS = {"strimzi.io/kind": "cluster-operator", "name": "strimzi-cluster-operator"}
BROKER_LABELS = {"strimzi.io/cluster": "flotilla", "strimzi.io/kind": "Kafka", "strimzi.io/name": "flotilla-kafka"}
OPERATOR_NAMESPACE = "kafka"  # the production overlay's connect-api
# every member with an outbox, and the Job that provisions them
ALLOWED = {m.name for m in FLEET if m.database is not None} | {"flotilla-provision"}


def make_pod(cluster: Cluster, namespace: str, name: str, labels: dict[str, str], port: int | None = None) -> None:
    container: dict[str, Any] = {"name": "c", "image": "registry.example.com/stand-in:1"}
    if port is not None:
        container["ports"] = [{"name": "rest-api", "containerPort": port}]
    body = {"metadata": {"name": name, "labels": labels}, "spec": {"containers": [container]}}
    with cluster.client() as api:
        answer = api.post(f"/api/v1/namespaces/{namespace}/pods", json=body)
        assert answer.status_code in (201, 409), answer.text


def stored_pod(cluster: Cluster, namespace: str, name: str) -> Pod:
    with cluster.client() as api:
        pod = api.get(f"/api/v1/namespaces/{namespace}/pods/{name}").json()
        ns = api.get(f"/api/v1/namespaces/{namespace}").json()
    ports = {
        p["name"]: p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports", []) if "name" in p
    }
    return Pod(namespace, pod["metadata"].get("labels", {}), ns["metadata"]["labels"], ports, name)


def fleet_pods(cluster: Cluster) -> dict[str, Pod]:
    """One pod of each Deployment of the fleet, as the ReplicaSet controller made it, and the
    provision Job's pod as its stored template labels it (this control plane's controller
    manager may not run the Job to a pod)."""
    wanted = {m.name for m in FLEET if m.name != "sim"}
    deadline = time.monotonic() + 60
    with cluster.client() as api:
        ns_labels = api.get(f"/api/v1/namespaces/{FLEET_NAMESPACE}").json()["metadata"]["labels"]
        job = api.get(f"/apis/batch/v1/namespaces/{FLEET_NAMESPACE}/jobs/flotilla-provision").json()
        provision = Pod(FLEET_NAMESPACE, job["spec"]["template"]["metadata"]["labels"], ns_labels, name="provision")
        while True:
            listed = api.get(f"/api/v1/namespaces/{FLEET_NAMESPACE}/pods").json()["items"]
            found = {
                p["metadata"]["labels"].get("app.kubernetes.io/name"): Pod(
                    FLEET_NAMESPACE, p["metadata"]["labels"], ns_labels, name=p["metadata"]["name"]
                )
                for p in listed
                if p["metadata"].get("labels", {}).get("app.kubernetes.io/part-of") == "flotilla"
            }
            if wanted <= set(found):
                return {**found, "flotilla-provision": found.get("flotilla-provision", provision)}
            assert time.monotonic() < deadline, f"no pods for {sorted(wanted - set(found))} within 60 s"
            time.sleep(0.5)


@pytest.fixture(scope="module")
def network(production: Cluster) -> dict[str, Any]:
    for namespace in (OPERATOR_NAMESPACE, "postgres"):
        production.ensure_namespace(namespace)
    # Whoever may create a namespace asks for the operator's name label: the API server decides.
    with production.client() as api:
        forged = {"metadata": {"name": "mallory", "labels": {"kubernetes.io/metadata.name": OPERATOR_NAMESPACE}}}
        answer = api.post("/api/v1/namespaces", json=forged)
        assert answer.status_code in (201, 409), answer.text
    make_pod(production, FLEET_NAMESPACE, "flotilla-connect-connect-0", WORKER_LABELS, 8083)
    make_pod(production, OPERATOR_NAMESPACE, "strimzi-cluster-operator", OPERATOR_LABELS)
    make_pod(production, "mallory", "impostor", OPERATOR_LABELS)
    make_pod(production, FLEET_NAMESPACE, "impostor", OPERATOR_LABELS)
    make_pod(production, OPERATOR_NAMESPACE, "flotilla-kafka-0", BROKER_LABELS)
    make_pod(production, "postgres", "postgres-0", {"app.kubernetes.io/name": "postgres"})
    make_pod(production, "mallory", "fake-postgres", {"app.kubernetes.io/name": "flotilla-postgres"})
    with production.client() as api:
        stored = api.get(f"/apis/networking.k8s.io/v1/namespaces/{FLEET_NAMESPACE}/networkpolicies").json()["items"]
    return {
        "policies": stored,
        "worker": stored_pod(production, FLEET_NAMESPACE, "flotilla-connect-connect-0"),
        "operator": stored_pod(production, OPERATOR_NAMESPACE, "strimzi-cluster-operator"),
        "impostor": stored_pod(production, "mallory", "impostor"),
        "neighbour": stored_pod(production, FLEET_NAMESPACE, "impostor"),
        "broker": stored_pod(production, OPERATOR_NAMESPACE, "flotilla-kafka-0"),
        "postgres": stored_pod(production, "postgres", "postgres-0"),
        "fake_postgres": stored_pod(production, "mallory", "fake-postgres"),
        "fleet": fleet_pods(production),
    }


def test_the_api_server_stores_the_policies_as_rendered(production: Cluster, network: dict[str, Any]) -> None:
    rendered = {
        o["metadata"]["name"]: o for o in production.render("overlays/production") if o["kind"] == "NetworkPolicy"
    }
    stored = {p["metadata"]["name"]: p for p in network["policies"]}
    assert set(rendered) <= set(stored)
    for name in ("connect-api", "connect-egress"):
        assert stored[name]["spec"]["podSelector"] == rendered[name]["spec"]["podSelector"]
        direction = "ingress" if name == "connect-api" else "egress"
        peers = "from" if direction == "ingress" else "to"
        assert [r[peers] for r in stored[name]["spec"][direction]] == [
            r[peers] for r in rendered[name]["spec"][direction]
        ]


def test_a_namespace_cannot_claim_the_operators_name(network: dict[str, Any]) -> None:
    assert network["impostor"].namespace_labels["kubernetes.io/metadata.name"] == "mallory"
    assert network["operator"].namespace_labels["kubernetes.io/metadata.name"] == OPERATOR_NAMESPACE


def test_the_operator_label_in_another_namespace_does_not_reach_connects_api(network: dict[str, Any]) -> None:
    policies, worker = network["policies"], network["worker"]
    assert admits(policies, network["operator"], worker, 8083)
    assert not admits(policies, network["impostor"], worker, 8083)
    assert not admits(policies, network["neighbour"], worker, 8083)  # the label alone, beside the fleet


def test_the_publishing_members_reach_connects_api_and_the_console_does_not(network: dict[str, Any]) -> None:
    policies, worker = network["policies"], network["worker"]
    decided = {name: connects(policies, pod, worker, 8083) for name, pod in network["fleet"].items()}
    assert decided == {name: name in ALLOWED for name in network["fleet"]}, decided
    assert decided["console"] is False


def test_connect_reaches_kafka_and_postgres_and_no_database_of_someone_elses(network: dict[str, Any]) -> None:
    policies, worker = network["policies"], network["worker"]
    assert lets_out(policies, worker, network["broker"], 9093)
    assert lets_out(policies, worker, network["postgres"], 5432)
    assert not lets_out(policies, worker, network["fake_postgres"], 5432)
    assert not lets_out(policies, worker, network["impostor"], 8083)
    for name, pod in network["fleet"].items():
        assert not lets_out(policies, worker, pod, 18101), name
