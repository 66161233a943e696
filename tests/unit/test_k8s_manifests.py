"""The Kubernetes manifests (infra/k8s): rendered with kustomize, validated offline.

Every overlay is rendered with ``kubectl kustomize`` and every object is checked against
a schema: core kinds with ``kubernetes-validate`` (the Kubernetes JSON schemas of
:data:`K8S_VERSION`, strict: unknown fields are errors), custom resources against the
openAPIV3Schema of their real CRD (KEDA from its Go module, Strimzi generated from its
Maven Central artifacts; ``infra/k8s/crds.py``), made strict the same way. Then the
fleet's own rules: one hardened Deployment per member, every variable one its settings
read, secrets referenced and never written, the outbox connectors equal to the Python
definition, KEDA on the right consumer groups, PDBs and NetworkPolicies that select
what exists; in production, every Kafka client on TLS + SCRAM-SHA-512 as its own
KafkaUser, whose ACLs are exactly what the services' code consumes and produces.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import kubernetes_validate
import pytest
import yaml
from pydantic_settings import BaseSettings

from flotilla import tracing
from flotilla.connectors import DROP_NULL_HEADERS, OUTBOX_CONNECTOR_CLASS, connector_name, outbox_connector_config
from flotilla.fleet import AGENTS, BY_NAME, FLEET, SIM
from flotilla.provenance import PRODUCERS
from flotilla.settings import ServiceSettings, StackSettings
from services.executor.namespaces import EnvironmentNamespaces
from tests.keys import assert_each_signs_and_all_believe

from ..poms import TRANSFORMS_POM, pom_text

REPO_ROOT = Path(__file__).resolve().parents[2]
K8S = REPO_ROOT / "infra" / "k8s"


def _script(name: str, folder: Path = K8S) -> ModuleType:
    """A module of infra/ (not a package), loaded without touching sys.path."""
    spec = importlib.util.spec_from_file_location(f"flotilla_{folder.name}_{name}", folder / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


k8s_connectors = _script("connectors")
crds = _script("crds")
stackctl = _script("stackctl", REPO_ROOT / "infra" / "local")  # the local stack's topics

K8S_VERSION = "1.32.0"  # the kubectl on these machines; KEDA 2.16 and Strimzi 0.51 support it
OVERLAYS = ("dev", "production")
IMAGE = "flotilla/flotilla"
UID = 10001
# Custom resources every overlay has, and those only production has (Kafka security).
BASE_CUSTOM_KINDS = {"ScaledObject", "KafkaConnect", "KafkaConnector"}
SECURITY_KINDS = {"KafkaUser", "KafkaTopic", "TriggerAuthentication"}
CUSTOM_KINDS = BASE_CUSTOM_KINDS | SECURITY_KINDS
KAFKA_CLUSTER = "flotilla"  # the Strimzi Kafka of the production overlay
CLUSTER_CA = f"{KAFKA_CLUSTER}-cluster-ca-cert"  # Strimzi's public cluster CA Secret (key ca.crt)
# The members with a Kafka client: those with a database (the console and the sim have
# neither), each logging in as its own KafkaUser; Kafka Connect and KEDA have theirs too.
KAFKA_CLIENTS = tuple(m.name for m in FLEET if m.database is not None)
KAFKA_USERS = {member: f"flotilla-{member}" for member in KAFKA_CLIENTS}
CONNECT_USER = "flotilla-connect"
KEDA_USER = "flotilla-keda"
KAFKA_SECURITY_VARS = {
    "FLOTILLA_KAFKA_SECURITY_PROTOCOL",
    "FLOTILLA_KAFKA_SASL_MECHANISM",
    "FLOTILLA_KAFKA_SASL_USERNAME",
    "FLOTILLA_KAFKA_SASL_PASSWORD",
    "FLOTILLA_KAFKA_SSL_CA_LOCATION",
}
# The secrets the manifests may reference (docs/operations/kubernetes.md says how to make them).
SECRETS = {
    "flotilla-postgres",
    "flotilla-llm",
    "flotilla-approvers",
    "flotilla-operators",
    "flotilla-alert-senders",  # who may deliver Alertmanager's webhook to the health agent
    "flotilla-audit-signing-key",
    "flotilla-authorization-signing-key",  # policy only: it alone may authorize a command
    "flotilla-proposal-signing-key",  # remediation only: it alone may propose
    # the four members whose facts are signed with a key of their own (flotilla.provenance)
    "flotilla-health-agent-signing-key",
    "flotilla-diagnostic-agent-signing-key",
    "flotilla-executor-signing-key",
    "flotilla-dlq-reconciler-signing-key",
    "flotilla-trusted-keys",  # the public keys each verifier trusts
    "flotilla-console-tls",
    "flotilla-sim-action-token",  # dev: the sim's action API admits only the executor
    "flotilla-schema-registry-registrar",  # the provision Job registers the contracts with it
    # Made by Strimzi (production): one per KafkaUser, and the cluster CA (copied in).
    *KAFKA_USERS.values(),
    CONNECT_USER,
    KEDA_USER,
    CLUSTER_CA,
}
# Consumer groups KEDA scales, and the topics each consumes (the services' ServiceSpecs;
# the executor's is checked against services.executor.service.spec() below).
SCALED_TOPICS = {
    "health-agent": {"incidents"},
    "diagnostic-agent": {"incidents"},
    "remediation-agent": {"incidents"},
    "executor": {"commands", "incidents"},
}
PARTITIONS = 6  # incidents and commands (docker-compose.yml kafka-init, infra/local/stackctl.py)
EXECUTOR_MAX_REPLICAS = 2  # see the comment on the executor's ScaledObject
# Pods of the stack that run beside the fleet, in its namespace where the base's addresses
# say so, but that these manifests do not make: the labels backend-egress selects them by
# (docs/operations/kubernetes.md, Prerequisites), and their ports.
STACK_PODS: tuple[tuple[str, dict[str, str], set[str | int]], ...] = (
    (
        "Kafka/flotilla",
        {"strimzi.io/cluster": "flotilla", "strimzi.io/kind": "Kafka", "strimzi.io/name": "flotilla-kafka"},
        {9092, 9093},
    ),
    ("PostgreSQL/flotilla-postgres", {"app.kubernetes.io/name": "flotilla-postgres"}, {5432}),
    ("registry/flotilla-registry", {"app.kubernetes.io/name": "flotilla-registry"}, {8080}),
)


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _unavailable(reason: str) -> None:
    """In CI a missing tool is a failure (nothing may go unvalidated); locally a skip."""
    if _in_ci():
        pytest.fail(reason)
    pytest.skip(reason)


@cache
def _render(target: str) -> tuple[dict[str, Any], ...]:
    result = subprocess.run(
        ["kubectl", "kustomize", str(K8S / target)], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, f"kubectl kustomize {target} failed:\n{result.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


@pytest.fixture(scope="module", params=OVERLAYS)
def overlay(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def objects(overlay: str) -> tuple[dict[str, Any], ...]:
    if shutil.which("kubectl") is None:
        _unavailable("kubectl is not installed (Debian: kubectl or google-cloud-cli-kubectl)")
    return _render(f"overlays/{overlay}")


@pytest.fixture(scope="module")
def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    try:
        found: dict[tuple[str, str], dict[str, Any]] = crds.schemas()
        return found
    except crds.FetchError as exc:
        _unavailable(f"the CRDs could not be fetched: {exc}")
        raise


def of_kind(objects: tuple[dict[str, Any], ...], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def named(objects: tuple[dict[str, Any], ...], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in of_kind(objects, kind) if o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def ident(obj: dict[str, Any]) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


def workloads(objects: tuple[dict[str, Any], ...]) -> list[dict[str, Any]]:
    return of_kind(objects, "Deployment") + of_kind(objects, "Job")


def member_of(workload: dict[str, Any]) -> str:
    return str(workload["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"])


def configmap_data(objects: tuple[dict[str, Any], ...], name: str) -> dict[str, str]:
    return dict(named(objects, "ConfigMap", name).get("data", {}))


def container_env(objects: tuple[dict[str, Any], ...], container: dict[str, Any]) -> dict[str, Any]:
    """Every variable a container gets: name -> value, or the env entry when it is a reference."""
    env: dict[str, Any] = {}
    for source in container.get("envFrom", []):
        assert "secretRef" not in source, "envFrom secretRef hides which keys a pod gets; use secretKeyRef"
        env.update(configmap_data(objects, source["configMapRef"]["name"]))
    for entry in container.get("env", []):
        env[entry["name"]] = entry.get("value", entry)
    return env


# ----------------------------------------------------------------------------- labels


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Kubernetes label-selector semantics (matchLabels and matchExpressions)."""
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def pods(objects: tuple[dict[str, Any], ...]) -> list[tuple[str, dict[str, str], set[str | int]]]:
    """(owner, pod labels, ports by name and number) of every pod the objects make,
    including the Kafka Connect workers Strimzi makes for a KafkaConnect."""
    found: list[tuple[str, dict[str, str], set[str | int]]] = []
    for w in workloads(objects):
        template = w["spec"]["template"]
        ports: set[str | int] = set()
        for c in template["spec"]["containers"]:
            for p in c.get("ports", []):
                ports.update({p["containerPort"], p.get("name", p["containerPort"])})
        found.append((ident(w), template["metadata"]["labels"], ports))
    for kc in of_kind(objects, "KafkaConnect"):
        name = kc["metadata"]["name"]
        labels = {"strimzi.io/cluster": name, "strimzi.io/kind": "KafkaConnect", "strimzi.io/name": f"{name}-connect"}
        found.append((ident(kc), labels, {8083, "rest-api"}))
    return found


