"""Start the stack from ``docker-compose.yml`` with testcontainers, where a Docker engine runs.

The compose file is the single source of truth: images, environment, commands,
volumes, published ports, healthchecks and start order all come from it, so this
module names no image. A service with a ``build`` (Kafka Connect: Debezium's image plus
our transforms) is built from its context first, under its ``image`` name. The
long-running services (PostgreSQL, Kafka, the schema registry, Kafka Connect) join one
throwaway network under their compose names, are published on the same loopback ports
as in compose (and as the local stack), and are waited on through their compose
healthchecks; the one-shot init jobs (the registry's users, topics, registry
compatibility, the outbox connector) then run to completion. Named volumes become Docker
volumes of this stack alone (removed with it). The registry refuses anonymous writes, so
each stack makes its own registrar credentials: handed to ``registry-auth-init`` as
``FLOTILLA_SCHEMA_REGISTRY_AUTH`` (the variable compose reads from ``.env``) and to host
clients as a private file (``FLOTILLA_SCHEMA_REGISTRY_AUTH_FILE``).

testcontainers is the optional extra ``docker`` (``pip install -e '.[docker]'``) and is
imported only when a stack is started; parsing the compose file needs PyYAML alone::

    if not docker_available():
        pytest.skip("no Docker engine")
    with ComposeStack() as env:  # FLOTILLA_* settings, as stackctl's stack_env()
        ...
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import secrets
import shlex
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, cast

import yaml

if TYPE_CHECKING:
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.network import Network

REPO_ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO_ROOT / "docker-compose.yml"
INFRA_SERVICES = ("postgres", "kafka", "schema-registry", "connect")
# One-shot jobs the infrastructure itself waits for (the registry's users file): always run.
SETUP_SERVICES = ("registry-auth-init",)
INIT_SERVICES = ("kafka-init", "registry-init", "connect-init")
# What compose takes from the environment or .env (`${NAME:-default}`) that this starter sets.
REGISTRAR_VARIABLE = "FLOTILLA_SCHEMA_REGISTRY_AUTH"
START_TIMEOUT_S = 240.0

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_CONDITIONS = {"service_healthy", "service_completed_successfully", "service_started"}
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class ComposeSpecError(ValueError):
    """The compose file uses something this starter does not translate."""


class StackStartError(RuntimeError):
    """A container did not become healthy, or an init job failed; the message says which."""


@dataclass(frozen=True)
class PortBinding:
    host_ip: str
    host_port: int
    container_port: int
    protocol: str = "tcp"


@dataclass(frozen=True)
class Healthcheck:
    test: tuple[str, ...]
    interval_s: float
    timeout_s: float
    retries: int
    start_period_s: float

    def docker_sdk(self) -> dict[str, Any]:
        """The form the Docker SDK's ``containers.create(healthcheck=...)`` takes (nanoseconds)."""
        return {
            "test": list(self.test),
            "interval": _ns(self.interval_s),
            "timeout": _ns(self.timeout_s),
            "retries": self.retries,
            "start_period": _ns(self.start_period_s),
        }


@dataclass(frozen=True)
class BuildSpec:
    """Where a service's image is built from: compose's ``build`` context and Dockerfile."""

    context: str  # absolute path
    dockerfile: str = "Dockerfile"  # relative to the context


@dataclass(frozen=True)
class ServiceSpec:
    """One compose service, reduced to what a container start needs."""

    name: str
    image: str
    environment: dict[str, str]
    command: list[str] | None
    entrypoint: list[str] | None
    ports: tuple[PortBinding, ...]
    volumes: tuple[tuple[str, str, str], ...]  # (absolute host path, container path, mode)
    healthcheck: Healthcheck | None
    depends_on: dict[str, str]  # service -> compose condition
    build: BuildSpec | None = None  # built under ``image`` before the start, when set
    user: str | None = None  # compose's ``user:`` (uid[:gid])
    named_volumes: tuple[tuple[str, str, str], ...] = ()  # (compose volume name, container path, mode)

    @property
    def is_init_job(self) -> bool:
        """One-shot jobs are named ``*-init``; they run to completion instead of staying healthy."""
        return self.name.endswith("-init")


# ------------------------------------------------------------------ compose parsing


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


