"""docker-compose.yml stays the same stack as the local one (infra/local/stackctl.py).

Fast and offline: the compose file is read as YAML and checked against the local
stack's ports, topics and registry compatibility, the generated connector and init
SQL against their Python sources, and the testcontainers starter against the compose
file (with stand-in testcontainers classes: no Docker engine runs here).
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import json
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from flotilla import fleet
from flotilla.connectors import connector_name, outbox_connector_config
from flotilla.outbox import OUTBOX_MIGRATION
from flotilla.provenance import PRODUCERS
from tests.keys import assert_each_signs_and_all_believe
from tests.support import containers
from tests.support.scripts import load_script

from ..poms import LOCAL_STACK_POM, TRANSFORMS_POM, pom_property, pom_text
from .dockerfiles import stages

REPO_ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO_ROOT / "docker-compose.yml"
CONNECTOR_FILE = REPO_ROOT / "infra" / "connectors" / "outbox-flotilla.json"
INIT_SQL = REPO_ROOT / "infra" / "compose" / "postgres-init" / "01-outbox.sql"
REGISTRY_SQL = REPO_ROOT / "infra" / "compose" / "postgres-init" / "00-registry.sql"
RENDER = REPO_ROOT / "infra" / "connectors" / "render.py"
TRANSFORMS_DIR = REPO_ROOT / "infra" / "connect-transforms"

# compose service -> key of stackctl.PORTS
PORT_KEYS = {"postgres": "postgres", "kafka": "kafka", "schema-registry": "registry", "connect": "connect"}
INFRA = tuple(PORT_KEYS)
INIT_JOBS = ("registry-auth-init", "kafka-init", "registry-init", "connect-init")
FINAL_CONDITIONS = {"service_healthy", "service_completed_successfully"}


@pytest.fixture(scope="module")
def stackctl() -> Iterator[ModuleType]:
    """stackctl as it stands by default: port overrides from the environment are ignored."""
    with pytest.MonkeyPatch.context() as mp:
        for var in (
            "PG",
            "KAFKA",
            "KAFKA_CONTROLLER",
            "REGISTRY",
            "REGISTRY_MANAGEMENT",
            "CONNECT",
            "PROMETHEUS",
            "ALERTMANAGER",
        ):
            mp.delenv(f"FLOTILLA_{var}_PORT", raising=False)
        yield load_script("_stackctl_under_test", REPO_ROOT / "infra" / "local" / "stackctl.py")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(doc, dict)
    return doc


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    svc = compose["services"]
    assert isinstance(svc, dict)
    return svc


def _script(service: dict[str, Any]) -> str:
    """The shell script of an init job: entrypoint `/bin/sh -ec`, command [script]."""
    assert service["entrypoint"][0] in ("/bin/sh", "sh")
    assert service["entrypoint"][1].startswith("-") and "c" in service["entrypoint"][1]
    command = service["command"]
    assert isinstance(command, list) and len(command) == 1
    return str(command[0])


def _opt(argv: list[str], *names: str) -> str:
    for i, arg in enumerate(argv):
        if arg in names:
            return argv[i + 1]
    raise AssertionError(f"none of {names} in {argv}")


# ------------------------------------------------------------------ structure


def test_compose_has_the_stack_and_its_init_jobs(services: dict[str, dict[str, Any]]) -> None:
    # The fleet, its init job, the demo incident and observability are checked in
    # test_compose_fleet.py; the infrastructure stays exactly what the local stack runs.
    assert set(INFRA) | set(INIT_JOBS) <= set(services)
    assert tuple(INFRA) == containers.INFRA_SERVICES
    assert tuple(INIT_JOBS) == containers.SETUP_SERVICES + containers.INIT_SERVICES


def test_every_image_is_pinned(services: dict[str, dict[str, Any]]) -> None:
    for name, svc in services.items():
        image = svc["image"]
        repo, _, tag = image.rpartition(":")
        assert repo and "/" not in tag, f"{name}: image {image!r} has no tag"
        assert tag and tag != "latest", f"{name}: image {image!r} is not pinned"


def test_long_running_services_have_healthchecks(services: dict[str, dict[str, Any]]) -> None:
    for name in INFRA:
        check = services[name].get("healthcheck")
        assert check and not check.get("disable"), f"{name} has no healthcheck"
        test = check["test"]
        assert isinstance(test, list) and test[0] in ("CMD", "CMD-SHELL") and len(test) > 1, name
        containers.parse_duration(check["interval"])  # readable by the testcontainers starter
        containers.parse_duration(check["timeout"])


def test_init_jobs_run_once_and_publish_nothing(services: dict[str, dict[str, Any]]) -> None:
    for name in INIT_JOBS:
        svc = services[name]
        assert svc.get("restart") == "no", f"{name} must not restart"
        assert "ports" not in svc and "healthcheck" not in svc, name


def test_every_dependency_waits_for_health_or_completion(services: dict[str, dict[str, Any]]) -> None:
    one_shot = {name for name, svc in services.items() if svc.get("restart") == "no"}
    assert set(INIT_JOBS) <= one_shot
    for name, svc in services.items():
        deps = svc.get("depends_on", {})
        assert isinstance(deps, dict), f"{name}: depends_on must use the long form with a condition"
        for dep, cfg in deps.items():
            assert dep in services, f"{name} depends on unknown {dep}"
            condition = cfg["condition"]
            assert condition in FINAL_CONDITIONS, f"{name} -> {dep}: {condition}"
            expected = "service_completed_successfully" if dep in one_shot else "service_healthy"
            assert condition == expected, f"{name} -> {dep} should be {expected}"
    assert services["connect-init"]["depends_on"]["kafka-init"]["condition"] == "service_completed_successfully"
    assert {"connect", "postgres"} <= set(services["connect-init"]["depends_on"])


def test_host_ports_match_the_local_stack_on_loopback(
    services: dict[str, dict[str, Any]], stackctl: ModuleType
) -> None:
    for name, svc in services.items():
        bindings = [containers._port(p) for p in svc.get("ports", [])]
        assert all(b.host_ip == "127.0.0.1" for b in bindings), f"{name} publishes beyond loopback"
        if name in PORT_KEYS:
            assert [b.host_port for b in bindings] == [stackctl.PORTS[PORT_KEYS[name]]], name


def test_port_syntax_without_a_host_address_is_refused() -> None:
    with pytest.raises(containers.ComposeSpecError):
        containers._port("18081:8081")


# ----------------------------------------------------------------------- kafka


def test_kafka_advertises_the_published_port_and_an_internal_listener(
    services: dict[str, dict[str, Any]], stackctl: ModuleType
) -> None:
    env = services["kafka"]["environment"]
    advertised = dict(item.split("://") for item in env["KAFKA_ADVERTISED_LISTENERS"].split(","))
    listeners = dict(item.split("://") for item in env["KAFKA_LISTENERS"].split(","))
    published = containers._port(services["kafka"]["ports"][0])
    assert advertised["EXTERNAL"] == f"127.0.0.1:{stackctl.PORTS['kafka']}"
    assert listeners["EXTERNAL"].rsplit(":", 1)[1] == str(published.container_port)
    assert advertised["INTERNAL"] == "kafka:9092"
    assert env["KAFKA_INTER_BROKER_LISTENER_NAME"] == "INTERNAL"
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"  # as the local stack: topics come from kafka-init
    assert services["connect"]["environment"]["BOOTSTRAP_SERVERS"] == advertised["INTERNAL"]


def _topic_args(line: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    parser.add_argument("--bootstrap-server", required=True)
    parser.add_argument("--create", action="store_true")
    parser.add_argument("--if-not-exists", action="store_true")
    parser.add_argument("--topic", required=True)
    parser.add_argument("--partitions", type=int, required=True)
    parser.add_argument("--replication-factor", type=int, required=True)
    parser.add_argument("--config", action="append", default=[])
    argv = shlex.split(line)
    assert argv[0].endswith("/kafka-topics.sh"), line
    return parser.parse_args(argv[1:])


def test_kafka_init_creates_the_local_stacks_topics(services: dict[str, dict[str, Any]], stackctl: ModuleType) -> None:
    lines = [line for line in _script(services["kafka-init"]).splitlines() if line.strip()]
    created = {}
    for line in lines:
        args = _topic_args(line)
        assert args.create and args.if_not_exists, f"not idempotent: {line}"
        assert args.bootstrap_server == "kafka:9092"
        assert args.replication_factor == 1
        created[args.topic] = (args.partitions, dict(c.split("=", 1) for c in args.config))
    assert created == stackctl.TOPICS
    assert services["kafka-init"]["image"] == services["kafka"]["image"]


# -------------------------------------------------------------------- registry


REGISTRY_API = "/apis/ccompat/v7"  # Apicurio's Confluent-compatible API, as in the local stack


def _registry_auth_init(services: dict[str, dict[str, Any]]) -> argparse.Namespace:
    """What registry-auth-init runs: `python -m flotilla.registrar users ...`."""
    argv = shlex.split(_script(services["registry-auth-init"]))
    assert argv[:4] == ["python", "-m", "flotilla.registrar", "users"], argv
    parser = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    for option in ("--credentials", "--credentials-owner", "--users", "--users-mode"):
        parser.add_argument(option, required=True)
    return parser.parse_args(argv[4:])


def test_the_registry_is_the_local_stacks_apicurio_requiring_credentials_to_write(
    compose: dict[str, Any], services: dict[str, dict[str, Any]], stackctl: ModuleType
) -> None:
    from flotilla.registry import SERVER_ENV

    registry = services["schema-registry"]
    repo, _, version = registry["image"].rpartition(":")
    assert (repo, version) == ("apicurio/apicurio-registry", pom_property(LOCAL_STACK_POM, "apicurio.version"))
    env = registry["environment"]
    # The same switches as the local stack's registry (stackctl.REGISTRY_AUTH_ENV) and Kubernetes'.
    assert {k: env[k] for k in SERVER_ENV} == SERVER_ENV == stackctl.REGISTRY_AUTH_ENV
    for deletion in ("ARTIFACT", "ARTIFACT_VERSION", "GROUP"):  # tests delete their throwaway subjects
        assert env[f"APICURIO_REST_DELETION_{deletion}_ENABLED"] == "true"
    # Its users file is the one registry-auth-init writes, on a volume only the two mount.
    init = _registry_auth_init(services)
    assert env["QUARKUS_CONFIG_LOCATIONS"] == init.users
    volume, mount = _in_volume(compose, registry, init.users)[0], init.users.rsplit("/", 1)[0]
    assert f"{volume}:{mount}:ro" in registry["volumes"]
    assert {n for n, svc in services.items() if volume in _named_mounts(compose, svc)} == {
        "schema-registry",
        "registry-auth-init",
    }
    assert registry["depends_on"]["registry-auth-init"] == {"condition": "service_completed_successfully"}
    # Storage: the postgres service's `registry` database, created by its init SQL.
    pg = services["postgres"]["environment"]
    assert env["APICURIO_STORAGE_SQL_KIND"] == "postgresql"
    assert env["APICURIO_DATASOURCE_URL"] == f"jdbc:postgresql://postgres:5432/{stackctl.PG_DATABASES[1]}"
    assert (env["APICURIO_DATASOURCE_USERNAME"], env["APICURIO_DATASOURCE_PASSWORD"]) == (
        pg["POSTGRES_USER"],
        pg["POSTGRES_PASSWORD"],
    )
    assert f"CREATE DATABASE {stackctl.PG_DATABASES[1]};" in REGISTRY_SQL.read_text()
    # Health on the management port, which is not published; the API port is.
    assert containers._port(registry["ports"][0]).container_port == int(env["QUARKUS_HTTP_PORT"])
    assert f"localhost:{env['QUARKUS_MANAGEMENT_PORT']}/health/ready" in " ".join(registry["healthcheck"]["test"])


def test_registry_auth_init_writes_the_users_file_from_credentials_only_writers_read(
    services: dict[str, dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its command, run here (folders standing for the volumes, no chown): the users file
    the registry reads matches the credentials registry-init and fleet-init present."""
    from flotilla import registry as registry_module

    job = services["registry-auth-init"]
    assert job["user"] == "0:0"  # it writes for two other users
    assert job["environment"] == {"FLOTILLA_SCHEMA_REGISTRY_AUTH": "${FLOTILLA_SCHEMA_REGISTRY_AUTH:-}"}
    init = _registry_auth_init(services)
    readers = {"registry-init": services["registry-init"]["user"], "fleet-init": "10001:10001"}  # the image's user
    assert set(readers.values()) == {init.credentials_owner}
    assert services["fleet-init"]["environment"]["FLOTILLA_SCHEMA_REGISTRY_AUTH_FILE"] == init.credentials
    monkeypatch.delenv("FLOTILLA_SCHEMA_REGISTRY_AUTH", raising=False)
    creds, users = tmp_path / "registrar", tmp_path / "users.properties"
    argv = ["users", "--credentials", str(creds), "--users", str(users), "--users-mode", init.users_mode]
    assert registry_module.main(argv) == 0
    assert users.read_text() == registry_module.users_properties(registry_module.read_credentials(creds))
    assert (creds.stat().st_mode & 0o777, users.stat().st_mode & 0o777) == (0o600, 0o640)