# ----------------------------------------------------------------------------- schemas


def test_the_generated_connectors_file_is_current() -> None:
    assert k8s_connectors.main(["--check"]) == 0, "run python infra/k8s/connectors.py"


def test_core_objects_are_valid_kubernetes(objects: tuple[dict[str, Any], ...]) -> None:
    problems = []
    for obj in objects:
        if obj["kind"] in CUSTOM_KINDS:
            continue
        try:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            problems.append(f"{ident(obj)}: {exc.message} at {'.'.join(str(p) for p in exc.path)}")
    assert not problems, "\n".join(problems)


_JUNCTORS = frozenset({"allOf", "anyOf", "oneOf", "not"})


def _strict(schema: Any) -> Any:
    """A CRD schema that refuses unknown fields, as the API server's strict field
    validation does (instead of silently pruning them)."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    # allOf/anyOf/oneOf/not branches only constrain (a structural schema declares its
    # fields outside them), so they stay as they are.
    out = {k: v if k in _JUNCTORS else _strict(v) for k, v in schema.items()}
    if (
        "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def test_custom_resources_match_their_crds(
    overlay: str, objects: tuple[dict[str, Any], ...], crd_schemas: dict[tuple[str, str], dict[str, Any]]
) -> None:
    custom = [o for o in objects if o["kind"] in CUSTOM_KINDS]
    expected = CUSTOM_KINDS if overlay == "production" else BASE_CUSTOM_KINDS
    assert {o["kind"] for o in custom} == expected
    problems = []
    for obj in custom:
        schema = crd_schemas.get((obj["apiVersion"], obj["kind"]))
        assert schema is not None, f"{ident(obj)}: no CRD serves {obj['apiVersion']}"
        validator = jsonschema.Draft4Validator(_strict(schema))
        body = {k: v for k, v in obj.items() if k != "metadata"}
        problems += [f"{ident(obj)}: {e.message} at {e.json_path}" for e in validator.iter_errors(body)]
        # metadata is the API server's (ObjectMeta): check it as such.
        meta = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj["metadata"]}
        kubernetes_validate.validate(meta, K8S_VERSION, strict=True)
    assert not problems, "\n".join(problems)


def test_no_object_kind_goes_unvalidated(objects: tuple[dict[str, Any], ...]) -> None:
    for obj in objects:
        if obj["kind"] not in CUSTOM_KINDS:
            # raises SchemaNotFoundError for a kind the Kubernetes schemas do not have
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


# ----------------------------------------------------------------------------- the fleet


def test_every_fleet_member_has_a_deployment_and_a_service(overlay: str, objects: tuple[dict[str, Any], ...]) -> None:
    expected = {m.name for m in FLEET} - ({SIM.name} if overlay == "production" else set())
    assert {d["metadata"]["name"] for d in of_kind(objects, "Deployment")} == expected
    for name in expected:
        service = named(objects, "Service", name)
        assert service["spec"]["ports"][0]["port"] == BY_NAME[name].http_port
        assert service["spec"]["selector"] == {"app.kubernetes.io/name": name}


def test_the_sim_is_dev_only(overlay: str, objects: tuple[dict[str, Any], ...]) -> None:
    names = {o["metadata"]["name"] for o in objects if o["kind"] in ("Deployment", "Service")}
    assert (SIM.name in names) == (overlay == "dev")
    executor = configmap_data(objects, _configmap_of(objects, "executor"))
    assert executor["FLOTILLA_EXECUTOR_TARGET"] == ("sim" if overlay == "dev" else "kubernetes")


def _configmap_of(objects: tuple[dict[str, Any], ...], member: str) -> str:
    """The generated (hashed) name of a member's own ConfigMap."""
    container = named(objects, "Deployment", member)["spec"]["template"]["spec"]["containers"][0]
    refs = [s["configMapRef"]["name"] for s in container.get("envFrom", [])]
    own = [r for r in refs if r.rsplit("-", 1)[0] == member]
    assert len(own) == 1, f"{member}: envFrom {refs}"
    return str(own[0])


def test_deployments_run_the_member_hardened(objects: tuple[dict[str, Any], ...]) -> None:
    for deployment in of_kind(objects, "Deployment"):
        member = BY_NAME[deployment["metadata"]["name"]]
        spec = deployment["spec"]["template"]["spec"]
        assert spec["serviceAccountName"] == member.name
        (container,) = spec["containers"]
        assert container["image"].rsplit(":", 1)[0].endswith(IMAGE)
        assert container["command"] == ["python", "-m", member.module]
        assert container["ports"] == [{"name": "http", "containerPort": member.http_port}]
        ready = "/healthz" if member is SIM else "/readyz"  # the sim has no database or Kafka to check
        assert container["readinessProbe"]["httpGet"] == {"path": ready, "port": "http"}
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
        _assert_hardened(ident(deployment), spec)


def test_the_prepare_job_is_hardened(objects: tuple[dict[str, Any], ...]) -> None:
    for job in of_kind(objects, "Job"):
        _assert_hardened(ident(job), job["spec"]["template"]["spec"])


