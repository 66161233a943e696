"""The fleet part of docker-compose.yml, the Dockerfile and the observability configs,
checked against the code they run: libs/flotilla/fleet.py, each service's settings class,
flotilla.provision, infra/local/demo.py and the pyproject package data.

No Docker engine runs here, so nothing is built or started: the files are read and
compared with the Python that will read the variables they set.
"""

from __future__ import annotations

import fnmatch
import http.server
import importlib
import inspect
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic_settings import BaseSettings

from flotilla import fleet, tracing
from flotilla.fleet import Member
from flotilla.settings import ServiceSettings, StackSettings
from tests.support import containers

from .dockerfiles import Stage, stages

REPO_ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO_ROOT / "docker-compose.yml"
DOCKERFILE = REPO_ROOT / "Dockerfile"
DOCKERIGNORE = REPO_ROOT / ".dockerignore"
DEMO = REPO_ROOT / "infra" / "local" / "demo.py"
DEMO_ENV = REPO_ROOT / "infra" / "compose" / "demo.env"
# What compose sets on every member for traces (x-flotilla-env), besides its FLOTILLA_* settings.
TRACING_ENV = ("OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT")
OBSERVABILITY = REPO_ROOT / "infra" / "observability"
PROMETHEUS_CONFIG = OBSERVABILITY / "prometheus" / "prometheus.yml"
PROMETHEUS_RULES = OBSERVABILITY / "prometheus" / "rules"
ALERTMANAGER_CONFIG = OBSERVABILITY / "alertmanager" / "alertmanager.yml"
LOCAL_ALERTMANAGER_TEMPLATE = REPO_ROOT / "infra" / "local" / "alertmanager.yml.template"
GRAFANA = OBSERVABILITY / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "flotilla.json"

IMAGE = "flotilla/flotilla:0.1.0"
MEMBERS: dict[str, Member] = {m.name: m for m in fleet.FLEET}
INIT = "fleet-init"
KEYS_INIT = "keys-init"
DEMO_JOB = "incident"
OBSERVERS = ("prometheus", "alertmanager", "grafana", "jaeger")
STACK_KEYS = {f"FLOTILLA_{name.upper()}" for name in StackSettings.model_fields}
INTERPOLATION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(:?[-?])?([^}]*)\}")


# ------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def services() -> dict[str, dict[str, Any]]:
    doc = yaml.safe_load(COMPOSE_FILE.read_text())
    svc = doc["services"]
    assert isinstance(svc, dict)
    return svc


def resolved(value: object, given: dict[str, str] | None = None) -> str:
    """A compose value as `docker compose up` sees it with the variables ``given`` (an .env);
    without them, defaults applied."""

    def default(match: re.Match[str]) -> str:
        assert match.group(2) == ":-", f"${{{match.group(1)}}} has no default: plain `docker compose up` would fail"
        return (given or {}).get(match.group(1)) or match.group(3)

    return INTERPOLATION.sub(default, str(value))


def env_of(service: dict[str, Any], given: dict[str, str] | None = None) -> dict[str, str]:
    return {k: resolved(v, given) for k, v in (service.get("environment") or {}).items()}


def settings_class(member: Member) -> type[ServiceSettings]:
    """The ServiceSettings subclass declared in ``<module>.settings``."""
    module = importlib.import_module(f"{member.module}.settings")
    found = [
        cls
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if issubclass(cls, ServiceSettings) and cls.__module__ == module.__name__
    ]
    assert len(found) == 1, f"{member.module}.settings declares {found}"
    return found[0]


def env_names(cls: type[BaseSettings]) -> set[str]:
    return {f"FLOTILLA_{name.upper()}" for name in cls.model_fields}


def listen_port(member: Member, env: dict[str, str]) -> int:
    key = "FLOTILLA_SIM_PORT" if member is fleet.SIM else "FLOTILLA_HTTP_PORT"
    return int(env[key])


def ready_path(member: Member) -> str:
    # The sim has nothing to be ready for and serves /healthz only (as fleetctl checks it).
    return "/healthz" if member is fleet.SIM else "/readyz"


def internal_port(service: dict[str, Any]) -> int:
    return containers._port(service["ports"][0]).container_port


# ------------------------------------------------------------------ structure


def test_compose_runs_the_stack_the_fleet_the_demo_and_observability(services: dict[str, dict[str, Any]]) -> None:
    expected = (
        set(containers.SETUP_SERVICES)
        | set(containers.INFRA_SERVICES)
        | set(containers.INIT_SERVICES)
        | {INIT, KEYS_INIT, DEMO_JOB, *OBSERVERS}
        | set(MEMBERS)
    )
    assert set(services) == expected


@pytest.mark.parametrize("name", list(MEMBERS))
def test_every_member_runs_its_module_from_the_one_image(services: dict[str, dict[str, Any]], name: str) -> None:
    svc = services[name]
    assert svc["image"] == IMAGE
    assert svc["build"] == "."
    assert svc["pull_policy"] == "build"  # never pulled: someone else may own the name on a registry
    assert svc["command"] == ["python", "-m", MEMBERS[name].module]
    assert svc["restart"] == "unless-stopped"


def test_the_jobs_use_the_image_too_and_run_once(services: dict[str, dict[str, Any]]) -> None:
    for name in (INIT, KEYS_INIT, DEMO_JOB):
        assert services[name]["image"] == IMAGE and services[name]["pull_policy"] == "build"
        assert services[name]["restart"] == "no"
        assert "ports" not in services[name] and "healthcheck" not in services[name]


@pytest.mark.parametrize("name", list(MEMBERS))
def test_ports_are_the_fleet_table_on_loopback(services: dict[str, dict[str, Any]], name: str) -> None:
    member = MEMBERS[name]
    env = env_of(services[name])
    [binding] = [containers._port(p) for p in services[name]["ports"]]
    assert (binding.host_ip, binding.host_port, binding.container_port) == (
        "127.0.0.1",
        member.http_port,
        member.http_port,
    )
    assert listen_port(member, env) == member.http_port
    host_key = "FLOTILLA_SIM_HOST" if member is fleet.SIM else "FLOTILLA_HTTP_HOST"
    assert env[host_key] == "0.0.0.0"  # reachable from the other containers and the published port