def test_registry_init_sets_the_local_stacks_compatibility_as_the_registrar(
    services: dict[str, dict[str, Any]], stackctl: ModuleType, tmp_path: Path
) -> None:
    job = services["registry-init"]
    credentials = _registry_auth_init(services).credentials
    assert f"registrar:{credentials.rsplit('/', 1)[0]}:ro" in job["volumes"]
    quote, put = _script(job).strip().split(" | ")
    argv = shlex.split(put)
    assert argv[0] == "curl" and "-f" in "".join(a for a in argv if a.startswith("-") and not a.startswith("--"))
    assert _opt(argv, "-K", "--config") == "-"  # the credentials arrive on stdin, never in argv
    assert _opt(argv, "-X", "--request") == "PUT"
    internal = containers._port(services["schema-registry"]["ports"][0]).container_port
    assert argv[-1] == f"http://schema-registry:{internal}{REGISTRY_API}/config"
    assert json.loads(_opt(argv, "--data", "-d", "--data-binary")) == {"compatibility": stackctl.GLOBAL_COMPATIBILITY}
    # The quoting step, run here (POSIX sed, as busybox's) on a credentials file.
    sample = tmp_path / "registrar"
    sample.write_text("registrar:Abc-_123\n")
    config = subprocess.run(
        ["sh", "-ec", quote.replace(credentials, str(sample))], capture_output=True, text=True, check=True
    ).stdout
    assert config == 'user = "registrar:Abc-_123"\n'