def parse_duration(text: str | int | float) -> float:
    """Seconds in a compose duration such as ``5s``, ``1m30s`` or ``500ms``."""
    if isinstance(text, int | float):
        return float(text)
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text.strip():
        raise ComposeSpecError(f"unreadable duration {text!r}")
    return sum(float(n) * _UNIT_S[u] for n, u in parts)


def _scalar(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def _environment(raw: object) -> dict[str, str]:
    if raw is None:
        return {}
    if isinstance(raw, Mapping):
        return {str(k): _scalar(v) for k, v in raw.items()}
    if isinstance(raw, list):
        pairs = (str(item).partition("=") for item in raw)
        return {k: v for k, sep, v in pairs if sep}  # a bare NAME (taken from the host) is not carried
    raise ComposeSpecError(f"environment must be a mapping or a list, not {type(raw).__name__}")


def _argv(raw: object) -> list[str] | None:
    if raw is None:
        return None
    if isinstance(raw, str):
        return shlex.split(raw)
    if isinstance(raw, list):
        return [str(arg) for arg in raw]
    raise ComposeSpecError(f"command/entrypoint must be a string or a list, not {type(raw).__name__}")


def _port(raw: object) -> PortBinding:
    """``HOST_IP:HOST_PORT:CONTAINER_PORT[/PROTO]``; an unbound or ranged form is refused."""
    text = str(raw)
    mapping, _, protocol = text.partition("/")
    parts = mapping.split(":")
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
        raise ComposeSpecError(f"port {text!r}: expected HOST_IP:HOST_PORT:CONTAINER_PORT")
    return PortBinding(parts[0], int(parts[1]), int(parts[2]), protocol or "tcp")


def _volume(raw: object, base_dir: Path) -> tuple[str, str, str]:
    parts = str(raw).split(":")
    if len(parts) not in (2, 3) or not parts[0].startswith((".", "/")):
        raise ComposeSpecError(f"volume {raw!r}: only bind mounts (./src:/dst[:mode]) are supported")
    mode = parts[2] if len(parts) == 3 else "rw"
    return str((base_dir / parts[0]).resolve()), parts[1], mode


def _named_volume(raw: object, names: Collection[str]) -> tuple[str, str, str] | None:
    """``name:/dst[:mode]`` for a volume of the file's top-level ``volumes``; None for anything else."""
    parts = str(raw).split(":")
    if len(parts) in (2, 3) and parts[0] in names:
        return parts[0], parts[1], parts[2] if len(parts) == 3 else "rw"
    return None


def interpolate(value: str, variables: Mapping[str, str]) -> str:
    """Compose's ``${NAME}`` / ``${NAME:-default}`` from ``variables`` (not the host's environment:
    a stack started here depends on nothing but the file and this starter)."""
    return _VARIABLE.sub(lambda m: variables.get(m.group(1)) or (m.group(2) or ""), value)


def _healthcheck(raw: object) -> Healthcheck | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ComposeSpecError("healthcheck must be a mapping")
    if raw.get("disable"):
        return None
    test = raw["test"]
    argv = ["CMD-SHELL", test] if isinstance(test, str) else [str(t) for t in test]
    return Healthcheck(
        test=tuple(argv),
        interval_s=parse_duration(raw.get("interval", "30s")),
        timeout_s=parse_duration(raw.get("timeout", "30s")),
        retries=int(raw.get("retries", 3)),
        start_period_s=parse_duration(raw.get("start_period", "0s")),
    )


def _depends_on(raw: object) -> dict[str, str]:
    if raw is None:
        return {}
    if isinstance(raw, list):  # short form: started, nothing more
        return {str(name): "service_started" for name in raw}
    if isinstance(raw, Mapping):
        deps = {str(name): str((cfg or {}).get("condition", "service_started")) for name, cfg in raw.items()}
        unknown = set(deps.values()) - _CONDITIONS
        if unknown:
            raise ComposeSpecError(f"unknown depends_on condition(s) {sorted(unknown)}")
        return deps
    raise ComposeSpecError("depends_on must be a list or a mapping")


def _build(raw: object, base_dir: Path) -> BuildSpec | None:
    """``build: ./dir`` or ``build: {context: ./dir, dockerfile: File}``; other build options are refused."""
    if raw is None:
        return None
    if isinstance(raw, str):
        raw = {"context": raw}
    if not isinstance(raw, Mapping) or "context" not in raw:
        raise ComposeSpecError("build must be a path or a mapping with a context")
    unsupported = sorted(set(raw) - {"context", "dockerfile"})
    if unsupported:
        raise ComposeSpecError(f"build option(s) {unsupported} are not supported (only context and dockerfile)")
    return BuildSpec(str((base_dir / str(raw["context"])).resolve()), str(raw.get("dockerfile", "Dockerfile")))


def service_spec(name: str, raw: Mapping[str, Any], base_dir: Path, volume_names: Collection[str] = ()) -> ServiceSpec:
    """Translate one compose service; anything it cannot honour raises ComposeSpecError."""
    if "image" not in raw:
        raise ComposeSpecError(f"service {name} has no image (a build needs one too: the name it is built under)")
    mounts = raw.get("volumes") or ()
    named = tuple(v for v in (_named_volume(m, volume_names) for m in mounts) if v is not None)
    binds = [m for m in mounts if _named_volume(m, volume_names) is None]
    return ServiceSpec(
        name=name,
        image=str(raw["image"]),
        environment=_environment(raw.get("environment")),
        command=_argv(raw.get("command")),
        entrypoint=_argv(raw.get("entrypoint")),
        ports=tuple(_port(p) for p in raw.get("ports") or ()),
        volumes=tuple(_volume(v, base_dir) for v in binds),
        healthcheck=_healthcheck(raw.get("healthcheck")),
        depends_on=_depends_on(raw.get("depends_on")),
        build=_build(raw.get("build"), base_dir),
        user=None if raw.get("user") is None else str(raw["user"]),
        named_volumes=named,
    )


def load_compose(compose_file: Path = COMPOSE_FILE) -> dict[str, Any]:
    doc = yaml.safe_load(compose_file.read_text())
    if not isinstance(doc, dict) or not isinstance(doc.get("services"), dict):
        raise ComposeSpecError(f"{compose_file} has no services mapping")
    return doc


def _start_order(specs: Mapping[str, ServiceSpec]) -> list[ServiceSpec]:
    """Dependencies first, compose-file order among equals; a dependency outside the selection raises."""
    order: list[ServiceSpec] = []
    placed: set[str] = set()
    while len(order) < len(specs):
        ready = [s for n, s in specs.items() if n not in placed and set(s.depends_on) <= placed]
        if not ready:
            blocked = {n: sorted(set(s.depends_on) - placed) for n, s in specs.items() if n not in placed}
            raise ComposeSpecError(f"unsatisfiable depends_on (missing from the selection, or a cycle): {blocked}")
        order.append(ready[0])
        placed.add(ready[0].name)
    return order


def service_specs(
    compose_file: Path = COMPOSE_FILE, names: Sequence[str] = SETUP_SERVICES + INFRA_SERVICES + INIT_SERVICES
) -> list[ServiceSpec]:
    """The selected services of the compose file, in an order that honours depends_on."""
    doc = load_compose(compose_file)
    services, volume_names = doc["services"], tuple(doc.get("volumes") or ())
    missing = [n for n in names if n not in services]
    if missing:
        raise ComposeSpecError(f"{compose_file} lacks service(s) {missing}")
    specs = {n: service_spec(n, services[n], compose_file.parent, volume_names) for n in names}
    return _start_order(specs)


# --------------------------------------------------------------------- settings


def _published(spec: ServiceSpec) -> PortBinding:
    if len(spec.ports) != 1:
        raise ComposeSpecError(f"service {spec.name} must publish exactly one port, not {len(spec.ports)}")
    return spec.ports[0]


def stack_settings(specs: Iterable[ServiceSpec], registrar_file: Path | None = None) -> dict[str, str]:
    """The FLOTILLA_* settings for host clients, with the keys of stackctl's ``stack_env()``
    (the registrar's credentials file when given: the stack's writes need them)."""
    by_name = {s.name: s for s in specs}
    pg = by_name["postgres"]
    user = pg.environment["POSTGRES_USER"]
    password = pg.environment["POSTGRES_PASSWORD"]
    database = pg.environment.get("POSTGRES_DB", user)
    pg_port = _published(pg)
    kafka = _published(by_name["kafka"])
    registry = _published(by_name["schema-registry"])
    connect = _published(by_name["connect"])
    exactly_once = by_name["connect"].environment.get("CONNECT_EXACTLY_ONCE_SOURCE_SUPPORT") == "enabled"
    env = {
        "FLOTILLA_STACK": "docker",
        # what the compose Connect worker does, so connectors registered from the host agree
        "FLOTILLA_OUTBOX_DELIVERY": "exactly-once" if exactly_once else "at-least-once",
        "FLOTILLA_PROFILE": "demo",  # the compose file's demo, like the local stack
        "FLOTILLA_KAFKA_BOOTSTRAP": f"{kafka.host_ip}:{kafka.host_port}",
        # Apicurio, as in the local stack: the Confluent API under /apis/ccompat/v7.
        "FLOTILLA_SCHEMA_REGISTRY_URL": f"http://{registry.host_ip}:{registry.host_port}/apis/ccompat/v7",
        "FLOTILLA_CONNECT_URL": f"http://{connect.host_ip}:{connect.host_port}",
        "FLOTILLA_PG_HOST": pg_port.host_ip,
        "FLOTILLA_PG_PORT": str(pg_port.host_port),
        "FLOTILLA_PG_USER": user,
        "FLOTILLA_PG_PASSWORD": password,
        "FLOTILLA_PG_DATABASE": database,
        "FLOTILLA_PG_DSN": f"postgresql://{user}:{password}@{pg_port.host_ip}:{pg_port.host_port}/{database}",
    }
    if registrar_file is not None:
        env["FLOTILLA_SCHEMA_REGISTRY_AUTH_FILE"] = str(registrar_file)
    return env


# ------------------------------------------------------------------ docker engine


def _docker_cli_answers(timeout: float) -> bool:
    try:
        proc = subprocess.run(
            ["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True, timeout=timeout
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0 and bool(proc.stdout.strip())


def docker_available(timeout: float = 3.0) -> bool:
    """True when a Docker engine answers a ping (SDK if installed, else ``docker info``)."""
    try:
        import docker
    except ImportError:
        return _docker_cli_answers(timeout)
    try:
        client = docker.from_env(timeout=max(1, int(timeout)))
    except Exception:
        return False
    try:
        return bool(client.ping())
    except Exception:
        return False
    finally:
        client.close()


# ------------------------------------------------------------------- containers


def _require_testcontainers() -> None:
    if importlib.util.find_spec("testcontainers") is None:
        raise StackStartError("testcontainers is not installed: `pip install -e '.[docker]'` (the `docker` extra)")


def _build_image(spec: ServiceSpec) -> None:
    """Build the service's image under its compose ``image`` name (kept: the next run reuses its layers)."""
    from testcontainers.core.image import DockerImage

    assert spec.build is not None
    try:
        DockerImage(spec.build.context, tag=spec.image, dockerfile_path=spec.build.dockerfile, clean_up=False).build()
    except Exception as exc:
        raise StackStartError(f"{spec.name}: building {spec.image} from {spec.build.context} failed: {exc}") from exc


def _container(
    spec: ServiceSpec,
    network: Network,
    timeout: float,
    variables: Mapping[str, str] | None = None,
    volume_prefix: str = "flotilla",
) -> DockerContainer:
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.wait_strategies import HealthcheckWaitStrategy

    container = DockerContainer(spec.image).with_network(network).with_network_aliases(spec.name)
    container = container.with_envs(**{k: interpolate(v, variables or {}) for k, v in spec.environment.items()})
    if spec.command is not None:
        container = container.with_command(spec.command)
    for host_path, container_path, mode in spec.volumes:
        container = container.with_volume_mapping(host_path, container_path, mode)
    for name, container_path, mode in spec.named_volumes:  # a Docker volume, by name: this stack's own
        container = container.with_volume_mapping(f"{volume_prefix}-{name}", container_path, mode)
    extra: dict[str, Any] = {}
    if spec.user is not None:
        extra["user"] = spec.user
    if spec.entrypoint is not None:
        extra["entrypoint"] = spec.entrypoint
    if spec.healthcheck is not None:
        extra["healthcheck"] = spec.healthcheck.docker_sdk()
        container = container.waiting_for(HealthcheckWaitStrategy().with_startup_timeout(int(timeout)))
    if extra:
        container = container.with_kwargs(**extra)
    # with_bind_ports cannot name a host address; the Docker SDK's (ip, port) form can.
    ports = cast(dict[str, Any], container.ports)
    for p in spec.ports:
        ports[f"{p.container_port}/{p.protocol}"] = (p.host_ip, p.host_port)
    return container


def _log_tail(container: DockerContainer, lines: int = 20) -> str:
    try:
        out, err = container.get_logs()
    except Exception as exc:  # the message must not be lost to a log error
        return f"(logs unavailable: {exc.__class__.__name__})"
    text = (out + err).decode(errors="replace").strip().splitlines()
    return "\n".join(text[-lines:])


class ComposeStack:
    """The compose infrastructure as testcontainers; ``with ComposeStack() as env:`` yields settings."""

    def __init__(
        self,
        compose_file: Path = COMPOSE_FILE,
        *,
        run_init_jobs: bool = True,
        timeout: float = START_TIMEOUT_S,
    ) -> None:
        names = SETUP_SERVICES + INFRA_SERVICES + (INIT_SERVICES if run_init_jobs else ())
        self.specs = service_specs(compose_file, names)
        # This stack's registrar (what .env's FLOTILLA_SCHEMA_REGISTRY_AUTH would be), for
        # registry-auth-init and, through a private file, for host clients that register.
        self._registrar = f"registrar:{secrets.token_urlsafe(32)}"
        self._secrets = Path(tempfile.mkdtemp(prefix="flotilla-compose-"))  # 0700
        self.registrar_file = self._secrets / "registrar"
        self.env = stack_settings(self.specs, self.registrar_file)
        self._volume_prefix = f"flotilla-it-{uuid.uuid4().hex[:8]}"
        self._volumes = sorted({f"{self._volume_prefix}-{n}" for s in self.specs for n, _, _ in s.named_volumes})
        self._timeout = timeout
        self._network: Network | None = None
        self._started: list[DockerContainer] = []

    def start(self) -> dict[str, str]:
        """Start every service in dependency order; on any failure stop what started and raise."""
        _require_testcontainers()
        from testcontainers.core.network import Network

        built: set[str] = set()  # one image may serve several services (the fleet's image)
        for spec in self.specs:  # before any container starts: a failed build leaves nothing to clean up
            if spec.build is not None and spec.image not in built:
                _build_image(spec)
                built.add(spec.image)
        fd = os.open(self.registrar_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(self._registrar + "\n")
        self._network = Network().create()
        try:
            for spec in self.specs:
                self._start_one(spec, self._network)
        except BaseException:
            with contextlib.suppress(StackStartError):  # keep the start failure, not a cleanup one
                self.stop()
            raise
        return dict(self.env)

    def _start_one(self, spec: ServiceSpec, network: Network) -> None:
        variables = {REGISTRAR_VARIABLE: self._registrar}
        container = _container(spec, network, self._timeout, variables, self._volume_prefix)
        self._started.append(container)
        try:
            container.start()
        except Exception as exc:
            raise StackStartError(f"{spec.name} ({spec.image}) did not start: {exc}\n{_log_tail(container)}") from exc
        if spec.is_init_job:
            code = container.wait()
            if code != 0:
                raise StackStartError(f"{spec.name} exited {code}:\n{_log_tail(container)}")

    def stop(self) -> None:
        """Remove the containers (newest first) and the network; safe to call twice."""
        errors: list[str] = []
        while self._started:
            container = self._started.pop()
            try:
                container.stop()
            except Exception as exc:
                errors.append(f"{container.image}: {exc}")
        if self._network is not None:
            try:
                self._network.remove()
            except Exception as exc:
                errors.append(f"network: {exc}")
            self._network = None
        if self._volumes:
            self._remove_volumes(errors)
        shutil.rmtree(self._secrets, ignore_errors=True)
        if errors:
            raise StackStartError("cleanup failed: " + "; ".join(errors))

    def _remove_volumes(self, errors: list[str]) -> None:
        """This stack's named volumes (the containers that held them are gone)."""
        try:
            import docker
        except ImportError:
            return  # no SDK: testcontainers (which needs it) never ran, so nothing was made
        try:
            client = docker.from_env()
        except Exception:
            return  # no engine: nothing was made either
        try:
            for name in self._volumes:
                try:
                    client.volumes.get(name).remove(force=True)
                except docker.errors.NotFound:
                    pass
                except Exception as exc:
                    errors.append(f"volume {name}: {exc}")
        finally:
            client.close()
        self._volumes = []

    def __enter__(self) -> dict[str, str]:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