@pytest.mark.parametrize("name", list(MEMBERS))
def test_healthchecks_ask_the_member_itself_with_python(services: dict[str, dict[str, Any]], name: str) -> None:
    member = MEMBERS[name]
    check = services[name]["healthcheck"]
    test = check["test"]
    assert test[:3] == ["CMD", "python", "-c"] and len(test) == 4  # the slim image has no curl
    compile(test[3], f"{name} healthcheck", "exec")
    assert f"'http://127.0.0.1:{member.http_port}{ready_path(member)}'" in test[3]
    containers.parse_duration(check["interval"])
    containers.parse_duration(check["timeout"])
    assert int(check["retries"]) >= 3


class _Answer(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def answering() -> Iterator[tuple[int, type[_Answer]]]:
    handler = type("Handler", (_Answer,), {})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1], handler
    finally:
        server.shutdown()


@pytest.mark.parametrize(("status", "exit_ok"), [(200, True), (503, False)])
def test_the_healthcheck_command_fails_on_not_ready(
    services: dict[str, dict[str, Any]], answering: tuple[int, type[_Answer]], status: int, exit_ok: bool
) -> None:
    port, handler = answering
    handler.status = status
    code = services["executor"]["healthcheck"]["test"][3].replace(str(fleet.EXECUTOR.http_port), str(port))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=30)
    assert (proc.returncode == 0) is exit_ok


def test_members_wait_for_what_they_need(services: dict[str, dict[str, Any]]) -> None:
    for name, member in MEMBERS.items():
        deps = services[name].get("depends_on", {})
        env = env_of(services[name])
        if member.database:
            assert deps[INIT]["condition"] == "service_completed_successfully", name
        if "FLOTILLA_SIM_URL" in env:
            assert deps["sim"]["condition"] == "service_healthy", name
        for url in (v for k, v in env.items() if k.endswith("_URL") and "://" in v):
            host = url.split("://", 1)[1].split(":", 1)[0].split("/", 1)[0]
            if host in MEMBERS:
                assert deps[host]["condition"] == "service_healthy", f"{name} calls {host} without waiting for it"
    init_deps = services[INIT]["depends_on"]
    assert {d: c["condition"] for d, c in init_deps.items()} == {
        "postgres": "service_healthy",
        "connect": "service_healthy",
        "kafka-init": "service_completed_successfully",  # topics exist before connectors route to them
        "registry-init": "service_completed_successfully",  # compatibility set before contracts
    }
    demo_deps = services[DEMO_JOB]["depends_on"]
    assert set(demo_deps) == {n for n, m in MEMBERS.items() if m is not fleet.CONSOLE}
    assert {c["condition"] for c in demo_deps.values()} == {"service_healthy"}


# ------------------------------------------------------------------ settings