# --------------------------------------------------------- connector and Connect


def test_connector_json_is_the_python_definition() -> None:
    doc = json.loads(CONNECTOR_FILE.read_text())
    assert doc == {"name": connector_name("flotilla"), "config": outbox_connector_config("flotilla")}


def test_render_check_passes_on_the_committed_files() -> None:
    proc = subprocess.run([sys.executable, str(RENDER), "--check"], capture_output=True, text=True, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr


def test_render_check_flags_a_stale_file(tmp_path: Path) -> None:
    from flotilla_ops.generated import stale  # what render.py --check runs

    good, bad, missing = tmp_path / "good.json", tmp_path / "bad.json", tmp_path / "missing.json"
    good.write_text("{}\n")
    bad.write_text('{"edited": "by hand"}\n')
    assert stale({good: "{}\n", bad: "{}\n", missing: "{}\n"}) == [bad, missing]


def test_connect_init_puts_exactly_the_connector_config(services: dict[str, dict[str, Any]]) -> None:
    svc = services["connect-init"]
    assert "./infra/connectors:/connectors:ro" in svc["volumes"]
    stages = _script(svc).strip().split(" | ")
    extract, put = stages[:-1], shlex.split(stages[-1])
    # Run the extraction here (POSIX sed, as busybox's in the curl image) on the real file.
    local = " | ".join(extract).replace("/connectors/", f"{REPO_ROOT}/infra/connectors/")
    out = subprocess.run(["sh", "-ec", local], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == outbox_connector_config("flotilla")
    assert put[0] == "curl" and _opt(put, "-X", "--request") == "PUT"
    assert _opt(put, "--data-binary") == "@-"
    internal = containers._port(services["connect"]["ports"][0]).container_port
    assert put[-1] == f"http://connect:{internal}/connectors/{connector_name('flotilla')}/config"


def test_connect_resolves_every_env_reference_of_the_connector(services: dict[str, dict[str, Any]]) -> None:
    env = services["connect"]["environment"]
    assert env["CONNECT_CONFIG_PROVIDERS"] == "env"
    assert env["CONNECT_CONFIG_PROVIDERS_ENV_CLASS"] == "org.apache.kafka.common.config.provider.EnvVarConfigProvider"
    refs = {m for v in outbox_connector_config("flotilla").values() for m in re.findall(r"\$\{env:([A-Z_]+)\}", v)}
    assert refs == {"FLOTILLA_PG_HOST", "FLOTILLA_PG_PORT", "FLOTILLA_PG_USER", "FLOTILLA_PG_PASSWORD"}
    assert refs <= set(env)
    pg = services["postgres"]
    assert env["FLOTILLA_PG_HOST"] == "postgres"
    assert env["FLOTILLA_PG_PORT"] == str(containers._port(pg["ports"][0]).container_port)
    assert env["FLOTILLA_PG_USER"] == pg["environment"]["POSTGRES_USER"]
    assert env["FLOTILLA_PG_PASSWORD"] == pg["environment"]["POSTGRES_PASSWORD"]
    assert pg["environment"]["POSTGRES_DB"] == outbox_connector_config("flotilla")["database.dbname"]


def test_connect_is_debezium_plus_our_transforms_built_never_pulled(services: dict[str, dict[str, Any]]) -> None:
    connect = services["connect"]
    assert connect["build"] == "./infra/connect-transforms"
    assert (REPO_ROOT / connect["build"]).resolve() == TRANSFORMS_DIR
    assert connect["pull_policy"] == "build"  # someone else may own the name on a registry
    # The tag names both halves: Debezium's version and our transforms' version.
    debezium, transforms = pom_property(LOCAL_STACK_POM, "debezium.version"), pom_text(TRANSFORMS_POM, "m:version")
    assert connect["image"] == f"flotilla/connect:{debezium}-{transforms}"


def test_the_connect_image_adds_our_jar_to_debezium_s_plugin_path() -> None:
    (build_base, build_name, build_steps), (runtime_base, _, runtime_steps) = stages(TRANSFORMS_DIR / "Dockerfile")
    # The same Debezium the local stack runs (infra/local/pom.xml), and a pinned Maven on Java 17.
    assert runtime_base == f"quay.io/debezium/connect:{pom_property(LOCAL_STACK_POM, 'debezium.version')}"
    maven, _, tag = build_base.rpartition(":")
    assert maven == "maven" and re.fullmatch(r"\d+\.\d+\.\d+-eclipse-temurin-17", tag), build_base
    runs = [a for i, a in build_steps if i == "RUN"]
    assert runs[-1] == "mvn -B -q verify"  # the JUnit tests gate the image
    copies = [a.split() for i, a in runtime_steps if i == "COPY"]
    assert copies == [
        [
            f"--from={build_name}",
            "/src/target/flotilla-connect-transforms-*.jar",
            "/kafka/connect/debezium-connector-postgres/",  # Debezium's plugin: the connector extends it
        ]
    ]
    assert not [i for i, _ in runtime_steps if i in ("RUN", "USER", "ENV", "ENTRYPOINT", "CMD")], (
        "Debezium's image as it is"
    )


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("./infra/connect-transforms", containers.BuildSpec(str(TRANSFORMS_DIR))),
        (
            {"context": "./infra/connect-transforms", "dockerfile": "Other.Dockerfile"},
            containers.BuildSpec(str(TRANSFORMS_DIR), "Other.Dockerfile"),
        ),
    ],
)
def test_a_build_is_read_in_its_short_and_long_form(raw: object, expected: containers.BuildSpec) -> None:
    spec = containers.service_spec("connect", {"image": "flotilla/connect:1", "build": raw}, REPO_ROOT)
    assert spec.build == expected


