"""Who may reach Kafka Connect's REST API, where the workers may go, what a connector may read.

Connect's REST API has no authentication, and a connector runs with the worker's Kafka
identity and may name ``${env:...}`` values of the worker. So (security review 3, M4):
the API admits the members that publish, the provision Job, the other workers and the
Strimzi operator *of one namespace*; the workers reach DNS, Kafka, PostgreSQL and each
other only; the env provider hands out the four variables the connectors use; connectors
cannot override their clients' settings. The rendered overlays are evaluated with
NetworkPolicy semantics (tests/support/netpol.py): no CNI runs here either.
"""

from __future__ import annotations

import re
import shutil
from typing import Any

import pytest

from flotilla.fleet import FLEET
from tests.support.netpol import Pod, admits, lets_out

from .test_k8s_manifests import OVERLAYS, _render, container_env, ident, k8s_connectors, member_of, of_kind, workloads

CONNECT_PORT = 8083
OPERATOR_LABELS = {"strimzi.io/kind": "cluster-operator"}
PROVISION_JOB = "flotilla-provision"
# Environment variables Strimzi sets on a Connect worker (its own settings and the Kafka
# password file) and the usual process ones: none may be read into a connector.
WORKER_ENVIRONMENT = (
    "KAFKA_CONNECT_CONFIGURATION",
    "KAFKA_CONNECT_BOOTSTRAP_SERVERS",
    "KAFKA_CONNECT_SASL_USERNAME",
    "KAFKA_CONNECT_SASL_PASSWORD_FILE",
    "KAFKA_CONNECT_TRUSTED_CERTIFICATES",
    "STRIMZI_KAFKA_GC_LOG_ENABLED",
    "HOME",
    "PATH",
    "FLOTILLA_PG_PASSWORDX",
    "XFLOTILLA_PG_PASSWORD",
    "FLOTILLA_PG",
)


@pytest.fixture(scope="module", params=OVERLAYS)
def objects(request: pytest.FixtureRequest) -> tuple[dict[str, Any], ...]:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed")
    return _render(f"overlays/{request.param}")


def _namespace(objects: tuple[dict[str, Any], ...]) -> str:
    return str(next(iter(of_kind(objects, "Deployment")))["metadata"]["namespace"])


def _ns_labels(namespace: str) -> dict[str, str]:
    # The API server sets kubernetes.io/metadata.name on every namespace to its name.
    return {"kubernetes.io/metadata.name": namespace}


def _connect_worker(objects: tuple[dict[str, Any], ...]) -> Pod:
    """A worker of the KafkaConnect, with the labels Strimzi gives it."""
    (kc,) = of_kind(objects, "KafkaConnect")
    name, namespace = kc["metadata"]["name"], kc["metadata"]["namespace"]
    labels = {"strimzi.io/cluster": name, "strimzi.io/kind": "KafkaConnect", "strimzi.io/name": f"{name}-connect"}
    return Pod(namespace, labels, _ns_labels(namespace), {"rest-api": CONNECT_PORT}, f"{name}-connect-0")


def _pods_of_workloads(objects: tuple[dict[str, Any], ...]) -> list[tuple[str, Pod]]:
    found = []
    for w in workloads(objects):
        namespace = w["metadata"]["namespace"]
        labels = w["spec"]["template"]["metadata"]["labels"]
        found.append((member_of(w), Pod(namespace, labels, _ns_labels(namespace), name=ident(w))))
    return found