def _assert_hardened(what: str, spec: dict[str, Any]) -> None:
    pod = spec["securityContext"]
    assert pod["runAsNonRoot"] is True and pod["runAsUser"] == UID, what
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}, what
    tmp_volumes = {v["name"] for v in spec["volumes"] if "emptyDir" in v}
    for c in spec["containers"]:
        sc = c["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] == UID, what
        assert sc["readOnlyRootFilesystem"] is True, what
        assert sc["allowPrivilegeEscalation"] is False, what
        assert sc["capabilities"] == {"drop": ["ALL"]}, what
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, what
        for bound in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(c["resources"][bound]), f"{what}: resources.{bound}"
        tmp = [m for m in c["volumeMounts"] if m["mountPath"] == "/tmp"]
        assert len(tmp) == 1 and tmp[0]["name"] in tmp_volumes, f"{what}: /tmp must be an emptyDir"


def _settings_fields(module_name: str) -> set[str]:
    """FLOTILLA_<FIELD> for every field of the settings classes a module defines."""
    module = importlib.import_module(module_name)
    classes = [
        cls
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if issubclass(cls, BaseSettings) and cls.__module__ == module.__name__
    ]
    assert classes, f"{module_name} defines no settings class"
    return {f"FLOTILLA_{field.upper()}" for cls in classes for field in cls.model_fields}


def test_every_variable_is_one_the_service_reads(objects: tuple[dict[str, Any], ...]) -> None:
    for workload in workloads(objects):
        member = member_of(workload)
        if member == "flotilla-provision":  # python -m flotilla.provision reads StackSettings
            readable = {f"FLOTILLA_{f.upper()}" for f in StackSettings.model_fields}
        else:
            readable = _settings_fields(f"{BY_NAME[member].module}.settings")
        if member == "flotilla-provision" or BY_NAME[member].database is not None:
            readable |= set(TRACING_ENV)  # read by flotilla.tracing, not a settings class
        for container in workload["spec"]["template"]["spec"]["containers"]:
            env = container_env(objects, container)
            unread = sorted(set(env) - readable)
            assert not unread, f"{ident(workload)} sets variables its settings do not read: {unread}"
            if member not in ("flotilla-provision", SIM.name):
                assert env["FLOTILLA_HTTP_HOST"] == "0.0.0.0", ident(workload)
                assert env["FLOTILLA_HTTP_PORT"] == str(BY_NAME[member].http_port), ident(workload)
            if member == SIM.name:
                assert env["FLOTILLA_SIM_HOST"] == "0.0.0.0"
                assert env["FLOTILLA_SIM_PORT"] == str(SIM.http_port)


TRACING_ENV = ("OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT")


def test_services_with_a_loop_export_traces_to_a_collector_they_may_reach(objects: tuple[dict[str, Any], ...]) -> None:
    egress = named(objects, "NetworkPolicy", "backend-egress")["spec"]["egress"]
    allowed = {p["port"] for rule in egress for p in rule.get("ports", [])}
    for workload in of_kind(objects, "Deployment"):
        member = BY_NAME[member_of(workload)]
        env = container_env(objects, workload["spec"]["template"]["spec"]["containers"][0])
        if member.database is None:
            assert not set(TRACING_ENV) & set(env), member.name
            continue
        exporters = tracing.exporters_from_env({k: env[k] for k in TRACING_ENV})
        assert [type(e).__name__ for e in exporters] == ["OTLPSpanExporter"], member.name
        port = int(env["OTEL_EXPORTER_OTLP_ENDPOINT"].rsplit(":", 1)[1])
        assert port in allowed, f"{member.name} exports to port {port}, which backend-egress does not allow"
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert labels.get("app.kubernetes.io/component") == "backend", member.name


def test_services_with_a_database_know_where_the_stack_is(objects: tuple[dict[str, Any], ...]) -> None:
    needed = {"FLOTILLA_KAFKA_BOOTSTRAP", "FLOTILLA_SCHEMA_REGISTRY_URL", "FLOTILLA_CONNECT_URL"}
    needed |= {"FLOTILLA_PG_HOST", "FLOTILLA_PG_PORT", "FLOTILLA_PG_USER", "FLOTILLA_PG_PASSWORD"}
    for workload in workloads(objects):
        member = member_of(workload)
        if member == "flotilla-provision" or BY_NAME[member].database is not None:
            env = container_env(objects, workload["spec"]["template"]["spec"]["containers"][0])
            assert needed <= set(env), f"{ident(workload)} misses {sorted(needed - set(env))}"


# ----------------------------------------------------------------------------- secrets


def _secret_refs(objects: tuple[dict[str, Any], ...]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(owner, secret name, reference) for every secretKeyRef and secret volume."""
    for w in workloads(objects):
        spec = w["spec"]["template"]["spec"]
        for c in spec["containers"]:
            for entry in c.get("env", []):
                ref = entry.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    yield ident(w), ref["name"], ref
        for v in spec.get("volumes", []):
            if "secret" in v:
                yield ident(w), v["secret"]["secretName"], v["secret"]
    for kc in of_kind(objects, "KafkaConnect"):
        for entry in kc["spec"]["template"]["connectContainer"]["env"]:
            ref = entry.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                yield ident(kc), ref["name"], ref
        password = kc["spec"].get("authentication", {}).get("passwordSecret")
        if password:
            yield ident(kc), password["secretName"], password
        for cert in kc["spec"].get("tls", {}).get("trustedCertificates", []):
            yield ident(kc), cert["secretName"], cert
    for auth in of_kind(objects, "TriggerAuthentication"):
        for ref in auth["spec"].get("secretTargetRef", []):
            yield ident(auth), ref["name"], ref


def test_secrets_are_referenced_never_written(overlay: str, objects: tuple[dict[str, Any], ...]) -> None:
    assert of_kind(objects, "Secret") == [], "no Secret object: they are created in the cluster"
    assert of_kind(_render("base"), "Secret") == []
    for owner, name, _ in _secret_refs(objects):
        assert name in SECRETS, f"{owner} references an undocumented Secret {name}"
    for ingress in of_kind(objects, "Ingress"):
        assert {t["secretName"] for t in ingress["spec"].get("tls", [])} <= SECRETS


def test_only_the_sim_and_the_executor_hold_the_sim_action_token(
    overlay: str, objects: tuple[dict[str, Any], ...]
) -> None:
    holders: dict[str, Any] = {}
    for workload in workloads(objects):
        for container in workload["spec"]["template"]["spec"]["containers"]:
            value = container_env(objects, container).get("FLOTILLA_SIM_ACTION_TOKEN")
            if value is not None:
                holders[member_of(workload)] = value
    if overlay == "production":
        assert holders == {}  # no sim: nothing to hold a token for
        return
    assert set(holders) == {SIM.name, "executor"}
    for member, value in holders.items():
        # from the one Secret, required (no pod starts with an empty token), never a literal
        assert isinstance(value, dict) and "value" not in value, f"{member}: a literal token"
        assert value["valueFrom"] == {"secretKeyRef": {"name": "flotilla-sim-action-token", "key": "token"}}, member


def test_only_the_provision_job_holds_the_registry_registrar(objects: tuple[dict[str, Any], ...]) -> None:
    """The registry refuses anonymous writes: the Job that registers the contracts presents
    the registrar's credentials, from their Secret (required); the services read anonymously."""
    holders: dict[str, Any] = {}
    for workload in workloads(objects):
        for container in workload["spec"]["template"]["spec"]["containers"]:
            env = container_env(objects, container)
            for key in ("FLOTILLA_SCHEMA_REGISTRY_AUTH", "FLOTILLA_SCHEMA_REGISTRY_AUTH_FILE"):
                if key in env:
                    holders[f"{member_of(workload)} {key}"] = env[key]
    assert holders == {
        "flotilla-provision FLOTILLA_SCHEMA_REGISTRY_AUTH": {
            "name": "FLOTILLA_SCHEMA_REGISTRY_AUTH",
            "valueFrom": {"secretKeyRef": {"name": "flotilla-schema-registry-registrar", "key": "auth"}},
        }
    }
    refs = {(owner, name) for owner, name, _ in _secret_refs(objects) if name == "flotilla-schema-registry-registrar"}
    assert refs == {("Job/flotilla-provision", "flotilla-schema-registry-registrar")}


def test_the_documented_registry_settings_are_the_local_stacks() -> None:
    """docs/operations/kubernetes.md shows the registry's part (it is not in these manifests):
    the same switches as the local stack and compose, its users file from the Secret it mounts."""
    from flotilla.registry import SERVER_ENV

    doc = (REPO_ROOT / "docs" / "operations" / "kubernetes.md").read_text()
    section = doc.split("### The schema registry's registrar", 1)[1].split("\n## ", 1)[0]
    excerpt = yaml.safe_load(section.split("```yaml\n", 1)[1].split("```", 1)[0])
    [container] = excerpt["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert {k: env[k] for k in SERVER_ENV} == SERVER_ENV
    [mount] = container["volumeMounts"]
    [volume] = excerpt["volumes"]
    assert env["QUARKUS_CONFIG_LOCATIONS"] == f"{mount['mountPath']}/users.properties"
    assert (mount["name"], mount["readOnly"]) == (volume["name"], True)
    assert volume["secret"]["secretName"] == "flotilla-registry-users"
    assert "--from-file=users.properties" in section and "flotilla.registrar users" in section


# Who holds which private key (flotilla.keys): every publishing member signs its facts with
# FLOTILLA_SIGNING_KEY_FILE (flotilla.provenance); the policy service, the remediation agent
# and the audit with the key they sign authorizations, proposals and the chain with. Each:
# (its Secret, the file of flotilla-trusted-keys holding its public key(s), the settings
# that name the key file).
SIGNING_KEYS = {
    "health-agent": ("flotilla-health-agent-signing-key", "health-agent.pub", ("FLOTILLA_SIGNING_KEY_FILE",)),
    "diagnostic-agent": (
        "flotilla-diagnostic-agent-signing-key",
        "diagnostic-agent.pub",
        ("FLOTILLA_SIGNING_KEY_FILE",),
    ),
    "remediation-agent": (
        "flotilla-proposal-signing-key",
        "proposal.pub",
        ("FLOTILLA_PROPOSAL_SIGNING_KEY_FILE", "FLOTILLA_SIGNING_KEY_FILE"),
    ),
    "policy-service": (
        "flotilla-authorization-signing-key",
        "authorization.pub",
        ("FLOTILLA_AUTHORIZATION_SIGNING_KEY_FILE", "FLOTILLA_SIGNING_KEY_FILE"),
    ),
    "executor": ("flotilla-executor-signing-key", "executor.pub", ("FLOTILLA_SIGNING_KEY_FILE",)),
    "audit": (
        "flotilla-audit-signing-key",
        "audit.pub",
        ("FLOTILLA_AUDIT_SIGNING_KEY_FILE", "FLOTILLA_SIGNING_KEY_FILE"),
    ),
    "dlq-reconciler": ("flotilla-dlq-reconciler-signing-key", "dlq-reconciler.pub", ("FLOTILLA_SIGNING_KEY_FILE",)),
}
TRUSTED_KEYS = {
    "executor": ("FLOTILLA_AUTHORIZATION_PUBLIC_KEYS", "authorization.pub"),
    "dlq-reconciler": ("FLOTILLA_AUTHORIZATION_PUBLIC_KEYS", "authorization.pub"),
    "policy-service": ("FLOTILLA_PROPOSAL_PUBLIC_KEYS", "proposal.pub"),
    "audit": ("FLOTILLA_AUDIT_PUBLIC_KEYS", "audit.pub"),
}


def _mounted_file(spec: dict[str, Any], container: dict[str, Any], path: str) -> tuple[str, str]:
    """(Secret, key) that a file path inside a container comes from; fails if no read-only
    Secret volume holds it."""
    volumes = {v["name"]: v for v in spec["volumes"]}
    for mount in container.get("volumeMounts", []):
        directory = mount["mountPath"].rstrip("/") + "/"
        if not path.startswith(directory):
            continue
        assert mount.get("readOnly") is True, f"{mount['name']} holds key material and is writable"
        assert "subPath" not in mount, "subPath mounts do not follow a rotated Secret"
        secret = volumes[mount["name"]]["secret"]
        name = path[len(directory) :]
        items = {i["path"]: i["key"] for i in secret.get("items", [])} or {name: name}
        assert name in items, f"{path}: not an item of {secret['secretName']}"
        return secret["secretName"], items[name]
    raise AssertionError(f"{path} is in no mounted volume")


def test_each_key_is_held_by_its_one_service(overlay: str, objects: tuple[dict[str, Any], ...]) -> None:
    """A signing key is mounted into the one member that signs with it and no other; each
    verifier reads its trusted public keys from the flotilla-trusted-keys Secret (a file per
    role, so rotation is an edit of one Secret and a restart)."""
    key_secrets = {secret for secret, _, _ in SIGNING_KEYS.values()}
    assert len(key_secrets) == len(SIGNING_KEYS), "two members share a signing key"
    for workload in workloads(objects):
        member = member_of(workload)
        spec = workload["spec"]["template"]["spec"]
        container = spec["containers"][0]
        env = container_env(objects, container)
        mounted = {v["secret"]["secretName"] for v in spec.get("volumes", []) if "secret" in v}
        signing = SIGNING_KEYS.get(member)
        assert mounted & key_secrets == ({signing[0]} if signing else set()), f"{member} mounts {mounted}"
        if signing:
            secret, _, settings = signing
            for setting in settings:
                assert _mounted_file(spec, container, env[setting]) == (secret, "signing-key.pem"), (member, setting)
        else:
            assert "FLOTILLA_SIGNING_KEY_FILE" not in env, member
        for volume in spec.get("volumes", []):
            if volume.get("secret", {}).get("secretName") == "flotilla-trusted-keys":
                items = [item["key"] for item in volume["secret"]["items"]]
                assert all(key.endswith(".pub") for key in items), f"{member}: {items}"  # public keys only
        trusted = TRUSTED_KEYS.get(member)
        public_settings = {k for k in env if k.endswith("_PUBLIC_KEYS")}
        assert public_settings == ({trusted[0]} if trusted else set()), f"{member}: {public_settings}"
        if trusted:
            setting, item = trusted
            entries = json.loads(env[setting])
            assert entries, f"{member}: {setting} is empty"
            for entry in entries:
                assert _mounted_file(spec, container, entry) == ("flotilla-trusted-keys", item), member


def _producer_keys(objects: tuple[dict[str, Any], ...], workload: dict[str, Any]) -> dict[str, list[str]]:
    env = container_env(objects, workload["spec"]["template"]["spec"]["containers"][0])
    entries = json.loads(env["FLOTILLA_PRODUCER_KEYS"])
    assert isinstance(entries, dict)
    return entries


def test_every_publishing_member_trusts_every_producer_by_its_key(
    overlay: str, objects: tuple[dict[str, Any], ...]
) -> None:
    """Every member that publishes signs (its key: above) and names every producer of
    flotilla.provenance in FLOTILLA_PRODUCER_KEYS, each by the file of flotilla-trusted-keys
    that holds the public key of the Secret that producer signs with."""
    publishers = {m.name for m in AGENTS}
    assert set(SIGNING_KEYS) == publishers == set().union(*PRODUCERS.values())
    for workload in workloads(objects):
        member = member_of(workload)
        spec = workload["spec"]["template"]["spec"]
        container = spec["containers"][0]
        env = container_env(objects, container)
        if member not in publishers:
            assert "FLOTILLA_PRODUCER_KEYS" not in env, member
            continue
        entries = _producer_keys(objects, workload)
        assert set(entries) == publishers, f"{member} trusts {sorted(entries)}"
        for producer, paths in entries.items():
            assert paths, f"{member}: no key for {producer}"
            for path in paths:
                found = _mounted_file(spec, container, path)
                assert found == ("flotilla-trusted-keys", SIGNING_KEYS[producer][1]), (member, producer, path)


def test_the_keys_as_documented_let_each_member_sign_and_every_member_believe_it(
    objects: tuple[dict[str, Any], ...], tmp_path: Path
) -> None:
    """The Secrets made as docs/operations/kubernetes.md says (a key per signing Secret,
    its public key in the matching file of flotilla-trusted-keys), each pod's files where
    its mounts put them, and each member's signer and trusted producers built from its
    settings as the runtime builds them: every fact a member signs, every member believes."""
    from flotilla import keys
    from flotilla.runner import fact_provenance, fact_signer

    trusted = tmp_path / "flotilla-trusted-keys"
    trusted.mkdir()
    for secret, public, _ in SIGNING_KEYS.values():
        (tmp_path / secret).mkdir()
        argv = ["generate", str(tmp_path / secret / "signing-key.pem"), "--public", str(trusted / public)]
        assert keys.main(argv) == 0
    signers, trust = {}, {}
    for workload in workloads(objects):
        member = member_of(workload)
        if member not in SIGNING_KEYS:
            continue
        spec = workload["spec"]["template"]["spec"]
        container = spec["containers"][0]
        env = container_env(objects, container)

        def local(path: str, spec: dict[str, Any] = spec, container: dict[str, Any] = container) -> str:
            secret, key = _mounted_file(spec, container, path)
            return str(tmp_path / secret / key)

        settings = ServiceSettings(
            _env_file=None,  # type: ignore[call-arg]
            signing_key_file=Path(local(env["FLOTILLA_SIGNING_KEY_FILE"])),
            producer_keys={p: [local(e) for e in es] for p, es in _producer_keys(objects, workload).items()},
        )
        signers[member], trust[member] = fact_signer(settings), fact_provenance(settings)
    assert set(signers) == set(SIGNING_KEYS)
    assert len({s.key_id for s in signers.values()}) == len(signers)
    assert_each_signs_and_all_believe(signers, trust)


def test_production_refuses_demo_users(overlay: str, objects: tuple[dict[str, Any], ...]) -> None:
    refs = {(owner, name): ref for owner, name, ref in _secret_refs(objects)}
    for owner, name in [
        ("Deployment/policy-service", "flotilla-approvers"),
        ("Deployment/dlq-reconciler", "flotilla-operators"),
        ("Deployment/health-agent", "flotilla-alert-senders"),
    ]:
        optional = refs[(owner, name)].get("optional", False)
        assert optional is (overlay == "dev"), f"{owner}: {name} optional={optional} in {overlay}"
    # and should a Secret be there but empty, the services themselves refuse outside the demo profile
    expected = "demo" if overlay == "dev" else "production"
    for w in workloads(objects):
        env = container_env(objects, w["spec"]["template"]["spec"]["containers"][0])
        if member_of(w) == "flotilla-provision" or BY_NAME[member_of(w)].database is not None:
            assert env["FLOTILLA_PROFILE"] == expected, ident(w)
    if overlay == "production":
        policy = configmap_data(objects, _configmap_of(objects, "policy-service"))
        # replicas from the API server (the Deployment the executor scales), never a sim,
        # nor kube-state-metrics' series (whoever writes to Prometheus could raise them)
        assert policy["FLOTILLA_POLICY_INVENTORY"] == "kubernetes"
        for w in workloads(objects):
            env = container_env(objects, w["spec"]["template"]["spec"]["containers"][0])
            assert "FLOTILLA_POLICY_DRY_RUN" not in env


def test_console_replicas_beyond_one_get_sticky_sessions(overlay: str, objects: tuple[dict[str, Any], ...]) -> None:
    """The console keeps sessions in its process: with two replicas and no affinity, a person
    would be signed out on every other request (and a login would land on the wrong one)."""
    (console,) = [d for d in of_kind(objects, "Deployment") if d["metadata"]["name"] == "console"]
    container = console["spec"]["template"]["spec"]["containers"][0]
    assert "FLOTILLA_CONSOLE_SESSION_SECRET" not in container_env(objects, container)  # nothing reads it
    ingresses = [
        i
        for i in of_kind(objects, "Ingress")
        for rule in i["spec"]["rules"]
        for path in rule["http"]["paths"]
        if path["backend"]["service"]["name"] == "console"
    ]
    if console["spec"].get("replicas", 1) == 1:
        return
    assert ingresses, "more than one console replica, but no Ingress to keep a browser on one"
    for ingress in ingresses:
        assert ingress["spec"]["ingressClassName"] == "nginx"
        notes = ingress["metadata"].get("annotations", {})
        assert notes.get("nginx.ingress.kubernetes.io/affinity") == "cookie", ident(ingress)
        assert notes.get("nginx.ingress.kubernetes.io/session-cookie-secure") == "true", ident(ingress)
        assert notes.get("nginx.ingress.kubernetes.io/session-cookie-samesite") == "Strict", ident(ingress)


# ----------------------------------------------------------------------------- Kafka Connect


def test_kafka_connectors_are_the_python_outbox_definition(objects: tuple[dict[str, Any], ...]) -> None:
    connect_clusters = {
        kc["metadata"]["name"]
        for kc in of_kind(objects, "KafkaConnect")
        if kc["metadata"]["annotations"].get("strimzi.io/use-connector-resources") == "true"
    }
    by_database = {}
    for connector in of_kind(objects, "KafkaConnector"):
        assert connector["metadata"]["labels"]["strimzi.io/cluster"] in connect_clusters
        spec = connector["spec"]
        config = {"connector.class": spec["class"], "tasks.max": str(spec["tasksMax"]), **spec["config"]}
        database = config["database.dbname"]
        # Equal, placeholders included: the worker resolves ${env:FLOTILLA_PG_*} (below).
        (member,) = [m for m in FLEET if m.database == database]
        # ... with the allowlist of the service's topics, as the service registers it itself
        assert config == outbox_connector_config(database, topics=member.emits), ident(connector)
        by_database[database] = connector
    publishing = {m.database for m in FLEET if m.database is not None and m.emits}  # the audit too: its anchors
    assert set(by_database) == publishing


def test_the_connect_worker_resolves_the_connector_placeholders(objects: tuple[dict[str, Any], ...]) -> None:
    (kc,) = of_kind(objects, "KafkaConnect")
    config = kc["spec"]["config"]
    assert config["config.providers"] == "env"
    assert config["config.providers.env.class"].endswith("EnvVarConfigProvider")
    env = {e["name"]: e for e in kc["spec"]["template"]["connectContainer"]["env"]}
    stack = configmap_data(objects, _stack_configmap(objects))
    for name in ("FLOTILLA_PG_HOST", "FLOTILLA_PG_PORT"):
        assert env[name]["value"] == stack[name], f"{name} differs between Connect and the services"
    for name in ("FLOTILLA_PG_USER", "FLOTILLA_PG_PASSWORD"):
        assert env[name]["valueFrom"]["secretKeyRef"]["name"] == "flotilla-postgres"
    assert kc["spec"]["bootstrapServers"] == stack["FLOTILLA_KAFKA_BOOTSTRAP"]
    artifact = kc["spec"]["build"]["plugins"][0]["artifacts"][0]
    assert "debezium-connector-postgres" in artifact["url"] and artifact["sha512sum"]


def _transforms_artifact(kafka_connect: dict[str, Any]) -> dict[str, Any]:
    # In Debezium's plugin (one class loader for its artifacts): our connector extends Debezium's.
    (plugin,) = kafka_connect["spec"]["build"]["plugins"]
    debezium, ours = plugin["artifacts"]
    assert "debezium-connector-postgres" in debezium["url"]
    return dict(ours)


def test_the_connect_image_has_our_transforms_from_where_the_overlay_says(
    overlay: str, objects: tuple[dict[str, Any], ...]
) -> None:
    # The KafkaConnectors run dev.flotilla.connect.OutboxPostgresConnector and chain
    # DropNullHeaders: Strimzi must build them in.
    assert {c["spec"]["class"] for c in of_kind(objects, "KafkaConnector")} == {OUTBOX_CONNECTOR_CLASS}
    assert any(
        v == DROP_NULL_HEADERS
        for c in of_kind(objects, "KafkaConnector")
        for k, v in c["spec"]["config"].items()
        if k.startswith("transforms.")
    )
    (kc,) = of_kind(objects, "KafkaConnect")
    artifact = _transforms_artifact(kc)
    group, name, version = (pom_text(TRANSFORMS_POM, f"m:{tag}") for tag in ("groupId", "artifactId", "version"))
    if overlay == "production":
        # From a Maven repository; not Maven Central (Strimzi's default, where it is not).
        assert (artifact["type"], artifact["group"], artifact["artifact"], artifact["version"]) == (
            "maven",
            group,
            name,
            version,
        )
        repository = artifact.get("repository", "")
        assert repository.startswith("https://"), f"{overlay}: Strimzi's Maven build needs an HTTPS repository"
        assert not any(central in repository for central in ("repo1.maven.org", "repo.maven.apache.org"))
    else:
        # dev: the jar from a folder `mvn deploy` wrote, in the Maven layout, over HTTP.
        assert artifact["type"] == "jar"
        layout = f"/{group.replace('.', '/')}/{name}/{version}/{name}-{version}.jar"
        assert artifact["url"].startswith("http://") and artifact["url"].endswith(layout), artifact["url"]


def test_the_base_assumes_no_repository_for_our_transforms() -> None:
    if shutil.which("kubectl") is None:
        _unavailable("kubectl is not installed (Debian: kubectl or google-cloud-cli-kubectl)")
    (kc,) = of_kind(_render("base"), "KafkaConnect")
    assert "repository" not in _transforms_artifact(kc), "an overlay that forgets it must fail, not use a default"


def _stack_configmap(objects: tuple[dict[str, Any], ...]) -> str:
    (name,) = [
        c["metadata"]["name"]
        for c in of_kind(objects, "ConfigMap")
        if c["metadata"]["name"].startswith("flotilla-stack-")
    ]
    return str(name)


def test_the_services_name_their_connectors_like_strimzi(objects: tuple[dict[str, Any], ...]) -> None:
    for connector in of_kind(objects, "KafkaConnector"):
        assert connector["metadata"]["name"] == connector_name(connector["spec"]["config"]["database.dbname"])


# ----------------------------------------------------------------------------- KEDA


def test_scaled_objects_follow_the_consumer_groups(objects: tuple[dict[str, Any], ...]) -> None:
    from services.executor.service import spec as executor_spec

    assert set(executor_spec().topics) == SCALED_TOPICS["executor"]
    stack = configmap_data(objects, _stack_configmap(objects))
    scaled = {s["spec"]["scaleTargetRef"]["name"]: s for s in of_kind(objects, "ScaledObject")}
    assert set(scaled) == set(SCALED_TOPICS)
    for target, so in scaled.items():
        deployment = named(objects, "Deployment", target)
        assert "replicas" not in deployment["spec"], f"{target}: KEDA owns the replica count"
        assert 1 <= so["spec"]["minReplicaCount"] <= so["spec"]["maxReplicaCount"] <= PARTITIONS
        topics = set()
        for trigger in so["spec"]["triggers"]:
            assert trigger["type"] == "kafka"
            meta = trigger["metadata"]
            assert meta["consumerGroup"] == target  # the runner's group id is the service name
            assert meta["bootstrapServers"] == stack["FLOTILLA_KAFKA_BOOTSTRAP"]
            assert int(meta["lagThreshold"]) > 0
            assert meta["allowIdleConsumers"] == "false"
            topics.add(meta["topic"])
        assert topics == SCALED_TOPICS[target], target
    assert scaled["executor"]["spec"]["maxReplicaCount"] <= EXECUTOR_MAX_REPLICAS


# ----------------------------------------------------------------------------- Kafka security

# What a Strimzi simple-authorization ACL grants: (resource type, name, operation).
Grant = tuple[str, str, str]


def _grants(user: dict[str, Any]) -> set[Grant]:
    found: set[Grant] = set()
    for acl in user["spec"]["authorization"]["acls"]:
        resource = acl["resource"]
        assert acl.get("type", "allow") == "allow", f"{ident(user)}: deny rules are not used"
        assert acl.get("host", "*") == "*", ident(user)
        # Literal names only: no `*`, no prefixes, no cluster rights (transactional ids:
        # Kafka Connect's exactly-once source, checked below).
        assert resource.get("patternType", "literal") == "literal", f"{ident(user)}: {resource}"
        assert resource["type"] in ("topic", "group", "transactionalId"), f"{ident(user)}: {resource}"
        assert "*" not in resource["name"], f"{ident(user)}: {resource}"
        found |= {(resource["type"], resource["name"], op) for op in acl["operations"]}
    return found


def _consumes(group: str, topics: set[str]) -> set[Grant]:
    return {("group", group, "Read")} | {("topic", t, op) for t in topics for op in ("Read", "Describe")}


def _produces(topics: set[str]) -> set[Grant]:
    return {("topic", t, op) for t in topics for op in ("Write", "Describe")}


def _member_kafka_access(member: str) -> tuple[set[str], set[str]]:
    """(topics consumed, topics produced) by a member's own Kafka clients, from its code:
    a decoding loop consumes its spec's topics and dead-letters to ``<topic>.dlq``; the
    audit and the DLQ reconciler read raw loops (the audit also reads its anchors back),
    and the reconciler re-queues to the origin topic. Everything else leaves through the outbox (Kafka Connect)."""
    from flotilla.deadletter import dlq_topic
    from services.audit.settings import AuditSettings
    from services.dlq_reconciler.settings import DlqSettings

    if member == "audit":
        settings = AuditSettings()  # its raw loop, and /verify reading its anchors back
        return {*settings.audit_topics, settings.audit_anchors_topic}, set()
    if member == "dlq-reconciler":
        dlqs = set(DlqSettings().dlq_topics)
        return dlqs, {t.removesuffix(".dlq") for t in dlqs}
    module = importlib.import_module(f"{BY_NAME[member].module}.service")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("FLOTILLA_PROFILE", "demo")  # the code's topics, not its credentials
        built = module.spec() if hasattr(module, "spec") else module.build_spec()
    spec = built[0] if isinstance(built, tuple) else built
    assert spec.name == member and spec.topics, member
    return set(spec.topics), {dlq_topic(t) for t in spec.topics}


def _fleet_topics() -> set[str]:
    return set(stackctl.TOPICS)


def _outbox_topics() -> set[str]:
    """Where the outbox connectors route records (aggregatetype): the work topics."""
    return {t for t in _fleet_topics() if not t.endswith(".dlq")}


def test_kafka_clients_connect_securely_in_production_only(overlay: str, objects: tuple[dict[str, Any], ...]) -> None:
    for workload in workloads(objects):
        member = member_of(workload)
        spec = workload["spec"]["template"]["spec"]
        (container,) = spec["containers"]
        env = container_env(objects, container)
        if overlay == "dev" or member not in KAFKA_CLIENTS:
            # dev connects in plaintext; the provision Job and the console never talk to Kafka.
            assert not KAFKA_SECURITY_VARS & set(env), f"{ident(workload)}: {sorted(KAFKA_SECURITY_VARS & set(env))}"
            assert not any(v.get("secret", {}).get("secretName") == CLUSTER_CA for v in spec["volumes"])
            continue
        assert env["FLOTILLA_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL", ident(workload)
        assert env["FLOTILLA_KAFKA_SASL_MECHANISM"] == "SCRAM-SHA-512", ident(workload)
        assert env["FLOTILLA_KAFKA_SASL_USERNAME"] == KAFKA_USERS[member], ident(workload)
        password = env["FLOTILLA_KAFKA_SASL_PASSWORD"]
        assert isinstance(password, dict) and "value" not in password, f"{ident(workload)}: a literal password"
        assert password["valueFrom"] == {"secretKeyRef": {"name": KAFKA_USERS[member], "key": "password"}}
        # The CA: a file inside a read-only mount of Strimzi's cluster CA Secret, key ca.crt.
        ca_file = Path(env["FLOTILLA_KAFKA_SSL_CA_LOCATION"])
        (mount,) = [m for m in container["volumeMounts"] if ca_file.is_relative_to(m["mountPath"])]
        assert mount["readOnly"] is True and "subPath" not in mount, ident(workload)
        (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
        secret = volume["secret"]
        assert secret["secretName"] == CLUSTER_CA, ident(workload)
        inside = str(ca_file.relative_to(mount["mountPath"]))
        assert {"key": "ca.crt", "path": inside} in secret.get("items", [{"key": "ca.crt", "path": "ca.crt"}])
        # And the settings accept it: the librdkafka configuration every client gets.
        fields = {n.removeprefix("FLOTILLA_").lower(): v for n, v in env.items() if isinstance(v, str)}
        fields["kafka_sasl_password"] = "from-the-secret"
        known = {k: v for k, v in fields.items() if k in StackSettings.model_fields}
        client = StackSettings.model_validate(known).kafka_client()
        assert client["security.protocol"] == "sasl_ssl" and client["sasl.mechanism"] == "SCRAM-SHA-512"
        assert client["ssl.ca.location"] == str(ca_file) and client["sasl.username"] == KAFKA_USERS[member]


@pytest.mark.usefixtures("signing_keys")
def test_kafka_users_grant_exactly_what_each_client_does(overlay: str, objects: tuple[dict[str, Any], ...]) -> None:
    users = {u["metadata"]["name"]: u for u in of_kind(objects, "KafkaUser")}
    if overlay == "dev":
        assert users == {}
        return
    for user in users.values():
        assert user["metadata"]["labels"]["strimzi.io/cluster"] == KAFKA_CLUSTER, ident(user)
        assert user["spec"]["authentication"] == {"type": "scram-sha-512"}, ident(user)
        assert user["spec"]["authorization"]["type"] == "simple", ident(user)
    expected: dict[str, set[Grant]] = {}
    for member in KAFKA_CLIENTS:
        consumed, produced = _member_kafka_access(member)
        assert consumed | produced <= _fleet_topics(), member
        expected[KAFKA_USERS[member]] = _consumes(member, consumed) | _produces(produced)
    # Kafka Connect: its worker group and internal topics, and the outbox destinations.
    (kc,) = of_kind(objects, "KafkaConnect")
    internal = {kc["spec"][f"{k}StorageTopic"] for k in ("config", "offset", "status")}
    connect = {("group", kc["spec"]["groupId"], "Read")} | _produces(_outbox_topics())
    # a row too large for Kafka is set aside as a notice on its topic's DLQ, where one exists
    connect |= _produces({f"{t}.dlq" for t in _outbox_topics()} & _fleet_topics())
    connect |= {("topic", t, op) for t in internal for op in ("Read", "Write", "Describe", "DescribeConfigs", "Create")}
    # exactly-once source only (flotilla.delivery): the leader's transactional id and one
    # per connector task; at-least-once produces without transactions and is granted none
    group = kc["spec"]["groupId"]
    transactional = [f"connect-cluster-{group}"]
    transactional += [
        f"{group}-{c['metadata']['name']}-{task}"
        for c in of_kind(objects, "KafkaConnector")
        for task in range(c["spec"]["tasksMax"])
    ]
    if kc["spec"]["config"]["exactly.once.source.support"] == "enabled":
        connect |= {("transactionalId", t, op) for t in transactional for op in ("Write", "Describe")}
    expected[CONNECT_USER] = connect
    # KEDA: Describe on the groups it measures and their topics, nothing more.
    keda: set[Grant] = set()
    for so in of_kind(objects, "ScaledObject"):
        for trigger in so["spec"]["triggers"]:
            keda |= {("group", trigger["metadata"]["consumerGroup"], "Describe")}
            keda |= {("topic", trigger["metadata"]["topic"], "Describe")}
    expected[KEDA_USER] = keda
    assert set(users) == set(expected)
    for name, grants in expected.items():
        actual = _grants(users[name])
        assert actual == grants, f"{name}: missing {sorted(grants - actual)}, extra {sorted(actual - grants)}"


def test_kafka_topics_are_the_local_stacks(overlay: str, objects: tuple[dict[str, Any], ...]) -> None:
    topics = {t["metadata"]["name"]: t for t in of_kind(objects, "KafkaTopic")}
    if overlay == "dev":
        assert topics == {}
        return
    assert set(topics) == _fleet_topics()
    for name, (partitions, config) in stackctl.TOPICS.items():
        spec = topics[name]["spec"]
        assert topics[name]["metadata"]["labels"]["strimzi.io/cluster"] == KAFKA_CLUSTER
        assert "topicName" not in spec, name
        assert spec["partitions"] == partitions, name
        declared = {k: str(v) for k, v in spec.get("config", {}).items()}
        assert declared.items() >= config.items(), name
        assert spec["replicas"] > int(declared["min.insync.replicas"]) > 1, f"{name}: acks=all must survive a broker"
    assert {topics[t]["spec"]["partitions"] for t in ("incidents", "commands")} == {PARTITIONS}


def test_kafka_connect_authenticates_and_trusts_the_cluster_ca(
    overlay: str, objects: tuple[dict[str, Any], ...]
) -> None:
    (kc,) = of_kind(objects, "KafkaConnect")
    if overlay == "dev":
        assert "authentication" not in kc["spec"] and "tls" not in kc["spec"]
        return
    assert kc["spec"]["authentication"] == {
        "type": "scram-sha-512",
        "username": CONNECT_USER,
        "passwordSecret": {"secretName": CONNECT_USER, "password": "password"},
    }
    assert kc["spec"]["tls"] == {"trustedCertificates": [{"secretName": CLUSTER_CA, "certificate": "ca.crt"}]}
    named(objects, "KafkaUser", CONNECT_USER)


def test_keda_authenticates_with_a_trigger_authentication_that_exists(
    overlay: str, objects: tuple[dict[str, Any], ...]
) -> None:
    refs = [t.get("authenticationRef") for so in of_kind(objects, "ScaledObject") for t in so["spec"]["triggers"]]
    if overlay == "dev":
        assert refs == [None] * len(refs) and of_kind(objects, "TriggerAuthentication") == []
        return
    for ref in refs:
        assert ref is not None and ref.get("kind", "TriggerAuthentication") == "TriggerAuthentication"
        auth = named(objects, "TriggerAuthentication", ref["name"])["spec"]
        params: dict[str, Any] = {}
        for entry in auth.get("configMapTargetRef", []):
            # KEDA looks the ConfigMap up by this exact name: it must not be hash-suffixed.
            params[entry["parameter"]] = configmap_data(objects, entry["name"])[entry["key"]]
        for entry in auth.get("secretTargetRef", []):
            params[entry["parameter"]] = (entry["name"], entry["key"])
        assert params == {
            "sasl": "scram_sha512",
            "username": KEDA_USER,
            "password": (KEDA_USER, "password"),
            "tls": "enable",
            "ca": (CLUSTER_CA, "ca.crt"),
        }
        named(objects, "KafkaUser", KEDA_USER)


def test_the_fleet_may_reach_the_kafka_listener(objects: tuple[dict[str, Any], ...]) -> None:
    port = int(configmap_data(objects, _stack_configmap(objects))["FLOTILLA_KAFKA_BOOTSTRAP"].rsplit(":", 1)[1])
    egress = named(objects, "NetworkPolicy", "backend-egress")["spec"]["egress"]
    allowed = {p["port"] for rule in egress for p in rule.get("ports", [])}
    assert port in allowed
    assert not ({9092, 9093} - {port}) & allowed, "only the listener the fleet uses"


# ----------------------------------------------------------------------------- PDBs, NetworkPolicies, RBAC


def test_each_deployment_has_one_matching_pdb(objects: tuple[dict[str, Any], ...]) -> None:
    deployments = of_kind(objects, "Deployment")
    for pdb in of_kind(objects, "PodDisruptionBudget"):
        matched = [
            d for d in deployments if selects(pdb["spec"]["selector"], d["spec"]["template"]["metadata"]["labels"])
        ]
        assert [d["metadata"]["name"] for d in matched] == [pdb["metadata"]["name"]], ident(pdb)
    assert {p["metadata"]["name"] for p in of_kind(objects, "PodDisruptionBudget")} == {
        d["metadata"]["name"] for d in deployments
    }
    for d in deployments:  # the Deployment's own selector selects its pods
        assert selects(d["spec"]["selector"], d["spec"]["template"]["metadata"]["labels"]), ident(d)


def test_network_policies_select_pods_that_exist(objects: tuple[dict[str, Any], ...]) -> None:
    all_pods = pods(objects)
    policies = of_kind(objects, "NetworkPolicy")
    assert any(
        p["spec"]["podSelector"] == {} and p["spec"]["policyTypes"] == ["Ingress"] and "ingress" not in p["spec"]
        for p in policies
    ), "default deny ingress"
    for policy in policies:
        spec = policy["spec"]
        # the stack's pods beside the fleet are behind the default deny too (base admits the fleet)
        targets = [p for p in [*all_pods, *STACK_PODS] if selects(spec["podSelector"], p[1])]
        assert targets, f"{ident(policy)} selects no pod"
        for rule in spec.get("ingress", []):
            for port in rule.get("ports", []):
                assert all(port["port"] in p[2] for p in targets), f"{ident(policy)}: port {port['port']}"
        for rule in spec.get("ingress", []) + spec.get("egress", []):
            for peer in rule.get("from", []) + rule.get("to", []):
                if "podSelector" in peer and "namespaceSelector" not in peer:  # a peer in this namespace
                    peers = [p for p in [*all_pods, *STACK_PODS] if selects(peer["podSelector"], p[1])]
                    assert peers, f"{ident(policy)}: peer {peer['podSelector']} selects no pod"
                    for port in rule.get("ports", []) if "to" in rule else []:
                        assert all(port["port"] in p[2] for p in peers), f"{ident(policy)}: port {port['port']}"
    # Prometheus may scrape every member, and every member is behind the default deny.
    metrics = named(objects, "NetworkPolicy", "metrics-from-prometheus")
    for owner, labels, _ in all_pods:
        if labels.get("app.kubernetes.io/part-of") == "flotilla" and owner.startswith("Deployment/"):
            assert selects(metrics["spec"]["podSelector"], labels), owner


def _egress_policies(objects: tuple[dict[str, Any], ...], labels: dict[str, str]) -> list[dict[str, Any]]:
    return [
        p
        for p in of_kind(objects, "NetworkPolicy")
        if "Egress" in p["spec"]["policyTypes"] and selects(p["spec"]["podSelector"], labels)
    ]


def test_every_egress_rule_names_its_destination(objects: tuple[dict[str, Any], ...]) -> None:
    """No egress by port alone: every rule has peers, none of them "anywhere" (an empty
    selector, a namespaceSelector without a pod or namespace named, a wide ipBlock), and every
    pod the manifests make is under an egress policy (a pod under none may go anywhere)."""
    for policy in of_kind(objects, "NetworkPolicy"):
        for rule in policy["spec"].get("egress", []):
            assert rule.get("to"), f"{ident(policy)}: an egress rule without `to:` allows any destination"
            assert rule.get("ports"), f"{ident(policy)}: an egress rule without ports allows every port"
            for peer in rule["to"]:
                if "ipBlock" in peer:
                    address, _, prefix = peer["ipBlock"]["cidr"].partition("/")
                    assert int(prefix) == (128 if ":" in address else 32), f"{ident(policy)}: {peer} is a range"
                    continue
                names = peer.get("namespaceSelector", {}).get("matchLabels", {})
                selector = peer.get("podSelector", {})
                if "namespaceSelector" in peer:
                    assert "kubernetes.io/metadata.name" in names, f"{ident(policy)}: {peer} names no namespace"
                else:
                    assert selector.get("matchLabels") or selector.get("matchExpressions"), f"{ident(policy)}: {peer}"
    for owner, labels, _ in pods(objects):
        if owner.startswith(("Deployment/", "Job/")):
            assert _egress_policies(objects, labels), f"{owner} is under no egress policy: it may reach anything"


def _address(value: str) -> tuple[str, int]:
    """(host, port) of a URL or a host:port."""
    if "://" in value:
        url = urlsplit(value)
        assert url.hostname is not None and url.port is not None, value
        return url.hostname, url.port
    host, port = value.rsplit(":", 1)
    return host, int(port)


def _reaches(
    objects: tuple[dict[str, Any], ...], labels: dict[str, str], own_namespace: str, host: str, port: int
) -> bool:
    """Whether an egress rule of a policy selecting ``labels`` allows ``port`` to the
    namespace a Service name ``host`` lives in (``name.namespace.svc``, else ours)."""
    namespace = host.split(".")[1] if "." in host else own_namespace
    for policy in _egress_policies(objects, labels):
        for rule in policy["spec"].get("egress", []):
            if port not in {p["port"] for p in rule.get("ports", [])}:
                continue
            for peer in rule.get("to", []):
                named_ns = peer.get("namespaceSelector", {}).get("matchLabels", {}).get("kubernetes.io/metadata.name")
                if "ipBlock" not in peer and (named_ns or own_namespace) == namespace:
                    return True
    return False


ADDRESS_SETTINGS = (
    "FLOTILLA_KAFKA_BOOTSTRAP",
    "FLOTILLA_SCHEMA_REGISTRY_URL",
    "FLOTILLA_CONNECT_URL",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "FLOTILLA_PROMETHEUS_URL",
)


def test_each_address_a_pod_is_given_is_where_its_egress_goes(
    overlay: str, objects: tuple[dict[str, Any], ...]
) -> None:
    """The stack's addresses (flotilla-stack, the members' own) against the egress rules:
    the port *and* the namespace of each, so a rule narrowed to the wrong place fails here."""
    for workload in workloads(objects):
        labels = workload["spec"]["template"]["metadata"]["labels"]
        own = workload["metadata"]["namespace"]
        env = container_env(objects, workload["spec"]["template"]["spec"]["containers"][0])
        addresses = [_address(env[k]) for k in ADDRESS_SETTINGS if isinstance(env.get(k), str)]
        if isinstance(env.get("FLOTILLA_PG_HOST"), str):
            addresses.append((env["FLOTILLA_PG_HOST"], int(env["FLOTILLA_PG_PORT"])))
        for host, port in addresses:
            assert _reaches(objects, labels, own, host, port), f"{ident(workload)} cannot reach {host}:{port}"
        # and Prometheus only for those that read it
        reads_prometheus = isinstance(env.get("FLOTILLA_PROMETHEUS_URL"), str)
        assert _reaches(objects, labels, own, "prometheus-operated.monitoring.svc", 9090) == reads_prometheus, ident(
            workload
        )
    if overlay == "production":
        # The API server by address only (a placeholder to edit), and for the members that
        # hold a token: the executor, the diagnostic agent and the policy service (readers).
        (policy,) = [
            p
            for p in of_kind(objects, "NetworkPolicy")
            for rule in p["spec"].get("egress", [])
            for peer in rule["to"]
            if "ipBlock" in peer
        ]
        assert policy["spec"]["podSelector"] == {
            "matchExpressions": [
                {
                    "key": "app.kubernetes.io/name",
                    "operator": "In",
                    "values": ["executor", "diagnostic-agent", "policy-service"],
                }
            ]
        }
        assert {p["port"] for rule in policy["spec"]["egress"] for p in rule["ports"]} == {443, 6443}


def _served_namespaces(objects: tuple[dict[str, Any], ...]) -> EnvironmentNamespaces | None:
    """The executor's environment -> namespace map (FLOTILLA_KUBERNETES_NAMESPACES), as it
    reads it (validated), or None when the overlay sets none."""
    executor = configmap_data(objects, _configmap_of(objects, "executor"))
    raw = executor.get("FLOTILLA_KUBERNETES_NAMESPACES")
    return None if raw is None else EnvironmentNamespaces(json.loads(raw))


def test_each_environment_is_served_from_its_own_namespace(overlay: str, objects: tuple[dict[str, Any], ...]) -> None:
    for workload in workloads(objects):
        for container in workload["spec"]["template"]["spec"]["containers"]:
            # the single namespace that served every environment (a dev command reached production)
            assert "FLOTILLA_KUBERNETES_NAMESPACE" not in container_env(objects, container), ident(workload)
    served = _served_namespaces(objects)
    fleet_namespace = named(objects, "Deployment", "executor")["metadata"]["namespace"]
    if overlay == "dev":
        # dev acts on the sim; were a Kubernetes target ever added, never on production.
        assert served is None or "production" not in served, served
        return
    assert served is not None and "production" in served
    assert fleet_namespace not in served.values(), "the executor must not act on the fleet's own Deployments"


def test_only_the_production_executor_and_diagnostic_agent_talk_to_the_kubernetes_api(
    overlay: str, objects: tuple[dict[str, Any], ...]
) -> None:
    for sa in of_kind(objects, "ServiceAccount"):
        assert sa["automountServiceAccountToken"] is False, ident(sa)
    automounted = [
        member_of(w) for w in workloads(objects) if w["spec"]["template"]["spec"]["automountServiceAccountToken"]
    ]
    roles, bindings = of_kind(objects, "Role"), of_kind(objects, "RoleBinding")
    readers = [r for r in roles + bindings if r["metadata"]["labels"]["app.kubernetes.io/name"] == "diagnostic-agent"]
    counters = [r for r in roles + bindings if r["metadata"]["labels"]["app.kubernetes.io/name"] == "policy-service"]
    assert of_kind(objects, "ClusterRole") == [] and of_kind(objects, "ClusterRoleBinding") == []
    if overlay == "dev":
        assert automounted == [] and roles == [] and bindings == []
        return
    assert sorted(automounted) == ["diagnostic-agent", "executor", "policy-service"]
    served = _served_namespaces(objects)
    assert served is not None
    _assert_read_only(objects, readers, served)
    _assert_policy_reads_replicas_only(objects, counters, served)
    roles = [r for r in roles if r not in readers + counters]
    bindings = [b for b in bindings if b not in readers + counters]
    # Exactly one Role and one RoleBinding in each served namespace, and none anywhere else:
    # the executor may patch the Deployments of the environments it serves, nothing more.
    assert sorted(r["metadata"]["namespace"] for r in roles) == sorted(served.values())
    assert sorted(b["metadata"]["namespace"] for b in bindings) == sorted(served.values())
    fleet_namespace = named(objects, "Deployment", "executor")["metadata"]["namespace"]
    for namespace in served.values():
        (role,) = [r for r in roles if r["metadata"]["namespace"] == namespace]
        (binding,) = [b for b in bindings if b["metadata"]["namespace"] == namespace]
        rules = _rules(role)
        # What KubernetesTarget calls (test_targets.py checks the calls against this Role):
        # read and patch (claim, record, restart, pause, rollback, raise-memory) a Deployment,
        # list them (lookup), patch the scale subresource (never read), list ReplicaSets
        # (rollback), get and patch the autoscalers (raise-ceiling). list is a rule of its
        # own: resourceNames, where an operator adds them, must never narrow it.
        assert rules == {
            ("apps", "deployments", ("get", "patch")),
            ("apps", "deployments", ("list",)),
            ("apps", "deployments/scale", ("patch",)),
            ("apps", "replicasets", ("list",)),
            ("autoscaling", "horizontalpodautoscalers", ("get", "patch")),
            ("keda.sh", "scaledobjects", ("get", "patch")),
        }, f"{ident(role)} in {namespace}"
        assert all("resourceNames" not in r for r in role["rules"] if "list" in r["verbs"]), ident(role)
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "executor", "namespace": fleet_namespace}]
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": role["metadata"]["name"],
        }


def _rules(role: dict[str, Any]) -> set[tuple[str, str, tuple[str, ...]]]:
    """A Role's rules as (group, resource, verbs), each rule of one group and one resource."""
    assert all(len(r["apiGroups"]) == 1 and len(r["resources"]) == 1 for r in role["rules"]), ident(role)
    return {(r["apiGroups"][0], r["resources"][0], tuple(r["verbs"])) for r in role["rules"]}


def _assert_read_only(objects: tuple[dict[str, Any], ...], readers: list[dict[str, Any]], served: Any) -> None:
    """The diagnostic agent's Role (flotilla_evidence.kubernetes): in each namespace it reads
    (the executor's, the same estate), get Deployments and list their ReplicaSets and events."""
    diagnostic = configmap_data(objects, _configmap_of(objects, "diagnostic-agent"))
    assert json.loads(diagnostic["FLOTILLA_KUBERNETES_NAMESPACES"]) == dict(served)
    assert diagnostic["FLOTILLA_KUBERNETES_EVIDENCE"] == "true"
    fleet_namespace = named(objects, "Deployment", "diagnostic-agent")["metadata"]["namespace"]
    for namespace in served.values():
        (role,) = [r for r in readers if r["kind"] == "Role" and r["metadata"]["namespace"] == namespace]
        (binding,) = [b for b in readers if b["kind"] == "RoleBinding" and b["metadata"]["namespace"] == namespace]
        rules = {(r["apiGroups"][0], r["resources"][0], tuple(r["verbs"])) for r in role["rules"]}
        assert rules == {
            ("apps", "deployments", ("get",)),
            ("apps", "replicasets", ("list",)),
            ("", "events", ("list",)),
        }, ident(role)
        subject = {"kind": "ServiceAccount", "name": "diagnostic-agent", "namespace": fleet_namespace}
        assert binding["subjects"] == [subject]
        assert binding["roleRef"]["name"] == role["metadata"]["name"]


def _assert_policy_reads_replicas_only(
    objects: tuple[dict[str, Any], ...], counters: list[dict[str, Any]], served: Any
) -> None:
    """The policy service's Role: the 2x rule's count from the Deployment the executor
    scales (services/policy/inventory.py), and what its dry runs of the executor's writes
    need (services/policy/preview_kubernetes.py), in each namespace it serves; that those
    patches are only ever dry runs is the admission policy's (test below)."""
    policy = configmap_data(objects, _configmap_of(objects, "policy-service"))
    assert policy["FLOTILLA_POLICY_INVENTORY"] == "kubernetes"
    assert policy["FLOTILLA_POLICY_PREVIEW"] == "kubernetes"
    assert json.loads(policy["FLOTILLA_KUBERNETES_NAMESPACES"]) == dict(served)
    fleet_namespace = named(objects, "Deployment", "policy-service")["metadata"]["namespace"]
    assert sorted(c["metadata"]["namespace"] for c in counters if c["kind"] == "Role") == sorted(served.values())
    for namespace in served.values():
        (role,) = [r for r in counters if r["kind"] == "Role" and r["metadata"]["namespace"] == namespace]
        (binding,) = [b for b in counters if b["kind"] == "RoleBinding" and b["metadata"]["namespace"] == namespace]
        rules = _rules(role)
        assert rules == {
            ("apps", "deployments", ("get", "patch")),
            ("apps", "deployments/scale", ("patch",)),
            ("apps", "replicasets", ("list",)),
            ("autoscaling", "horizontalpodautoscalers", ("get", "patch")),
            ("keda.sh", "scaledobjects", ("get", "patch")),
        }, ident(role)
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "policy-service", "namespace": fleet_namespace}
        ]
        assert binding["roleRef"]["name"] == role["metadata"]["name"]