@pytest.mark.parametrize(
    ("service", "message"),
    [
        ({"build": "./infra/connect-transforms"}, "has no image"),
        ({"image": "x:1", "build": {"context": ".", "args": {"A": "1"}}}, r"\['args'\] are not supported"),
        ({"image": "x:1", "build": {"dockerfile": "Dockerfile"}}, "a mapping with a context"),
        ({"image": "x:1", "build": ["."]}, "a mapping with a context"),
    ],
)
def test_a_build_the_starter_cannot_honour_is_refused(service: dict[str, Any], message: str) -> None:
    with pytest.raises(containers.ComposeSpecError, match=message):
        containers.service_spec("connect", service, REPO_ROOT)


# -------------------------------------------------------------------- postgres


def test_init_sql_is_the_outbox_migration(services: dict[str, dict[str, Any]]) -> None:
    body = "\n".join(line for line in INIT_SQL.read_text().splitlines() if not line.startswith("--"))
    assert body.strip() == OUTBOX_MIGRATION.strip()
    assert "./infra/compose/postgres-init:/docker-entrypoint-initdb.d:ro" in services["postgres"]["volumes"]


def test_postgres_runs_with_logical_wal(services: dict[str, dict[str, Any]]) -> None:
    argv = services["postgres"]["command"]
    assert argv[0] == "postgres"
    settings = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "-c")
    assert settings["wal_level"] == "logical"
    assert int(settings["max_wal_senders"]) >= 1
    assert int(settings["max_replication_slots"]) >= 1
    check = " ".join(services["postgres"]["healthcheck"]["test"])
    assert "pg_isready" in check and "-h 127.0.0.1" in check  # TCP: not fooled by the init-time server