def _operator_namespace(objects: tuple[dict[str, Any], ...]) -> str:
    policy = next(p for p in of_kind(objects, "NetworkPolicy") if p["metadata"]["name"] == "connect-api")
    (peer,) = [
        peer
        for rule in policy["spec"]["ingress"]
        for peer in rule["from"]
        if peer.get("podSelector", {}).get("matchLabels") == OPERATOR_LABELS
    ]
    return str(peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"])


def test_the_connect_api_names_the_operators_namespace(objects: tuple[dict[str, Any], ...]) -> None:
    """No peer of the API's policy is "any namespace": each namespaceSelector names one."""
    policy = next(p for p in of_kind(objects, "NetworkPolicy") if p["metadata"]["name"] == "connect-api")
    for rule in policy["spec"]["ingress"]:
        for peer in rule["from"]:
            if "namespaceSelector" in peer:
                assert set(peer["namespaceSelector"]) == {"matchLabels"}, peer
                assert set(peer["namespaceSelector"]["matchLabels"]) == {"kubernetes.io/metadata.name"}, peer
    assert _operator_namespace(objects) != _namespace(objects)


def test_only_the_publishers_and_the_provision_job_reach_the_connect_api(objects: tuple[dict[str, Any], ...]) -> None:
    policies = of_kind(objects, "NetworkPolicy")
    worker = _connect_worker(objects)
    publishers = {
        m.name for m in FLEET if m.database is not None and m.database in k8s_connectors.publishing_databases()
    }
    allowed = publishers | {PROVISION_JOB}
    seen = set()
    for member, pod in _pods_of_workloads(objects):
        seen.add(member)
        assert admits(policies, pod, worker, CONNECT_PORT) == (member in allowed), f"{pod} -> Connect's API"
    assert allowed <= seen, allowed - seen
    assert {"console"} <= seen - allowed  # something is refused in every overlay
    # a pod of the fleet's namespace that is none of them, labelled like the fleet
    stray = Pod(worker.namespace, {"app.kubernetes.io/part-of": "flotilla", "app.kubernetes.io/component": "backend"},
                worker.namespace_labels, name="stray")  # fmt: skip
    assert not admits(policies, stray, worker, CONNECT_PORT)
    # the workers forward to each other
    assert admits(policies, worker, worker, CONNECT_PORT)


def test_the_operator_label_admits_only_the_operators_namespace(objects: tuple[dict[str, Any], ...]) -> None:
    policies = of_kind(objects, "NetworkPolicy")
    worker = _connect_worker(objects)
    home = _operator_namespace(objects)
    operator = Pod(home, OPERATOR_LABELS, _ns_labels(home), name="strimzi-cluster-operator")
    assert admits(policies, operator, worker, CONNECT_PORT)
    for namespace in ("mallory", "default", "monitoring", worker.namespace):
        impostor = Pod(namespace, OPERATOR_LABELS, _ns_labels(namespace), name="impostor")
        assert not admits(policies, impostor, worker, CONNECT_PORT), f"{namespace}: the operator label let it in"


def _where(host: str, own: str) -> str:
    return host.split(".")[1] if "." in host else own


def test_the_connect_workers_reach_only_dns_kafka_postgres_and_each_other(
    objects: tuple[dict[str, Any], ...],
) -> None:
    policies = of_kind(objects, "NetworkPolicy")
    worker = _connect_worker(objects)
    (kc,) = of_kind(objects, "KafkaConnect")
    env = {e["name"]: e.get("value") for e in kc["spec"]["template"]["connectContainer"]["env"]}
    kafka_host, _, kafka_port = kc["spec"]["bootstrapServers"].rpartition(":")
    kafka_ns = _where(kafka_host, worker.namespace)
    broker_labels = {"strimzi.io/cluster": "flotilla", "strimzi.io/kind": "Kafka", "strimzi.io/name": "flotilla-kafka"}
    broker = Pod(kafka_ns, broker_labels, _ns_labels(kafka_ns), name="flotilla-kafka-0")
    assert lets_out(policies, worker, broker, int(kafka_port))
    pg_ns = _where(env["FLOTILLA_PG_HOST"], worker.namespace)
    postgres = Pod(pg_ns, {"app.kubernetes.io/name": "flotilla-postgres"}, _ns_labels(pg_ns), name="postgres")
    assert lets_out(policies, worker, postgres, int(env["FLOTILLA_PG_PORT"]))
    dns = Pod("kube-system", {"k8s-app": "kube-dns"}, _ns_labels("kube-system"), name="coredns")
    assert lets_out(policies, worker, dns, 53, "UDP") and lets_out(policies, worker, dns, 53)
    assert lets_out(policies, worker, worker, CONNECT_PORT)
    # and nowhere else: a database of someone's choosing, the fleet's APIs, the registry
    elsewhere = Pod("mallory", {"app.kubernetes.io/name": "flotilla-postgres"}, _ns_labels("mallory"), name="fake-pg")
    assert not lets_out(policies, worker, elsewhere, 5432)
    for member, pod in _pods_of_workloads(objects):
        assert not lets_out(policies, worker, pod, 18104), member
    registry = Pod(worker.namespace, {"app.kubernetes.io/name": "flotilla-registry"}, worker.namespace_labels)
    assert not lets_out(policies, worker, registry, 8080)
    assert not lets_out(policies, worker, broker, 443)


ENV_REFERENCE = re.compile(r"\$\{env:([^}:]+)\}")


def _connector_env_names(objects: tuple[dict[str, Any], ...]) -> set[str]:
    names: set[str] = set()
    for connector in of_kind(objects, "KafkaConnector"):
        for value in connector["spec"]["config"].values():
            names.update(ENV_REFERENCE.findall(str(value)))
    return names


def test_the_env_provider_hands_out_only_what_the_connectors_use(objects: tuple[dict[str, Any], ...]) -> None:
    (kc,) = of_kind(objects, "KafkaConnect")
    config = kc["spec"]["config"]
    assert config["config.providers"] == "env"
    pattern = re.compile(config["config.providers.env.param.allowlist.pattern"])
    used = _connector_env_names(objects)
    assert used == {"FLOTILLA_PG_HOST", "FLOTILLA_PG_PORT", "FLOTILLA_PG_USER", "FLOTILLA_PG_PASSWORD"}
    # Kafka's EnvVarConfigProvider keeps a variable when the pattern matches its whole name.
    assert all(pattern.fullmatch(name) for name in used), used
    worker_env = {e["name"] for e in kc["spec"]["template"]["connectContainer"]["env"]}
    assert worker_env == used  # the worker is given exactly those, and they all resolve
    for name in WORKER_ENVIRONMENT:
        assert not pattern.fullmatch(name), f"{name} would be readable by any connector"


def test_connectors_cannot_override_their_clients(objects: tuple[dict[str, Any], ...]) -> None:
    (kc,) = of_kind(objects, "KafkaConnect")
    assert kc["spec"]["config"]["connector.client.config.override.policy"] == "None"
    # With None, Connect refuses a connector carrying any of these: ours carry none.
    for connector in of_kind(objects, "KafkaConnector"):
        overrides = [k for k in connector["spec"]["config"] if re.match(r"(producer|consumer|admin)\.override\.", k)]
        assert overrides == [], f"{ident(connector)}: {overrides}"


@pytest.mark.parametrize("name", ["health-agent", "policy-service", "audit"])
def test_publishers_are_given_the_connect_url(objects: tuple[dict[str, Any], ...], name: str) -> None:
    """The members let into the API are those configured to call it."""
    (workload,) = [w for w in workloads(objects) if member_of(w) == name]
    env = container_env(objects, workload["spec"]["template"]["spec"]["containers"][0])
    assert str(env["FLOTILLA_CONNECT_URL"]).endswith(f":{CONNECT_PORT}")