def test_the_policy_services_writes_are_dry_runs_only(overlay: str, objects: tuple[dict[str, Any], ...]) -> None:
    """Production: a ValidatingAdmissionPolicy, bound to deny, matches every write of the
    policy service's ServiceAccount (any resource, any namespace) and allows only a dry
    run; cluster-scoped, so no namespace. Dev has no Kubernetes API calls to guard."""
    policies = of_kind(objects, "ValidatingAdmissionPolicy")
    bindings = of_kind(objects, "ValidatingAdmissionPolicyBinding")
    if overlay == "dev":
        assert policies == [] and bindings == []
        return
    (policy,), (binding,) = policies, bindings
    assert "namespace" not in policy["metadata"] and "namespace" not in binding["metadata"]
    fleet_namespace = named(objects, "Deployment", "policy-service")["metadata"]["namespace"]
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"]["resourceRules"] == [
        {
            "apiGroups": ["*"],
            "apiVersions": ["*"],
            "operations": ["CREATE", "UPDATE", "DELETE"],
            "resources": ["*/*"],
        }
    ]
    user = f"system:serviceaccount:{fleet_namespace}:policy-service"
    assert [c["expression"] for c in spec["matchConditions"]] == [f"request.userInfo.username == '{user}'"]
    assert [v["expression"] for v in spec["validations"]] == ["request.dryRun == true"]
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