# ------------------------------------------------------- testcontainers starter


def test_testcontainers_specs_use_the_compose_images(services: dict[str, dict[str, Any]]) -> None:
    specs = containers.service_specs(COMPOSE_FILE)
    assert {s.name: s.image for s in specs} == {n: services[n]["image"] for n in INFRA + INIT_JOBS}
    for spec in specs:
        assert spec.command == (services[spec.name].get("command") or None)
        assert spec.environment == {k: str(v) for k, v in (services[spec.name].get("environment") or {}).items()}
        assert spec.is_init_job == (spec.name in INIT_JOBS)
        assert (spec.build is not None) == ("build" in services[spec.name])
    source = Path(containers.__file__).read_text()
    for svc in services.values():
        assert svc["image"] not in source, f"{svc['image']} duplicated in containers.py"


def test_testcontainers_start_order_honours_depends_on() -> None:
    order = [s.name for s in containers.service_specs(COMPOSE_FILE)]
    for spec in containers.service_specs(COMPOSE_FILE):
        for dep in spec.depends_on:
            assert order.index(dep) < order.index(spec.name), f"{spec.name} before {dep}"


def test_testcontainers_settings_match_the_local_stack(stackctl: ModuleType) -> None:
    env = containers.stack_settings(
        containers.service_specs(COMPOSE_FILE, containers.SETUP_SERVICES + containers.INFRA_SERVICES)
    )
    local = stackctl.stack_env()
    # The testcontainers starter runs the infrastructure only: no Prometheus or Alertmanager,
    # so no settings for them (nor the webhook token a local Alertmanager presents, nor how
    # the agents read the estate that Prometheus scrapes).
    observers = {
        "FLOTILLA_PROMETHEUS_URL",
        "FLOTILLA_ALERTMANAGER_URL",
        "FLOTILLA_ALERT_WEBHOOK_TOKEN_FILE",
        *stackctl.LOCAL_ESTATE,
    }
    assert set(env) == set(local) - observers - {"FLOTILLA_SCHEMA_REGISTRY_AUTH_FILE"}
    assert env["FLOTILLA_SCHEMA_REGISTRY_URL"] == f"http://127.0.0.1:{stackctl.PORTS['registry']}{REGISTRY_API}"
    same = set(local) - observers - {"FLOTILLA_STACK", "FLOTILLA_SCHEMA_REGISTRY_AUTH_FILE"}
    assert {k: env[k] for k in same} == {k: local[k] for k in same}
    # A started stack's writers find its registrar's credentials as the local stack's do.
    with_registrar = containers.stack_settings(
        containers.service_specs(COMPOSE_FILE, containers.SETUP_SERVICES + containers.INFRA_SERVICES), Path("/x")
    )
    assert set(with_registrar) == set(local) - observers
    assert local["FLOTILLA_PROFILE"] == "demo"  # both are the demo: demo credentials allowed


def test_healthcheck_translates_to_the_docker_sdk_form(services: dict[str, dict[str, Any]]) -> None:
    spec = containers.service_spec("postgres", services["postgres"], REPO_ROOT)
    assert spec.healthcheck is not None
    sdk = spec.healthcheck.docker_sdk()
    raw = services["postgres"]["healthcheck"]
    assert sdk["test"] == raw["test"]
    assert sdk["interval"] == int(containers.parse_duration(raw["interval"]) * 1e9)
    assert sdk["retries"] == raw["retries"]


@pytest.mark.parametrize(("text", "seconds"), [("5s", 5.0), ("1m30s", 90.0), ("500ms", 0.5), ("1h", 3600.0)])
def test_parse_duration(text: str, seconds: float) -> None:
    assert containers.parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "5", "5 sec", "s5"])
def test_parse_duration_refuses_garbage(text: str) -> None:
    with pytest.raises(containers.ComposeSpecError):
        containers.parse_duration(text)