@pytest.mark.parametrize("name", list(MEMBERS))
def test_every_variable_set_is_a_setting_of_that_service(services: dict[str, dict[str, Any]], name: str) -> None:
    cls = settings_class(MEMBERS[name])
    flotilla_keys = {k for k in env_of(services[name]) if k.startswith("FLOTILLA_")}
    unread = flotilla_keys - env_names(cls)
    assert not unread, f"{name} sets {sorted(unread)}, which {cls.__name__} does not read"
    # nothing else is set on a member but, where a consumer loop runs, OpenTelemetry's
    # exporter settings (flotilla.tracing; the sim and the console make no spans)
    traced = set(TRACING_ENV) if MEMBERS[name].database else set()
    assert set(env_of(services[name])) - flotilla_keys == traced, name
    if not traced:
        return
    assert env_of(services[name])["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://jaeger:4318"
    assert "4318" not in str(services["jaeger"].get("ports", []))  # OTLP stays inside compose
    (exporter,) = tracing.exporters_from_env({k: env_of(services[name])[k] for k in TRACING_ENV})
    assert type(exporter).__name__ == "OTLPSpanExporter"


@pytest.mark.parametrize("name", [m.name for m in fleet.FLEET if m.database])
def test_services_with_a_database_find_the_stack(services: dict[str, dict[str, Any]], name: str) -> None:
    env = env_of(services[name])
    pg = services["postgres"]
    assert env["FLOTILLA_KAFKA_BOOTSTRAP"] == "kafka:9092"
    advertised = env_of(services["kafka"])["KAFKA_ADVERTISED_LISTENERS"]
    assert "INTERNAL://kafka:9092" in advertised.split(",")
    assert env["FLOTILLA_SCHEMA_REGISTRY_URL"] == (
        f"http://schema-registry:{internal_port(services['schema-registry'])}/apis/ccompat/v7"
    )
    assert env["FLOTILLA_CONNECT_URL"] == f"http://connect:{internal_port(services['connect'])}"
    assert env["FLOTILLA_PG_HOST"] == "postgres"
    assert env["FLOTILLA_PG_PORT"] == str(internal_port(pg))
    assert env["FLOTILLA_PG_USER"] == pg["environment"]["POSTGRES_USER"]
    assert env["FLOTILLA_PG_PASSWORD"] == pg["environment"]["POSTGRES_PASSWORD"]
    # Connect resolves the connectors' ${env:FLOTILLA_PG_*} with the same values.
    connect = env_of(services["connect"])
    for key in ("FLOTILLA_PG_HOST", "FLOTILLA_PG_PORT", "FLOTILLA_PG_USER", "FLOTILLA_PG_PASSWORD"):
        assert connect[key] == env[key]


@pytest.mark.parametrize("name", list(MEMBERS))
def test_no_loopback_default_is_left_inside_a_container(services: dict[str, dict[str, Any]], name: str) -> None:
    """A setting of the service's own whose default is 127.0.0.1 must be set, to a compose name."""
    cls = settings_class(MEMBERS[name])
    env = env_of(services[name])
    own = {n: f for n, f in cls.model_fields.items() if n not in ServiceSettings.model_fields or n == "http_host"}
    if MEMBERS[name] is fleet.SIM:
        own.pop("http_host")  # the sim listens on FLOTILLA_SIM_HOST
    for field_name, info in own.items():
        if isinstance(info.default, str) and ("127.0.0.1" in info.default or "localhost" in info.default):
            key = f"FLOTILLA_{field_name.upper()}"
            assert key in env, f"{name}: {key} would stay {info.default!r}"
            assert "127.0.0.1" not in env[key] and "localhost" not in env[key], key
    for key, url in env.items():
        if key.endswith("_URL") and "://" in url:
            host, _, port = url.split("://", 1)[1].partition(":")
            assert host in services, f"{name}: {key}={url} names no compose service"
            if host in MEMBERS:
                assert int(port) == MEMBERS[host].http_port, f"{name}: {key}={url}"


@pytest.mark.parametrize("name", list(MEMBERS))
def test_the_settings_load_from_that_environment(
    services: dict[str, dict[str, Any]], name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Parsing, not just naming: the values as compose passes them are valid settings."""
    for key in [k for k in os.environ if k.startswith("FLOTILLA_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("FLOTILLA_ENV_FILE", str(tmp_path / "absent.env"))
    env = {k: v for k, v in env_of(services[name]).items() if k.startswith("FLOTILLA_")}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = settings_class(MEMBERS[name])()
    for key, value in env.items():
        field = key.removeprefix("FLOTILLA_").lower()
        got = getattr(settings, field)
        shown = got.get_secret_value() if hasattr(got, "get_secret_value") else got
        if isinstance(shown, str | int | float | bool | Path):
            assert str(shown) == value or str(shown).lower() == value.lower(), key


def _load_member_settings(
    services: dict[str, dict[str, Any]], name: str, given: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> Any:
    """The member's settings as compose starts it with the .env variables ``given``."""
    for key in [k for k in os.environ if k.startswith("FLOTILLA_")]:
        monkeypatch.delenv(key)
    for key, value in env_of(services[name], given).items():
        monkeypatch.setenv(key, value)
    return settings_class(MEMBERS[name])()


def test_compose_is_the_demo_profile_and_its_demo_credentials_need_it(
    services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from flotilla.settings import MissingCredentials
    from services.dlq_reconciler.settings import DEMO_OPERATOR_TOKEN

    monkeypatch.setenv("FLOTILLA_ENV_FILE", str(tmp_path / "absent.env"))
    for name, member in MEMBERS.items():
        if member.database:
            assert env_of(services[name])["FLOTILLA_PROFILE"] == "demo", name
    # Without an .env: the demo users and the demo operator token, as the services' own fallback
    # (compose passes no credential of its own: nothing to keep in step).
    assert env_of(services["policy-service"])["FLOTILLA_POLICY_USERS"] == ""
    assert env_of(services["dlq-reconciler"])["FLOTILLA_OPERATOR_TOKENS"] == ""
    store, demo = _load_member_settings(services, "policy-service", {}, monkeypatch).token_store()
    assert demo and store.authenticate("alice-token") is not None
    operators, demo = _load_member_settings(services, "dlq-reconciler", {}, monkeypatch).operators()
    assert demo and operators.authenticate(f"Bearer {DEMO_OPERATOR_TOKEN}") is not None
    # FLOTILLA_PROFILE=production in .env, credentials forgotten: the services refuse to start.
    production = {"FLOTILLA_PROFILE": "production"}
    with pytest.raises(MissingCredentials, match="FLOTILLA_POLICY_USERS"):
        _load_member_settings(services, "policy-service", production, monkeypatch).token_store()
    with pytest.raises(MissingCredentials, match="FLOTILLA_OPERATOR_TOKENS"):
        _load_member_settings(services, "dlq-reconciler", production, monkeypatch).operators()
    # The console keeps its sessions in memory: no (fixed, public) session secret anywhere.
    assert not [k for k in env_of(services["console"]) if "SECRET" in k]
    assert "FLOTILLA_CONSOLE_SESSION_SECRET" not in COMPOSE_FILE.read_text() + DEMO_ENV.read_text()


def test_only_the_sim_and_the_executor_hold_the_action_token(services: dict[str, dict[str, Any]]) -> None:
    """No public default: keys-init writes the token (FLOTILLA_SIM_ACTION_TOKEN from .env,
    else the one it made before, else a random one) into a volume that only the sim and the
    executor mount, read-only, and both read that one file."""
    key, file_key = "FLOTILLA_SIM_ACTION_TOKEN", "FLOTILLA_SIM_ACTION_TOKEN_FILE"
    sim, executor = fleet.SIM.name, fleet.EXECUTOR.name
    # The token itself is in no member's environment; keys-init gets the .env variable, no default.
    assert {n for n, svc in services.items() if key in (svc.get("environment") or {})} == {KEYS_INIT}
    interpolated = INTERPOLATION.fullmatch(str(services[KEYS_INIT]["environment"][key]))
    assert interpolated is not None and interpolated.groups() == (key, ":-", "")
    readers = {n: env_of(svc)[file_key] for n, svc in services.items() if file_key in env_of(svc)}
    assert set(readers) == {sim, executor}
    [path] = set(readers.values())  # one file: the two can never disagree
    assert f"python -m services.sim.token_file {path}" in " ".join(services[KEYS_INIT]["command"])
    assert {n for n, svc in services.items() if "sim-token" in _mounts(svc)} == {KEYS_INIT, sim, executor}
    for name in (sim, executor):
        target, read_only = _mounts(services[name])["sim-token"]
        assert Path(path).parent == Path(target) and read_only, name
        assert services[name]["depends_on"][KEYS_INIT] == {"condition": "service_completed_successfully"}, name
    assert _mounts(services[KEYS_INIT])["sim-token"] == (str(Path(path).parent), False)
    assert str(Path(path).parent) in DOCKERFILE.read_text()  # the image makes it for its user
    assert [line for line in DEMO_ENV.read_text().splitlines() if line.startswith(f"{key}=")] == [f"{key}="]
    assert "demo-only-sim-action-token" not in COMPOSE_FILE.read_text() + DEMO_ENV.read_text()


@pytest.mark.parametrize("given", [None, "an-operators-own-token-0123456789"])
def test_the_sim_and_the_executor_read_the_token_keys_init_writes(
    services: dict[str, dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    given: str | None,
) -> None:
    """keys-init's step run for real (into a folder standing for the volume), then the two
    members' settings loaded from their compose environment: the same usable token."""
    from services.executor.targets import SimTarget
    from services.sim import token_file
    from services.sim.auth import check_action_token

    [path] = {env_of(services[n])["FLOTILLA_SIM_ACTION_TOKEN_FILE"] for n in ("sim", "executor")}
    volume = tmp_path / "sim-token"
    local = volume / Path(path).name
    monkeypatch.setenv("FLOTILLA_ENV_FILE", str(tmp_path / "absent.env"))
    for key in [k for k in os.environ if k.startswith("FLOTILLA_")]:
        if key != "FLOTILLA_ENV_FILE":
            monkeypatch.delenv(key)
    if given is not None:
        monkeypatch.setenv("FLOTILLA_SIM_ACTION_TOKEN", given)
    assert token_file.main([str(local)]) == 0
    monkeypatch.delenv("FLOTILLA_SIM_ACTION_TOKEN", raising=False)
    assert local.stat().st_mode & 0o777 == 0o600
    tokens = []
    for name in ("sim", "executor"):
        env = {k: v for k, v in env_of(services[name]).items() if k.startswith("FLOTILLA_")}
        env["FLOTILLA_SIM_ACTION_TOKEN_FILE"] = str(local)
        with monkeypatch.context() as m:
            for key, value in env.items():
                m.setenv(key, value)
            settings = settings_class(MEMBERS[name])()
            if name == "sim":
                tokens.append(settings.action_token())
            else:
                target = settings.build_target()
                assert isinstance(target, SimTarget)
                tokens.append(settings.sim_token())
                target.close()
    assert tokens[0] == tokens[1] == check_action_token(str(tokens[0]))
    if given is not None:
        assert tokens[0] == given
    # Run again (every `docker compose up`): the token stays what the two members hold.
    assert token_file.main([str(local)]) == 0
    assert local.read_text().strip() == tokens[0]


def test_the_audit_key_lives_on_a_volume(services: dict[str, dict[str, Any]]) -> None:
    compose = yaml.safe_load(COMPOSE_FILE.read_text())
    key = Path(env_of(services["audit"])["FLOTILLA_AUDIT_SIGNING_KEY_FILE"])
    target, read_only = _mounts(services["audit"])["audit-key"]
    assert "audit-key" in compose["volumes"] and key.parent == Path(target) and read_only  # keys-init made it
    # The image creates that folder for its user, so a fresh named volume is writable.
    assert str(key.parent) in DOCKERFILE.read_text()


def _mounts(service: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """volume -> (mount point, read-only) of one compose service."""
    found = {}
    for mount in service.get("volumes", []):
        volume, target, *mode = mount.split(":")
        found[volume] = (target, mode == ["ro"])
    return found


def test_each_signing_key_is_mounted_into_its_signer_alone(services: dict[str, dict[str, Any]]) -> None:
    """The policy service's key signs commands, the remediation agent's signs proposals;
    verifiers mount only the public keys (read-only), and every signer waits for keys-init."""
    holders: dict[str, set[str]] = {}
    for name, service in services.items():
        for volume, (_, read_only) in _mounts(service).items():
            holders.setdefault(volume, set()).add(name)
            if name != KEYS_INIT and volume.endswith("-key"):
                assert read_only, (name, volume)
    assert holders["authorization-key"] == {KEYS_INIT, "policy-service"}
    assert holders["proposal-key"] == {KEYS_INIT, "remediation-agent"}
    assert holders["audit-key"] == {KEYS_INIT, "audit"}
    # every publishing member checks each producer's signature (FLOTILLA_PRODUCER_KEYS)
    assert holders["public-keys"] == {KEYS_INIT, *(m.name for m in fleet.AGENTS)}
    for name, setting in (
        ("policy-service", "FLOTILLA_AUTHORIZATION_SIGNING_KEY_FILE"),
        ("remediation-agent", "FLOTILLA_PROPOSAL_SIGNING_KEY_FILE"),
    ):
        key = Path(env_of(services[name])[setting])
        assert str(key.parent) in {target for target, _ in _mounts(services[name]).values()}, name
        assert str(key.parent) in DOCKERFILE.read_text()  # the image makes it for its user
    for name, setting in (
        ("executor", "FLOTILLA_AUTHORIZATION_PUBLIC_KEYS"),
        ("dlq-reconciler", "FLOTILLA_AUTHORIZATION_PUBLIC_KEYS"),
        ("policy-service", "FLOTILLA_PROPOSAL_PUBLIC_KEYS"),
        ("audit", "FLOTILLA_AUDIT_PUBLIC_KEYS"),
    ):
        [path] = json.loads(env_of(services[name])[setting])
        assert Path(path).parent == Path(_mounts(services[name])["public-keys"][0]), name
        assert path in " ".join(services[KEYS_INIT]["command"])  # keys-init writes exactly that file
    for name in ("policy-service", "remediation-agent", "executor", "dlq-reconciler", "audit"):
        assert services[name]["depends_on"][KEYS_INIT] == {"condition": "service_completed_successfully"}


def test_every_interpolated_variable_has_a_default_and_is_documented() -> None:
    def strings(node: object) -> Iterator[str]:  # the values compose interpolates (not comments)
        if isinstance(node, dict):
            for value in node.values():
                yield from strings(value)
        elif isinstance(node, list):
            for value in node:
                yield from strings(value)
        elif isinstance(node, str):
            yield node

    text = "\n".join(strings(yaml.safe_load(COMPOSE_FILE.read_text())))
    documented = {
        line.split("=", 1)[0].lstrip("# ").strip()
        for line in DEMO_ENV.read_text().splitlines()
        if "=" in line and line.lstrip("# ")[:1].isupper()
    }
    found = INTERPOLATION.findall(text)
    assert found
    for name, operator, _ in found:
        assert operator == ":-", f"${{{name}}} has no default"
        assert name in documented, f"{name} is not described in {DEMO_ENV.relative_to(REPO_ROOT)}"


# --------------------------------------------------------------- fleet-init


def _provision_args(services: dict[str, dict[str, Any]]) -> tuple[list[str], list[str]]:
    argv = services[INIT]["command"]
    assert argv[:3] == ["python", "-m", "flotilla.provision"]
    outbox = [a.split("=", 1)[1].split("=", 1)[0] for a in argv[3:] if a.startswith("--outbox=")]
    plain = [a.split("=", 1)[1] for a in argv[3:] if a.startswith("--database=")]
    assert len(outbox) + len(plain) == len(argv) - 3, f"unexpected arguments in {argv}"
    return outbox, plain


def test_fleet_init_registers_each_connector_with_its_services_topics(services: dict[str, dict[str, Any]]) -> None:
    """The connector fleet-init registers and the one the service registers at start are
    one config (the allowlist included): otherwise each would rewrite the other's."""
    declared = {
        database: tuple(sorted(topics.split(",")))
        for database, topics in (
            a.removeprefix("--outbox=").split("=", 1) for a in services[INIT]["command"] if a.startswith("--outbox=")
        )
    }
    for member in fleet.FLEET:
        if member.database in declared:
            assert declared[member.database] == tuple(sorted(member.emits)), member.name


def _spec_publishes(member: Member) -> bool:
    service = importlib.import_module(f"{member.module}.service")
    build = getattr(service, "build_spec", None) or service.spec
    made = build()
    spec = made[0] if isinstance(made, tuple) else made
    assert spec.database == member.database
    return bool(spec.publishes)


@pytest.mark.usefixtures("signing_keys")
def test_fleet_init_prepares_every_database_as_its_service_will(
    services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("FLOTILLA_ENV_FILE", str(tmp_path / "absent.env"))
    monkeypatch.setenv("FLOTILLA_PROFILE", "demo")  # compose's: the specs build with the demo credentials
    outbox, plain = _provision_args(services)
    with_db = [m for m in fleet.FLEET if m.database]
    assert sorted(outbox + plain) == sorted(m.database for m in with_db if m.database)
    for member in with_db:
        expected = outbox if _spec_publishes(member) else plain
        assert member.database in expected, f"{member.name}: {member.database}"


# What only the jobs that write to the registry hold: the registrar's credentials.
REGISTRAR_KEYS = {"FLOTILLA_SCHEMA_REGISTRY_AUTH", "FLOTILLA_SCHEMA_REGISTRY_AUTH_FILE"}
REGISTRAR_VOLUME = "registrar"


def test_fleet_init_reads_only_stack_settings(services: dict[str, dict[str, Any]]) -> None:
    env = env_of(services[INIT])
    assert set(env) <= STACK_KEYS
    required = {"FLOTILLA_SCHEMA_REGISTRY_URL", "FLOTILLA_CONNECT_URL", "FLOTILLA_PG_HOST", "FLOTILLA_PG_PASSWORD"}
    assert required <= set(env)
    # the same stack the services see, but for the registrar's credentials: it registers
    for name, member in MEMBERS.items():
        if member.database:
            member_env = env_of(services[name])
            assert {k: member_env[k] for k in set(env) - REGISTRAR_KEYS} == {
                k: v for k, v in env.items() if k not in REGISTRAR_KEYS
            }, name


def test_only_the_jobs_that_write_to_the_registry_hold_the_registrar(services: dict[str, dict[str, Any]]) -> None:
    """fleet-init registers the contracts and registry-init sets the compatibility rule, as
    the registrar; the services only serialize and deserialize, anonymously."""
    creds = env_of(services[INIT])["FLOTILLA_SCHEMA_REGISTRY_AUTH_FILE"]
    assert f"{REGISTRAR_VOLUME}:{creds.rsplit('/', 1)[0]}:ro" in services[INIT]["volumes"]
    holders = {
        name
        for name, svc in services.items()
        if any(str(v).split(":")[0] == REGISTRAR_VOLUME for v in svc.get("volumes", []))
        or REGISTRAR_KEYS & set(env_of(svc))
    }
    assert holders == {"registry-auth-init", "registry-init", INIT}
    for name in holders - {"registry-auth-init"}:  # it makes them; the two others only read them
        assert f"{REGISTRAR_VOLUME}:/var/lib/flotilla/registrar:ro" in services[name]["volumes"], name


def test_provision_entry_point_takes_those_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    from flotilla import provision

    seen: dict[str, Any] = {}

    def fake(settings: StackSettings, **kwargs: Any) -> None:
        seen.update(kwargs)

    monkeypatch.setattr(provision, "provision", fake)
    assert provision.main(["--outbox=a=incidents", "--outbox=b=commands,incidents", "--database=c", "--timeout=5"]) == 0
    assert seen == {
        "outbox": {"a": ("incidents",), "b": ("commands", "incidents")},
        "databases": ["c"],
        "schemas": True,
        "timeout": 5.0,
    }
    with pytest.raises(SystemExit):  # a publishing database without its topics is refused
        provision.main(["--outbox=a"])


def test_provision_does_contracts_then_outboxes_then_databases(monkeypatch: pytest.MonkeyPatch) -> None:
    from flotilla import bootstrap, contracts, provision

    calls: list[str] = []
    monkeypatch.setattr(provision, "registrar_client", lambda settings: object())
    monkeypatch.setattr(contracts, "register_all", lambda client: calls.append("contracts") or {"s": 1})
    monkeypatch.setattr(
        bootstrap, "bootstrap_outbox", lambda s, db, topics, timeout: calls.append(f"outbox {db} {topics}") or db
    )
    failures = iter([ConnectionError("not yet")])

    def ensure(settings: StackSettings, db: str) -> None:
        failure = next(failures, None)
        if failure is not None:
            raise failure  # retried
        calls.append(f"database {db}")

    monkeypatch.setattr(bootstrap, "ensure_database", ensure)
    provision.provision(StackSettings(), outbox={"a": ("incidents",), "b": ()}, databases=["c"], timeout=5, pause=0.01)
    assert calls == ["contracts", "outbox a ('incidents',)", "outbox b ()", "database c"]


def test_provision_gives_up_at_once_on_an_incompatible_contract(monkeypatch: pytest.MonkeyPatch) -> None:
    from flotilla import contracts, provision

    attempts: list[int] = []

    def refuse(client: object) -> dict[str, int]:
        attempts.append(1)
        raise contracts.IncompatibleSchemaError("incidents-x: refused")

    monkeypatch.setattr(provision, "registrar_client", lambda settings: object())
    monkeypatch.setattr(contracts, "register_all", refuse)
    monkeypatch.setattr(provision, "load_settings", StackSettings)
    assert provision.main([]) == 1
    assert attempts == [1]


def test_provision_gives_up_at_once_when_the_registry_refuses_the_write(monkeypatch: pytest.MonkeyPatch) -> None:
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    from flotilla import contracts, provision
    from flotilla.registry import RegistrarRefused

    attempts: list[int] = []

    def refuse(client: object) -> dict[str, int]:
        attempts.append(1)
        raise SchemaRegistryError(401, 0, "User is not authenticated.")

    monkeypatch.setattr(provision, "registrar_client", lambda settings: object())
    monkeypatch.setattr(contracts, "register_all", refuse)
    with pytest.raises(RegistrarRefused, match="FLOTILLA_SCHEMA_REGISTRY_AUTH"):
        provision.provision(StackSettings(_env_file=None), timeout=5, pause=0.01)
    assert attempts == [1]  # not retried: the same credentials would be refused again


# ---------------------------------------------------------------- the demo job


def test_the_incident_job_is_the_local_demo_pointed_at_the_containers(services: dict[str, dict[str, Any]]) -> None:
    job = services[DEMO_JOB]
    assert job["command"] == ["python", "infra/local/demo.py"]
    env = env_of(job)
    source = DEMO.read_text()
    read_by_demo = set(re.findall(r"os\.environ\.get\(\"([A-Z_]+)\"", source))
    unread = set(env) - read_by_demo - STACK_KEYS
    assert not unread, f"the demo reads none of {sorted(unread)}"
    assert env["DEMO_AUTO_APPROVE"] == "1"
    assert env["FLOTILLA_KAFKA_BOOTSTRAP"] == "kafka:9092"
    assert env["FLOTILLA_SIM_URL"] == f"http://sim:{fleet.SIM.http_port}"
    assert env["FLOTILLA_POLICY_URL"] == f"http://policy-service:{fleet.POLICY.http_port}"
    assert env["FLOTILLA_AUDIT_URL"] == f"http://audit:{fleet.AUDIT.http_port}"
    from services.policy.auth import DEMO_USERS

    assert "approver" in DEMO_USERS[env["DEMO_APPROVER_TOKEN"]]["roles"]


# --------------------------------------------------------------- observability


def test_prometheus_scrapes_every_member(services: dict[str, dict[str, Any]]) -> None:
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    # the sim in a job of its own (the estate, scraped every second), the rest together
    jobs = [j for j in config["scrape_configs"] if j["job_name"] in ("flotilla", "estate")]
    assert all(j.get("metrics_path", "/metrics") == "/metrics" for j in jobs)
    targets = {t: g["labels"]["service"] for j in jobs for g in j["static_configs"] for t in g["targets"]}
    assert targets == {f"{m.name}:{m.http_port}": m.name for m in fleet.FLEET}
    [estate] = [j for j in jobs if j["job_name"] == "estate"]
    assert [t for g in estate["static_configs"] for t in g["targets"]] == [f"sim:{fleet.SIM.http_port}"]
    mounts = services["prometheus"]["volumes"]
    assert "./infra/observability/prometheus/prometheus.yml:/etc/prometheus/prometheus.yml:ro" in mounts
    assert "--config.file=/etc/prometheus/prometheus.yml" in services["prometheus"]["command"]


def test_grafana_is_provisioned_with_the_datasource_the_dashboard_names(services: dict[str, dict[str, Any]]) -> None:
    [source] = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text())["datasources"]
    assert source["type"] == "prometheus"
    assert source["url"] == f"http://prometheus:{internal_port(services['prometheus'])}"
    dashboard = json.loads(DASHBOARD.read_text())
    uids = set()
    for panel in dashboard["panels"]:
        for holder in [panel, *panel.get("targets", [])]:
            if "datasource" in holder:
                assert holder["datasource"]["type"] == "prometheus"
                uids.add(holder["datasource"]["uid"])
    assert uids == {source["uid"]}
    [provider] = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "flotilla.yml").read_text())["providers"]
    mounts = dict(m.rsplit(":", 2)[:2] for m in services["grafana"]["volumes"])
    assert mounts["./infra/observability/grafana/dashboards"] == provider["options"]["path"]
    assert mounts["./infra/observability/grafana/provisioning"] == "/etc/grafana/provisioning"
    home = env_of(services["grafana"])["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{provider['options']['path']}/{DASHBOARD.name}"


def test_observers_are_pinned_official_images_on_loopback(services: dict[str, dict[str, Any]]) -> None:
    assert services["prometheus"]["image"].startswith("prom/prometheus:v")
    assert services["alertmanager"]["image"] == "prom/alertmanager:v0.28.1"
    assert services["grafana"]["image"].startswith("grafana/grafana:")
    assert services["jaeger"]["image"].startswith("jaegertracing/jaeger:2.")  # v2: OTLP built in
    for name in OBSERVERS:
        # Jaeger has no healthcheck: nothing waits for it (spans that cannot be sent are
        # dropped by the exporters), and its image's tools were not verifiable from here.
        if name != "jaeger":
            assert services[name]["healthcheck"]["test"][0] == "CMD"
        assert all(containers._port(p).host_ip == "127.0.0.1" for p in services[name]["ports"])
    assert not any("jaeger" in svc.get("depends_on", {}) for svc in services.values())


def _bind_mounts(service: dict[str, Any]) -> dict[str, str]:
    """Container path -> host path of a service's read-only bind mounts."""
    found = {}
    for volume in service.get("volumes", []):
        host, container, mode = volume.rsplit(":", 2)
        assert mode == "ro", volume
        found[container] = host
    return found


def test_prometheus_loads_the_estate_rules_and_alerts_alertmanager(services: dict[str, dict[str, Any]]) -> None:
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    mounts = _bind_mounts(services["prometheus"])
    assert mounts["/etc/prometheus/rules"] == "./infra/observability/prometheus/rules"
    assert (REPO_ROOT / mounts["/etc/prometheus/rules"]).resolve() == PROMETHEUS_RULES
    # Every rule file pattern names the mounted folder, and together they find the estate's rules.
    loaded: set[Path] = set()
    for pattern in config["rule_files"]:
        assert pattern.startswith("/etc/prometheus/rules/"), pattern
        loaded |= set(PROMETHEUS_RULES.glob(pattern.removeprefix("/etc/prometheus/rules/")))
    assert PROMETHEUS_RULES / "estate.yml" in loaded
    [alertmanagers] = config["alerting"]["alertmanagers"]
    assert alertmanagers["static_configs"] == [{"targets": [f"alertmanager:{internal_port(services['alertmanager'])}"]}]


def test_alertmanager_runs_alone_from_its_mounted_config(services: dict[str, dict[str, Any]]) -> None:
    svc = services["alertmanager"]
    flags = dict(arg.split("=", 1) for arg in svc["command"])
    assert flags["--cluster.listen-address"] == ""  # clustering off: no gossip port
    assert _bind_mounts(svc)[flags["--config.file"]] == "./infra/observability/alertmanager/alertmanager.yml"
    assert (REPO_ROOT / _bind_mounts(svc)[flags["--config.file"]]).resolve() == ALERTMANAGER_CONFIG
    [binding] = [containers._port(p) for p in svc["ports"]]
    assert (binding.host_ip, binding.host_port, binding.container_port) == ("127.0.0.1", 19093, 9093)
    check = svc["healthcheck"]["test"]
    assert check == ["CMD", "wget", "-q", "-O", "/dev/null", f"http://127.0.0.1:{binding.container_port}/-/ready"]
    assert check[:-1] == services["prometheus"]["healthcheck"]["test"][:-1]  # the same probe as Prometheus'


def test_alertmanager_sends_every_alert_to_the_health_agent_with_the_secret_token(
    services: dict[str, dict[str, Any]],
) -> None:
    compose = yaml.safe_load(COMPOSE_FILE.read_text())
    config = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())
    route = config["route"]
    assert route == {
        "receiver": "flotilla-health-agent",
        "group_by": ["alertname", "service_name", "deployment_environment_name"],
        "group_wait": "5s",
        "group_interval": "10s",
        "repeat_interval": "5m",
    }
    [receiver] = config["receivers"]
    [hook] = receiver["webhook_configs"]
    assert receiver["name"] == route["receiver"]
    assert hook["url"] == f"http://health-agent:{fleet.HEALTH.http_port}/alerts"
    assert internal_port(services["health-agent"]) == fleet.HEALTH.http_port
    assert (hook["send_resolved"], hook["max_alerts"]) == (True, 0)
    secret = "alert-webhook-token"
    assert hook["http_config"] == {
        "authorization": {"type": "Bearer", "credentials_file": f"/run/secrets/{secret}"}
    }  # where compose mounts a secret listed by name
    # Alertmanager presents it; the health agent checks a digest of it, so nobody else holds the file.
    holders = {name for name, svc in services.items() if secret in svc.get("secrets", [])}
    assert holders == {"alertmanager"}
    source = REPO_ROOT / compose["secrets"][secret]["file"]
    assert source.is_file() and len(source.read_text().split()) == 1  # one token, nothing else


def test_the_compose_demo_token_is_the_one_the_demo_health_agent_accepts() -> None:
    bearer = pytest.importorskip("flotilla.bearer")
    if not hasattr(bearer, "DEMO_ALERT_TOKEN"):
        pytest.skip("flotilla.bearer names no demo alert token")
    compose = yaml.safe_load(COMPOSE_FILE.read_text())
    source = REPO_ROOT / compose["secrets"]["alert-webhook-token"]["file"]
    assert source.read_text().strip() == bearer.DEMO_ALERT_TOKEN


def test_compose_and_the_local_stack_route_alerts_alike() -> None:
    """The same route and receiver, only the addresses, the token's file and the timings differ."""
    local = yaml.safe_load(
        LOCAL_ALERTMANAGER_TEMPLATE.read_text().replace("$webhook_url", "url").replace("$token_file", "file")
    )
    compose = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())
    timings = ("group_wait", "group_interval", "repeat_interval")

    def shape(config: dict[str, Any]) -> Any:
        route = {k: v for k, v in config["route"].items() if k not in timings}
        [receiver] = config["receivers"]
        [hook] = receiver["webhook_configs"]
        hook = {**hook, "url": "-", "http_config": {"authorization": {**hook["http_config"]["authorization"]}}}
        hook["http_config"]["authorization"]["credentials_file"] = "-"
        return route, receiver["name"], hook

    assert shape(local) == shape(compose)


def test_stack_settings_with_a_loopback_default_are_set_to_compose_names() -> None:
    """x-stack-env is StackSettings seen from a container: no 127.0.0.1 default may stay."""
    stack_env = yaml.safe_load(COMPOSE_FILE.read_text())["x-stack-env"]
    for name, field in StackSettings.model_fields.items():
        if isinstance(field.default, str) and "127.0.0.1" in field.default:
            key = f"FLOTILLA_{name.upper()}"
            assert key in stack_env, f"{key} would stay {field.default!r} inside a container"
            assert "127.0.0.1" not in str(stack_env[key]), key
    assert stack_env["FLOTILLA_PROMETHEUS_URL"] == "http://prometheus:9090"
    assert stack_env["FLOTILLA_ALERTMANAGER_URL"] == "http://alertmanager:9093"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian's prometheus) is not installed")
def test_promtool_accepts_the_compose_prometheus_config_with_its_rules(tmp_path: Path) -> None:
    config = tmp_path / "prometheus.yml"
    config.write_text(PROMETHEUS_CONFIG.read_text().replace("/etc/prometheus/rules/", f"{PROMETHEUS_RULES}/"))
    proc = subprocess.run(["promtool", "check", "config", str(config)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 1 rule files found" in proc.stdout


@pytest.mark.skipif(shutil.which("amtool") is None, reason="amtool (Debian's prometheus-alertmanager) is not installed")
def test_amtool_accepts_the_compose_alertmanager_config() -> None:
    proc = subprocess.run(
        ["amtool", "check-config", str(ALERTMANAGER_CONFIG)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ------------------------------------------------------------------ the image


def _stages() -> list[Stage]:
    return stages(DOCKERFILE)


def test_the_image_is_multi_stage_and_slim() -> None:
    stages = _stages()
    assert len(stages) >= 2
    runtime_base, _, steps = stages[-1]
    assert runtime_base.startswith("python:3.11-slim")
    assert stages[0][0] == runtime_base  # the virtualenv copied across needs the same Python
    assert any(i == "COPY" and a.startswith(f"--from={stages[0][1]} ") for i, a in steps)
    assert not any(i == "RUN" and ("apt-get install" in a or "pip install" in a) for i, a in steps)


def test_the_image_runs_as_a_fixed_unprivileged_user() -> None:
    _, _, steps = _stages()[-1]
    users = [a for i, a in steps if i == "USER"]
    assert users, "the runtime stage sets no USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) >= 1000
    assert not gid or (gid.isdigit() and int(gid) != 0)


def test_the_image_carries_what_the_services_read_and_no_secret() -> None:
    _, _, steps = _stages()[-1]
    copies = {a.split()[-2]: a.split()[-1] for i, a in steps if i == "COPY" and not a.startswith("--from")}
    assert {"schemas", "infra/policies", "infra/local/demo.py"} <= set(copies)
    env = dict(pair.split("=", 1) for i, a in steps if i == "ENV" for pair in shlex.split(a) if "=" in pair)
    workdir = [a for i, a in steps if i == "WORKDIR"][-1]
    assert Path(env["FLOTILLA_SCHEMAS_DIR"]) == Path(workdir) / copies["schemas"]
    assert Path(env["FLOTILLA_POLICY_DIR"]) == Path(workdir) / copies["infra/policies"]
    for stage in _stages():
        for instruction, arguments in stage[2]:
            if instruction in ("ENV", "ARG"):
                assert not re.search(r"(PASSWORD|SECRET|TOKEN|API_KEY)", arguments), arguments
    cmd = json.loads([a for i, a in steps if i == "CMD"][-1])
    assert cmd[:2] == ["python", "-m"] and cmd[2] in {m.module for m in fleet.FLEET}


def test_the_policies_and_schemas_the_image_copies_exist() -> None:
    from flotilla import project_path

    # what FLOTILLA_SCHEMAS_DIR and FLOTILLA_POLICY_DIR replace in the image, found from a checkout
    assert project_path("FLOTILLA_POLICY_DIR", "infra/policies").resolve() == REPO_ROOT / "infra" / "policies"
    assert any((REPO_ROOT / "infra" / "policies").glob("*.cedar"))
    assert any((REPO_ROOT / "schemas").rglob("*.avsc"))


def test_every_data_file_of_the_packages_is_in_the_wheel() -> None:
    """The image installs the project as a wheel: a template, a migration or any other
    file the code reads from beside itself must be package data, or it is missing there."""
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    package_data: dict[str, list[str]] = pyproject["tool"]["setuptools"].get("package-data", {})
    roots = {"services": REPO_ROOT / "services", "flotilla": REPO_ROOT / "libs" / "flotilla"}
    roots["flotilla_ops"] = REPO_ROOT / "libs" / "flotilla_ops"
    missing = []
    for package, root in roots.items():
        patterns = package_data.get(package, []) + package_data.get("*", [])
        for path in root.rglob("*"):
            if not path.is_file() or path.suffix in (".py", ".pyc", ".typed") or "__pycache__" in path.parts:
                continue
            relative = path.relative_to(root).as_posix()
            if not any(fnmatch.fnmatchcase(relative, p) for p in patterns):
                missing.append(f"{package}/{relative}")
    assert not missing, f"not package data, so not in the image: {missing}"


def _ignored(path: str, patterns: list[str]) -> bool:
    hit = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(fnmatch.fnmatchcase(p, pattern) or fnmatch.fnmatchcase(p, pattern.replace("**/", "")) for p in prefixes):
            hit = not negate
    return hit


def test_dockerignore_keeps_the_context_small_but_complete() -> None:
    patterns = [
        line.strip() for line in DOCKERIGNORE.read_text().splitlines() if line.strip() and not line.startswith("#")
    ]
    for excluded in (".git", ".venv", ".stack", ".env", "tests", "docs", "libs/flotilla/__pycache__", ".mypy_cache"):
        assert _ignored(excluded, patterns), f"{excluded} would be sent to the builder"
    sources = [a.split()[:-1] for stage in _stages() for i, a in stage[2] if i == "COPY" and "--from" not in a]
    for source in (s for group in sources for s in group):
        assert not _ignored(source.rstrip("/"), patterns), f"{source} is copied but ignored"
        assert (REPO_ROOT / source).exists(), source