class _FakeContainer:
    """Records what the starter asks of testcontainers' DockerContainer."""

    exit_codes: dict[str, int] = {}  # noqa: RUF012 - per-test state, reset by the fixture
    log: list[str] = []  # noqa: RUF012

    def __init__(self, image: str) -> None:
        self.image = image
        self.ports: dict[str, Any] = {}
        self.env: dict[str, str] = {}
        self.kwargs: dict[str, Any] = {}
        self.aliases: tuple[str, ...] = ()
        self.command: list[str] | str | None = None
        self.volumes: list[tuple[str, str, str]] = []
        self.waits = False
        self.network: object = None

    def with_network(self, network: object) -> _FakeContainer:
        self.network = network
        return self

    def with_network_aliases(self, *aliases: str) -> _FakeContainer:
        self.aliases = aliases
        return self

    def with_envs(self, **env: str) -> _FakeContainer:
        self.env.update(env)
        return self

    def with_command(self, command: list[str] | str) -> _FakeContainer:
        self.command = command
        return self

    def with_volume_mapping(self, host: str, container: str, mode: str = "ro") -> _FakeContainer:
        self.volumes.append((host, container, mode))
        return self

    def waiting_for(self, strategy: object) -> _FakeContainer:
        self.waits = True
        return self

    def with_kwargs(self, **kwargs: Any) -> _FakeContainer:
        self.kwargs = kwargs
        return self

    def start(self) -> _FakeContainer:
        self.log.append(f"start {self.aliases[0]}")
        return self

    def wait(self) -> int:
        return self.exit_codes.get(self.aliases[0], 0)

    def get_logs(self) -> tuple[bytes, bytes]:
        return b"it went wrong\n", b""

    def stop(self) -> None:
        self.log.append(f"stop {self.aliases[0]}")


class _FakeNetwork:
    removed = False

    def create(self) -> _FakeNetwork:
        return self

    def remove(self) -> None:
        _FakeNetwork.removed = True


class _FakeImage:
    """Records what the starter asks of testcontainers' DockerImage; ``failing`` makes the build raise."""

    failing = False
    built: list[tuple[str, str | None, str, bool]] = []  # noqa: RUF012 - per-test state, reset by the fixture

    def __init__(self, path: str, tag: str | None = None, dockerfile_path: str = "Dockerfile", clean_up: bool = True):
        self.args = (path, tag, dockerfile_path, clean_up)

    def build(self) -> _FakeImage:
        if self.failing:
            raise RuntimeError("COPY failed: no source files were specified")
        self.built.append(self.args)
        _FakeContainer.log.append(f"build {self.args[1]}")
        return self


class _FakeHealthWait:
    def with_startup_timeout(self, timeout: int) -> _FakeHealthWait:
        return self


@pytest.fixture
def fake_testcontainers(monkeypatch: pytest.MonkeyPatch) -> list[_FakeContainer]:
    made: list[_FakeContainer] = []

    def factory(image: str) -> _FakeContainer:
        made.append(_FakeContainer(image))
        return made[-1]

    attrs: dict[str, dict[str, object]] = {
        "testcontainers": {},
        "testcontainers.core": {},
        "testcontainers.core.container": {"DockerContainer": factory},
        "testcontainers.core.network": {"Network": _FakeNetwork},
        "testcontainers.core.image": {"DockerImage": _FakeImage},
        "testcontainers.core.wait_strategies": {"HealthcheckWaitStrategy": _FakeHealthWait},
    }
    for name, members in attrs.items():
        module = ModuleType(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        for key, value in members.items():
            setattr(module, key, value)
        monkeypatch.setitem(sys.modules, name, module)
    _FakeContainer.exit_codes = {}
    _FakeContainer.log = []
    _FakeNetwork.removed = False
    _FakeImage.failing = False
    _FakeImage.built = []
    return made


def test_starter_builds_containers_from_the_compose_file(
    fake_testcontainers: list[_FakeContainer], services: dict[str, dict[str, Any]], stackctl: ModuleType
) -> None:
    with containers.ComposeStack(COMPOSE_FILE) as env:
        assert env["FLOTILLA_KAFKA_BOOTSTRAP"] == f"127.0.0.1:{stackctl.PORTS['kafka']}"
        by_alias = {c.aliases[0]: c for c in fake_testcontainers}
        assert set(by_alias) == set(INFRA) | set(INIT_JOBS)
        # This stack's registrar: given to registry-auth-init as compose's .env variable, and
        # to host clients as a private file.
        registrar = Path(env["FLOTILLA_SCHEMA_REGISTRY_AUTH_FILE"])
        assert registrar.stat().st_mode & 0o777 == 0o600
        auth_init = by_alias["registry-auth-init"]
        assert auth_init.env == {"FLOTILLA_SCHEMA_REGISTRY_AUTH": registrar.read_text().strip()}
        assert auth_init.kwargs["user"] == "0:0"
        # Named volumes: Docker volumes of this stack, shared by name between its containers.
        [(users_volume, users_path, users_mode)] = by_alias["schema-registry"].volumes
        assert users_volume.startswith("flotilla-it-") and users_volume.endswith("-registry-users")
        assert users_mode == "ro" and (users_volume, users_path, "rw") in auth_init.volumes
        assert len({id(c.network) for c in fake_testcontainers}) == 1  # one network for all
        for name, c in by_alias.items():
            svc = services[name]
            assert c.image == svc["image"]
            if name in INIT_JOBS:
                assert not c.waits and "healthcheck" not in c.kwargs
                assert c.kwargs["entrypoint"] == svc["entrypoint"]
            else:
                assert c.waits and c.kwargs["healthcheck"]["test"] == svc["healthcheck"]["test"]
        pg = by_alias["postgres"]
        assert pg.ports == {"5432/tcp": ("127.0.0.1", stackctl.PORTS["postgres"])}
        assert pg.volumes == [(str(INIT_SQL.parent), "/docker-entrypoint-initdb.d", "ro")]
        assert by_alias["connect"].env["FLOTILLA_PG_HOST"] == "postgres"
    started = [e.split()[1] for e in _FakeContainer.log if e.startswith("start ")]
    stopped = [e.split()[1] for e in _FakeContainer.log if e.startswith("stop ")]
    assert len(started) == len(INFRA) + len(INIT_JOBS) and stopped == list(reversed(started))
    assert _FakeNetwork.removed
    assert not registrar.exists()  # removed with the stack
    # Images with a build (Connect: Debezium + our transforms; the fleet's, for
    # registry-auth-init) are built once each, under their compose names, before anything starts.
    connect, fleet_image = services["connect"], services["registry-auth-init"]
    assert sorted(_FakeImage.built) == sorted(
        [
            (str(TRANSFORMS_DIR), connect["image"], "Dockerfile", False),
            (str(REPO_ROOT), fleet_image["image"], "Dockerfile", False),
        ]
    )
    assert _FakeContainer.log[:2] == [f"build {image}" for _, image, _, _ in _FakeImage.built]


def test_starter_fails_before_any_start_when_a_build_fails(fake_testcontainers: list[_FakeContainer]) -> None:
    _FakeImage.failing = True
    failed = r"(connect|registry-auth-init): building flotilla/.* failed: COPY failed"
    with pytest.raises(containers.StackStartError, match=failed):
        containers.ComposeStack(COMPOSE_FILE).start()
    assert fake_testcontainers == [] and _FakeContainer.log == []


def test_starter_fails_loudly_and_cleans_up_when_an_init_job_fails(
    fake_testcontainers: list[_FakeContainer],
) -> None:
    _FakeContainer.exit_codes = {"kafka-init": 1}
    stack = containers.ComposeStack(COMPOSE_FILE)
    with pytest.raises(containers.StackStartError, match="kafka-init exited 1") as err:
        stack.start()
    assert "it went wrong" in str(err.value)
    started = [e.split()[1] for e in _FakeContainer.log if e.startswith("start ")]
    stopped = [e.split()[1] for e in _FakeContainer.log if e.startswith("stop ")]
    assert stopped == list(reversed(started)) and "connect-init" not in started
    assert _FakeNetwork.removed


# ------------------------------------------------------------ signed facts' keys

KEYS_INIT = "keys-init"
PUBLISHERS = tuple(m.name for m in fleet.AGENTS)  # every member with an outbox signs what it emits
# Members whose fact key is the key they already sign something else with (fleetctl does the same).
SHARED_SIGNING_KEYS = {
    fleet.POLICY.name: "FLOTILLA_AUTHORIZATION_SIGNING_KEY_FILE",
    fleet.REMEDIATION.name: "FLOTILLA_PROPOSAL_SIGNING_KEY_FILE",
    fleet.AUDIT.name: "FLOTILLA_AUDIT_SIGNING_KEY_FILE",
}


def _named_mounts(compose: dict[str, Any], service: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """named volume -> (mount point, read-only) of one service (bind mounts left out)."""
    found = {}
    for mount in service.get("volumes", []):
        volume, target, *mode = mount.split(":")
        if volume in (compose.get("volumes") or {}):
            found[volume] = (target, mode == ["ro"])
    return found


def _in_volume(compose: dict[str, Any], service: dict[str, Any], path: str) -> tuple[str, str]:
    """(volume, path inside it) of a file a service sees; fails if no named volume holds it."""
    for volume, (target, _) in _named_mounts(compose, service).items():
        if path.startswith(target.rstrip("/") + "/"):
            return volume, path[len(target.rstrip("/")) + 1 :]
    raise AssertionError(f"{path} is on no named volume of the service")


def _generated_keys(compose: dict[str, Any]) -> dict[tuple[str, str], tuple[str, str]]:
    """What keys-init writes: (volume, file) of each private key -> (volume, file) of its
    public key, from each `python -m flotilla.keys generate PRIVATE --public PUBLIC`."""
    keys_init = compose["services"][KEYS_INIT]
    command = keys_init["command"]
    assert command[:2] == ["sh", "-c"] and len(command) == 3, command
    generated = {}
    for step in command[2].split("&&"):
        argv = shlex.split(step)
        if argv[:4] != ["python", "-m", "flotilla.keys", "generate"]:
            continue
        private, public = argv[4], _opt(argv, "--public")
        generated[_in_volume(compose, keys_init, private)] = _in_volume(compose, keys_init, public)
    return generated


def _producer_keys(service: dict[str, Any]) -> dict[str, list[str]]:
    entries = json.loads(service["environment"]["FLOTILLA_PRODUCER_KEYS"])
    assert isinstance(entries, dict)
    return entries


def test_every_publishing_member_signs_its_facts_with_a_key_of_its_own(compose: dict[str, Any]) -> None:
    services, generated = compose["services"], _generated_keys(compose)
    key_volumes = {}
    for name in PUBLISHERS:
        env = services[name]["environment"]
        key = env.get("FLOTILLA_SIGNING_KEY_FILE")
        assert key, f"{name} publishes, so it signs what it publishes: FLOTILLA_SIGNING_KEY_FILE"
        where = _in_volume(compose, services[name], key)
        assert where in generated, f"{name}: keys-init makes no key at {key}"
        assert _named_mounts(compose, services[name])[where[0]][1], f"{name} mounts its key read-write"
        if name in SHARED_SIGNING_KEYS:
            assert env[SHARED_SIGNING_KEYS[name]] == key, f"{name}: one key for its facts and its signatures"
        assert services[name]["depends_on"][KEYS_INIT] == {"condition": "service_completed_successfully"}, name
        key_volumes[name] = where[0]
    assert len(set(key_volumes.values())) == len(PUBLISHERS), f"a key volume is shared: {key_volumes}"


def test_every_member_trusts_each_producer_by_the_key_it_signs_with(compose: dict[str, Any]) -> None:
    """FLOTILLA_PRODUCER_KEYS names every producer of flotilla.provenance, each by the public
    key keys-init writes beside that producer's private key, on a volume the member mounts."""
    services, generated = compose["services"], _generated_keys(compose)
    producers = set().union(*PRODUCERS.values())
    assert producers == set(PUBLISHERS)
    for name in PUBLISHERS:
        entries = _producer_keys(services[name])
        assert set(entries) == producers, f"{name} trusts {sorted(entries)}"
        for producer, paths in entries.items():
            signer_key = _in_volume(
                compose, services[producer], services[producer]["environment"]["FLOTILLA_SIGNING_KEY_FILE"]
            )
            assert [_in_volume(compose, services[name], path) for path in paths] == [generated[signer_key]], (
                f"{name} does not trust {producer} by the key {producer} signs with"
            )
            for path in paths:
                volume, _ = _in_volume(compose, services[name], path)
                assert _named_mounts(compose, services[name])[volume][1], f"{name}: {volume} is writable"


def test_no_member_mounts_another_members_private_key(compose: dict[str, Any]) -> None:
    services, generated = compose["services"], _generated_keys(compose)
    private_volumes = {volume for volume, _ in generated}
    public_volumes = {volume for volume, _ in generated.values()}
    assert not private_volumes & public_volumes, "a private key beside the public ones that everyone mounts"
    for name, service in services.items():
        if name == KEYS_INIT:
            continue
        held = set(_named_mounts(compose, service)) & private_volumes
        if name in PUBLISHERS:
            own = _in_volume(compose, service, service["environment"]["FLOTILLA_SIGNING_KEY_FILE"])[0]
            assert held == {own}, f"{name} mounts the private keys of {sorted(held - {own})}"
        else:
            assert not held, f"{name} mounts private keys: {sorted(held)}"


def test_the_keys_keys_init_writes_let_each_member_sign_and_every_member_believe_it(
    compose: dict[str, Any], tmp_path: Path
) -> None:
    """keys-init's steps run for real (a folder standing for each volume), then each member's
    signer and trusted producers built from its compose settings as the runtime builds them."""
    from flotilla import keys
    from flotilla.runner import fact_provenance, fact_signer
    from flotilla.settings import ServiceSettings

    services = compose["services"]

    def local(service: dict[str, Any], path: str) -> str:
        volume, inside = _in_volume(compose, service, path)
        return str(tmp_path / volume / inside)

    for (volume, private), (pub_volume, public) in _generated_keys(compose).items():
        argv = ["generate", str(tmp_path / volume / private), "--public", str(tmp_path / pub_volume / public)]
        assert keys.main(argv) == 0
    signers, trust = {}, {}
    for name in PUBLISHERS:
        service = services[name]
        settings = ServiceSettings(
            _env_file=None,  # type: ignore[call-arg]
            signing_key_file=Path(local(service, service["environment"]["FLOTILLA_SIGNING_KEY_FILE"])),
            producer_keys={p: [local(service, e) for e in es] for p, es in _producer_keys(service).items()},
        )
        signers[name], trust[name] = fact_signer(settings), fact_provenance(settings)
    assert len({s.key_id for s in signers.values()}) == len(PUBLISHERS)  # seven different keys
    assert_each_signs_and_all_believe(signers, trust)


# --------------------------------------------------------------- docker engine


def test_docker_available_is_false_quickly_when_no_engine_answers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'no-engine.sock'}")
    monkeypatch.delenv("DOCKER_CONTEXT", raising=False)
    t0 = time.monotonic()
    assert containers.docker_available(timeout=2) is False
    monkeypatch.setitem(sys.modules, "docker", None)  # the SDK absent: the CLI path answers
    assert containers.docker_available(timeout=2) is False
    monkeypatch.setenv("PATH", str(tmp_path))  # no docker CLI either
    assert containers.docker_available(timeout=2) is False
    assert time.monotonic() - t0 < 10


def _compose_plugin() -> bool:
    try:
        proc = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


def test_docker_compose_config_accepts_the_file() -> None:
    if not _compose_plugin():
        pytest.skip("the docker compose plugin is not installed")
    proc = subprocess.run(
        ["docker", "compose", "-f", str(COMPOSE_FILE), "config", "-q"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
