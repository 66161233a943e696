"""Bring the local stack up and down without Docker.

The local stack is the same components `docker-compose.yml` runs from images —
PostgreSQL (logical WAL), a KRaft Kafka broker, Kafka Connect with the Debezium
PostgreSQL connector, Apicurio Registry (Confluent-compatible API, PostgreSQL
storage), Prometheus and Alertmanager — run as plain processes under supervisord. The
JVM parts come from Maven Central (``infra/local/pom.xml``), PostgreSQL, Prometheus and
Alertmanager from Debian's packages; our own Kafka Connect transforms
(``infra/connect-transforms``) are built with Maven into a plugin folder beside
Debezium's, again whenever their sources change.

Usage::

    python infra/local/stackctl.py up|down|reset|status [--json]
    python infra/local/stackctl.py model-up|model-down   # the optional model server

``up`` is idempotent (a healthy stack is left alone) and waits on real health
checks; ``down`` keeps data; ``reset`` wipes it. Connection settings land in one env
file (``.stack/stack.env``) that the Makefile, services and tests read.

Every failure names the component, the port or tool, and the log file to read, and
exits non-zero.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import pwd
import re
import secrets
import shutil
import socket
import stat
import string
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if str(Path(__file__).resolve().parent) not in sys.path:  # loaded by path (tests), not run
    sys.path.insert(0, str(Path(__file__).resolve().parent))

import modelserver  # after the path line above: run by path, not as a package

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient
    from psycopg import Connection

    from flotilla.delivery import Delivery

REPO_ROOT = Path(__file__).resolve().parents[2]
LOCAL_DIR = Path(__file__).resolve().parent
STACK_HOME = Path(os.environ.get("FLOTILLA_STACK_HOME", REPO_ROOT / ".stack")).resolve()
DIST = STACK_HOME / "dist"
DATA = STACK_HOME / "data"
LOGS = STACK_HOME / "logs"
RUN = STACK_HOME / "run"
ENV_FILE = STACK_HOME / "stack.env"
# Private files (0600 in a 0700 folder): the stack's alert webhook token, the fleet's keys.
SECRETS = STACK_HOME / "secrets"
# Connect's plugin.path: one folder per plugin (Debezium's unpacked archive).
CONNECT_PLUGINS = DIST / "connect-plugins"
# Our own Kafka Connect classes (a Maven module: the outbox connector, which extends
# Debezium's, and a transform). Their jar goes into Debezium's plugin folder, because a
# plugin sees only the classes of its own folder.
TRANSFORMS_SRC = REPO_ROOT / "infra" / "connect-transforms"
TRANSFORMS_PLUGIN = CONNECT_PLUGINS / "debezium-connector-postgres"
TRANSFORMS_JAR_GLOB = "flotilla-connect-transforms-*.jar"
# Where the jar was a plugin of its own before it held the connector (removed when found).
TRANSFORMS_OLD_PLUGIN = CONNECT_PLUGINS / "flotilla-connect-transforms"
TRANSFORMS_BUILD = STACK_HOME / "build" / "connect-transforms"

PG_USER = "flotilla"
PG_PASSWORD = "flotilla"  # loopback-only development cluster; never a production secret
PG_DATABASES = ("flotilla", "registry")

# JVM heaps for a 2-core, 24 GB machine running all four parts plus the fleet.
KAFKA_HEAP = "-Xms256m -Xmx1g"
CONNECT_HEAP = "-Xms256m -Xmx1g"
REGISTRY_HEAP = "-Xms128m -Xmx768m"
JVM_COMMON = "-XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:ActiveProcessorCount=2 -Djava.awt.headless=true"

TOPICS = {
    # name: (partitions, extra config). The DLQs keep 14 days so an operator has time
    # to inspect and re-queue; the work topics keep Kafka's default.
    "incidents": (6, {}),
    "commands": (6, {}),
    "incidents.dlq": (3, {"retention.ms": str(14 * 24 * 3600 * 1000)}),
    "commands.dlq": (3, {"retention.ms": str(14 * 24 * 3600 * 1000)}),
    # The audit log's signed anchors: kept for good (a few hundred bytes every few seconds
    # while the log grows), since they are what proves its tail was not cut.
    "audit.anchors": (1, {"retention.ms": "-1"}),
}
GLOBAL_COMPATIBILITY = "BACKWARD"

# Aborts transactions a Kafka restart left hanging (infra/local/txn_watchdog.py); its
# record holds one JSON line per abort (the chaos soak counts them).
TXN_WATCHDOG = "txn-watchdog"
TXN_WATCHDOG_RECORD = RUN / "hanging-transactions.jsonl"

# Prometheus and Alertmanager: Debian's packages (bookworm: 2.42 and 0.25), run with
# configs rendered from the templates beside this file.
PROMETHEUS_BIN = Path("/usr/bin/prometheus")
ALERTMANAGER_BIN = Path("/usr/bin/prometheus-alertmanager")
# Debian package -> the binary it brings (and the init script / unit it ships, same name).
OBSERVER_PACKAGES = {"prometheus": PROMETHEUS_BIN, "prometheus-alertmanager": ALERTMANAGER_BIN}
PROMETHEUS_TEMPLATE = LOCAL_DIR / "prometheus.yml.template"
ALERTMANAGER_TEMPLATE = LOCAL_DIR / "alertmanager.yml.template"
# The alerting rules, loaded from the checkout so an edit needs only a reload (POST /-/reload).
ESTATE_RULES = REPO_ROOT / "infra" / "observability" / "prometheus" / "rules" / "estate.yml"
# Alertmanager presents it to the health agent's /alerts; the agent finds it through the env file.
ALERT_WEBHOOK_TOKEN_FILE = SECRETS / "alert-webhook-token"
# The schema registry refuses anonymous writes (reads stay anonymous): the registrar's
# credentials (`registrar:<random>`, made once) are what `make schemas`, the test session
# and this script register and configure with; the env file names the file, never the
# value (the env file is world-readable). The registry reads its users file (the password's
# digest, Quarkus config) from .stack/run, written from the credentials at each config write.
REGISTRY_REGISTRAR_FILE = SECRETS / "registry-registrar"
REGISTRY_USERS_FILE = RUN / "registry-users.properties"
ALERT_RECEIVER = "flotilla-health-agent"

UP_TIMEOUT_S = float(os.environ.get("FLOTILLA_STACK_TIMEOUT", "240"))


class StackError(RuntimeError):
    """A failure the operator can act on; the message says what and where."""


# ------------------------------------------------------------- supervisord


class SupervisorError(StackError):
    """supervisord or supervisorctl failed."""


class Supervisor:
    def __init__(self, run_dir: Path, label: str, home: Path) -> None:
        self.run_dir = run_dir
        self.conf = run_dir / "supervisord.conf"
        self.pidfile = run_dir / "supervisord.pid"
        # A unix socket path must stay under ~100 bytes, so it lives in /tmp, named by a
        # digest of the stack home (several checkouts can each run a stack on other ports).
        digest = hashlib.sha1(str(home).encode()).hexdigest()[:10]
        self.sock = Path("/tmp") / f"flotilla-{label}-{digest}.sock"

    def header(self, logs: Path, user: str) -> str:
        """The [supervisord]/[unix_http_server]/[supervisorctl] part of a config."""
        return f"""; generated — edit the controller that writes it, not this file
[unix_http_server]
file={self.sock}
chmod=0700

[supervisord]
logfile={logs / f"supervisord-{self.sock.stem.split('-')[1]}.log"}
pidfile={self.pidfile}
childlogdir={logs}
nodaemon=false
user={user}

[rpcinterface:supervisor]
supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface

[supervisorctl]
serverurl=unix://{self.sock}
"""

    def running(self) -> bool:
        if not self.pidfile.exists() or not self.sock.exists():
            return False
        try:
            os.kill(int(self.pidfile.read_text().strip()), 0)
        except (ValueError, ProcessLookupError, PermissionError):
            return False
        return True

    def ctl(self, *args: str, check: bool = True) -> str:
        proc = subprocess.run(
            [sys.executable, "-m", "supervisor.supervisorctl", "-c", str(self.conf), *args],
            capture_output=True,
            text=True,
        )
        if check and proc.returncode not in (0, 3):  # 3: some programs not running (status)
            raise SupervisorError(f"supervisorctl {' '.join(args)} failed: {(proc.stdout + proc.stderr).strip()}")
        return proc.stdout

    def states(self) -> dict[str, str]:
        """Program name → supervisor state (RUNNING, STARTING, BACKOFF, FATAL, …)."""
        if not self.running():
            return {}
        states = {}
        for line in self.ctl("status", check=False).splitlines():
            parts = line.split()
            if len(parts) >= 2:
                states[parts[0]] = parts[1]
        return states

    def launch(self, log: Path) -> None:
        """Start the daemon with the config already written; wait for its socket."""
        self.sock.unlink(missing_ok=True)
        proc = subprocess.run(
            [sys.executable, "-m", "supervisor.supervisord", "-c", str(self.conf)], capture_output=True, text=True
        )
        if proc.returncode != 0:
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text(proc.stdout + proc.stderr)
            raise SupervisorError(f"supervisord did not start (see {log}): {(proc.stderr or proc.stdout).strip()}")
        deadline = time.monotonic() + 15
        while not self.sock.exists() and time.monotonic() < deadline:
            time.sleep(0.1)

    def wait_until_up(
        self, program: str, check: Callable[[], bool], *, endpoint: str, log: Path, timeout: float, interval: float
    ) -> None:
        """Poll ``check`` until it passes; fail fast if supervisord gave the program up."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if check():
                return
            state = self.states().get(program, "")
            if state in ("FATAL", "BACKOFF", "EXITED"):
                raise StackError(f"{program} failed to start (supervisor state {state}); read {log}: {tail(log)}")
            time.sleep(interval)
        raise StackError(
            f"{program} did not become healthy on {endpoint} within {timeout:.0f}s; read {log}: {tail(log)}"
        )

    def shutdown(self, programs: list[str], timeout: float = 30) -> None:
        """Stop programs in the given order, then the daemon."""
        if not self.running():
            return
        for name in programs:
            self.ctl("stop", name, check=False)
        self.ctl("shutdown", check=False)
        deadline = time.monotonic() + timeout
        while self.running() and time.monotonic() < deadline:
            time.sleep(0.2)


def tail(path: Path, lines: int = 3) -> str:
    """The last lines of a log, on one line, for error messages."""
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return "(no log yet)"


# The environment variable that moves each port (named in error messages).
PORT_ENV = {
    "postgres": "FLOTILLA_PG_PORT",
    "kafka": "FLOTILLA_KAFKA_PORT",
    "kafka-controller": "FLOTILLA_KAFKA_CONTROLLER_PORT",
    "registry": "FLOTILLA_REGISTRY_PORT",
    "registry-management": "FLOTILLA_REGISTRY_MANAGEMENT_PORT",
    "connect": "FLOTILLA_CONNECT_PORT",
    "prometheus": "FLOTILLA_PROMETHEUS_PORT",
    "alertmanager": "FLOTILLA_ALERTMANAGER_PORT",
    "model-server": "FLOTILLA_MODEL_SERVER_PORT",
}
DEFAULT_PORTS = {
    "postgres": 55432,
    "kafka": 19092,
    "kafka-controller": 19093,
    "registry": 18081,
    # Quarkus serves health on a separate management port (9000 on every interface by
    # default); pin it to loopback and to our own range.
    "registry-management": 18091,
    "connect": 18083,
    # Not Debian's 9090/9093: those belong to any Prometheus the machine runs already.
    "prometheus": 18120,
    "alertmanager": 18121,
    # Optional: started by `model-up` only (infra/local/modelserver.py).
    "model-server": 18122,
}


PORTS = {key: int(os.environ.get(PORT_ENV[key], default)) for key, default in DEFAULT_PORTS.items()}
HOST = "127.0.0.1"
SUPERVISOR = Supervisor(RUN, "supervisor", STACK_HOME)
MODEL_SERVER = modelserver.ModelServer(
    STACK_HOME / "model-server", HOST, PORTS["model-server"], SECRETS / "model-server-api-key"
)
MODEL_ALIAS = modelserver.ALIAS


def outbox_delivery() -> Delivery:
    """How outbox rows reach their topics on this stack (FLOTILLA_OUTBOX_DELIVERY when it is
    brought up, else flotilla.delivery's default): the Connect worker's mode, and through the
    env file every service's, so the two cannot disagree."""
    from flotilla.delivery import DEFAULT_DELIVERY, DELIVERIES  # here: importing flotilla takes a second

    chosen = os.environ.get("FLOTILLA_OUTBOX_DELIVERY") or DEFAULT_DELIVERY
    for delivery in DELIVERIES:
        if chosen == delivery:
            return delivery
    raise SystemExit(f"FLOTILLA_OUTBOX_DELIVERY={chosen!r}: one of {', '.join(DELIVERIES)}")


def stack_env() -> dict[str, str]:
    """The connection settings every tool, service and test reads."""
    return {
        "FLOTILLA_STACK": "local",
        "FLOTILLA_OUTBOX_DELIVERY": outbox_delivery(),
        # The local stack is the demo: unset credentials fall back to the public demo users
        # and tokens (flotilla.settings.Profile); elsewhere the default profile refuses them.
        "FLOTILLA_PROFILE": "demo",
        "FLOTILLA_KAFKA_BOOTSTRAP": f"{HOST}:{PORTS['kafka']}",
        "FLOTILLA_SCHEMA_REGISTRY_URL": f"http://{HOST}:{PORTS['registry']}/apis/ccompat/v7",
        "FLOTILLA_CONNECT_URL": f"http://{HOST}:{PORTS['connect']}",
        "FLOTILLA_PG_HOST": HOST,
        "FLOTILLA_PG_PORT": str(PORTS["postgres"]),
        "FLOTILLA_PG_USER": PG_USER,
        "FLOTILLA_PG_PASSWORD": PG_PASSWORD,
        "FLOTILLA_PG_DATABASE": "flotilla",
        "FLOTILLA_PG_DSN": f"postgresql://{PG_USER}:{PG_PASSWORD}@{HOST}:{PORTS['postgres']}/flotilla",
        "FLOTILLA_PROMETHEUS_URL": f"http://{HOST}:{PORTS['prometheus']}",
        "FLOTILLA_ALERTMANAGER_URL": f"http://{HOST}:{PORTS['alertmanager']}",
        # The token Alertmanager's webhook presents (the fleet gives the health agent its
        # digest; tests that act as Alertmanager read it here).
        "FLOTILLA_ALERT_WEBHOOK_TOKEN_FILE": str(ALERT_WEBHOOK_TOKEN_FILE),
        # Who may write to the registry: the file holding the registrar's user:password
        # (flotilla.settings.StackSettings.registrar_auth); serializers read anonymously.
        "FLOTILLA_SCHEMA_REGISTRY_AUTH_FILE": str(REGISTRY_REGISTRAR_FILE),
    }


# How the agents read the local estate (the sim, as this stack's Prometheus sees it), in the
# env file beside the connection settings (not in the stack's own processes' environment:
# supervisord cannot carry the query's quotes, and they have no use for it): its
# timings (a 1 s scrape, so a 5 s rate window; a reading covers up to 6 s before it), a
# short history, the sim's worker-pool gauges for utilization (an estate's own override of
# a reading that has no convention), and the catalogue of its default estate.
LOCAL_ESTATE = {
    "FLOTILLA_PROMQL_WINDOW": "5s",
    "FLOTILLA_HEALTH_METRICS_LAG_SECONDS": "6",
    "FLOTILLA_HEALTH_ALERT_RESOLVE_GRACE_SECONDS": "15",
    "FLOTILLA_EVIDENCE_LOOKBACK_SECONDS": "120",
    "FLOTILLA_EVIDENCE_STEP_SECONDS": "5",
    "FLOTILLA_PROMQL_UTILIZATION": (
        'sum by (service_name, deployment_environment_name) (http_server_active_requests{service_name=~"$services"})'
        ' / sum by (service_name, deployment_environment_name) (worker_pool_slots{service_name=~"$services"})'
    ),
    "FLOTILLA_ESTATE_CATALOGUE_FILE": str(LOCAL_DIR / "estate.yaml"),
    # No incident cap on the local stack: its health agent's database outlives the fleets run
    # on it (the demo, the e2e and model lanes, the chaos soak's inherited proposal), which
    # reopen the demo services dozens of times an hour; a later demo would find checkout-api
    # capped. An estate keeps the default (12 an hour); the cap's own tests set theirs.
    "FLOTILLA_HEALTH_INCIDENTS_PER_HOUR": "0",
}


# --------------------------------------------------------------------------- tools


def _say(msg: str) -> None:
    print(f"[stack] {msg}", flush=True)


def _run(cmd: list[str], *, what: str, log: Path | None = None, **kw: object) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)  # type: ignore[call-overload]
    if proc.returncode != 0:
        if log:
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text(proc.stdout + proc.stderr)
        detail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        where = f" (full output in {log})" if log else ""
        raise StackError(f"{what} failed{where}: " + " | ".join(detail))
    return str(proc.stdout)


def ensure_private_token(
    path: Path, *, what: str, say: Callable[[str], None] = _say, make: Callable[[], str] | None = None
) -> str:
    """The token in ``path``, made the first time (by ``make``; by default 32 random bytes,
    URL-safe) and reused after, so a process restarted alone still holds what its peer
    holds. Mode 0600 in a 0700 folder: other users of the machine reach our loopback ports
    but cannot read it, and a file they could read is refused rather than trusted."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            raise StackError(
                f"{path} is readable by other users (mode {mode:o}): delete it (`up` makes a new one) "
                "or chmod 600 it if nobody else can have read it"
            ) from None
        token = path.read_text().strip()
        if not token:
            raise StackError(f"{path} is empty: delete it and `up` makes a new one") from None
        return token
    token = make() if make is not None else secrets.token_urlsafe(32)
    with os.fdopen(fd, "w") as out:
        out.write(token + "\n")
    say(f"generated {what} in {path}")
    return token


# What the registry is told (flotilla.registry.SERVER_ENV, repeated here: stackctl imports
# flotilla only where it must): HTTP basic auth on, anonymous reads allowed. Its users come
# from REGISTRY_USERS_FILE (QUARKUS_CONFIG_LOCATIONS).
REGISTRY_AUTH_ENV = {"QUARKUS_HTTP_AUTH_BASIC": "true", "APICURIO_AUTH_ANONYMOUS_READ_ACCESS_ENABLED": "true"}


def registrar_credentials() -> str:
    """The registry registrar's ``user:password`` (REGISTRY_REGISTRAR_FILE), made the first time."""
    from flotilla.registry import new_credentials, split_credentials  # here: importing flotilla takes a second

    credentials = ensure_private_token(
        REGISTRY_REGISTRAR_FILE, what="the schema registry's registrar credentials", make=new_credentials
    )
    try:
        split_credentials(credentials)
    except ValueError:
        raise StackError(
            f"{REGISTRY_REGISTRAR_FILE} does not hold user:password: delete it and `make stack-down stack-up` "
            "makes new credentials"
        ) from None
    return credentials


def _write_registry_users(credentials: str) -> None:
    """The registry's users file (0600): the registrar and the digest of its password."""
    from flotilla.registry import users_properties, write_private

    write_private(REGISTRY_USERS_FILE, users_properties(credentials), 0o600)


def _apt_install(packages: list[str]) -> None:
    """Install Debian packages (root only); apt's output lands in .stack/logs/apt.log on failure."""
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    _run(["apt-get", "update", "-q"], what="apt-get update", env=env, log=LOGS / "apt.log")
    _run(
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages],
        what=f"apt-get install {' '.join(packages)}",
        env=env,
        log=LOGS / "apt.log",
    )


def short_version(text: str) -> str:
    """``prometheus, version 2.42.0+ds (branch: …)`` → ``prometheus 2.42.0+ds``: the first line
    of a Prometheus-style ``--version``, cut to what a status line has room for."""
    lines = text.strip().splitlines()
    first = lines[0].strip() if lines else ""
    match = re.match(r"([^\s,]+), version (\S+)", first)
    if match:
        return f"{match.group(1)} {match.group(2)}"
    return first[:40] or "?"


def _binary_version(binary: Path) -> str:
    proc = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=10)
    return short_version(proc.stdout or proc.stderr)  # kingpin printed it on stderr in older releases


def _java_major(java: Path) -> int | None:
    out = subprocess.run([str(java), "-version"], capture_output=True, text=True).stderr
    try:
        ver = out.split('"')[1]
        return int(ver.split(".")[1]) if ver.startswith("1.") else int(ver.split(".")[0].split("-")[0])
    except (IndexError, ValueError):
        return None


def _java(min_major: int, needed_by: str) -> tuple[str, int]:
    """A java binary of at least `min_major`: JAVA_HOME, then PATH, then /usr/lib/jvm.

    Kafka and Connect run on Java 17 (what Debezium targets); Apicurio 3.3 is built for
    Java 21, so the registry may run on a second JDK beside the default one.
    """
    candidates: list[Path] = []
    if os.environ.get("JAVA_HOME"):
        candidates.append(Path(os.environ["JAVA_HOME"]) / "bin" / "java")
    found = shutil.which("java")
    if found:
        candidates.append(Path(found))
    jvm_root = Path(os.environ.get("FLOTILLA_JVM_ROOT", "/usr/lib/jvm"))
    candidates += sorted(jvm_root.glob("*/bin/java"))
    for java in candidates:
        major = _java_major(java) if java.exists() else None
        if major is not None and major >= min_major:
            return str(java), major
    raise StackError(
        f"Java {min_major} or newer is required by {needed_by} but none was found in JAVA_HOME, "
        f"on PATH or under {jvm_root}. Install one (e.g. a Temurin {max(min_major, 21)} JDK) "
        "or point JAVA_HOME at it."
    )


def _pg_bindir() -> Path:
    """Debian's PostgreSQL server binaries, installing the package when missing."""
    roots = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"), reverse=True)
    if roots:
        return roots[0].parent
    if os.geteuid() != 0:
        raise StackError(
            "PostgreSQL server binaries are missing (/usr/lib/postgresql/*/bin/postgres) and "
            "installing them needs root: run `sudo apt-get install -y postgresql`."
        )
    _say("PostgreSQL server not found: installing Debian's postgresql package")
    _apt_install(["postgresql"])
    # The package starts its own cluster on 5432; ours runs separately, so stop it.
    subprocess.run(["service", "postgresql", "stop"], capture_output=True)
    roots = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"), reverse=True)
    if not roots:
        raise StackError("apt-get installed postgresql but no server binary appeared")
    return roots[0].parent


def _observer_binaries() -> None:
    """Prometheus and Alertmanager from Debian's packages, installing those missing (as root).

    What the packages do on install (bookworm; prometheus 2.42.0+ds-5+deb12u1 and
    prometheus-alertmanager 0.25.0-1+b4, read from their maintainer scripts): postinst adds a
    ``prometheus`` system user that owns /var/lib/prometheus/*, then starts the packaged
    daemon with Debian's defaults, listening on every interface (9090; 9093 plus the
    cluster port 9094): under systemd it enables and starts the unit (deb-systemd-invoke),
    otherwise it registers and starts the init script (invoke-rc.d). Only a policy-rc.d
    that denies it (exit 101, as container images ship) or a machine without any init
    blocks that start. Ours run apart, on our ports, so whatever the install started is
    stopped and disabled at once; a package installed earlier by someone else is left alone.
    """
    missing = [package for package, binary in OBSERVER_PACKAGES.items() if not binary.exists()]
    if not missing:
        return
    binaries = ", ".join(str(OBSERVER_PACKAGES[p]) for p in missing)
    if os.geteuid() != 0:
        raise StackError(
            f"{binaries} missing and installing needs root: run "
            f"`sudo apt-get install -y --no-install-recommends {' '.join(missing)}` "
            "(then stop the daemons it starts on 9090/9093: the stack runs its own)"
        )
    _say(f"{binaries} not found: installing Debian's {', '.join(missing)}")
    _apt_install(missing)
    _stop_packaged_daemons(missing)
    absent = [str(OBSERVER_PACKAGES[p]) for p in missing if not OBSERVER_PACKAGES[p].exists()]
    if absent:
        raise StackError(f"apt-get installed {', '.join(missing)} but {', '.join(absent)} did not appear")


def _stop_packaged_daemons(services: list[str]) -> None:
    """Stop and disable the daemons a package's postinst started (unit/init script named as the package)."""
    for service in services:
        if Path("/run/systemd/system").is_dir():
            subprocess.run(["systemctl", "disable", "--now", f"{service}.service"], capture_output=True)
            continue
        script = Path("/etc/init.d") / service
        if script.exists():
            subprocess.run([str(script), "stop"], capture_output=True)
        if shutil.which("update-rc.d"):
            subprocess.run(["update-rc.d", service, "disable"], capture_output=True)


def _pg_os_user() -> str | None:
    """PostgreSQL refuses to run as root: run it as the `postgres` system user then."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        _run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "postgres"],
            what="creating the postgres system user",
        )
    return "postgres"


def _pg_data_dir(os_user: str | None) -> Path:
    """Where the cluster lives: under .stack, unless the postgres user cannot reach it."""
    preferred = DATA / "postgres"
    if os_user is None:
        return preferred
    DATA.mkdir(parents=True, exist_ok=True)
    probe = subprocess.run(["runuser", "-u", os_user, "--", "test", "-x", str(DATA)], capture_output=True)
    if probe.returncode == 0:
        return preferred
    # A checkout below a private directory (e.g. /root) is not traversable by `postgres`.
    fallback = Path("/var/lib/flotilla-stack") / base64.b32encode(str(STACK_HOME).encode()).decode()[:16].lower()
    return fallback / "postgres"


def _port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((HOST, port)) == 0


def _port_holder(port: int) -> str:
    if shutil.which("ss"):
        out = subprocess.run(["ss", "-ltnpH", f"sport = :{port}"], capture_output=True, text=True).stdout
        if out.strip():
            return out.strip().split()[-1]
    return "an unknown process"


def _http_json(
    url: str, method: str = "GET", body: object | None = None, timeout: float = 5, auth: str | None = None
) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if auth is not None:  # user:password, HTTP basic
        req.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        raw = resp.read()
    return json.loads(raw) if raw else None


# --------------------------------------------------------------------- components


@dataclass
class Component:
    name: str
    port: int
    log: Path
    health: Callable[[], bool]
    version: Callable[[], str]

    @property
    def endpoint(self) -> str:
        return f"{HOST}:{self.port}"


def _pg_connect(dbname: str = "postgres", user: str = PG_USER, password: str = PG_PASSWORD) -> Connection[Any]:
    import psycopg  # the venv's; stackctl only runs from it

    return psycopg.connect(
        host=HOST,
        port=PORTS["postgres"],
        user=user,
        password=password,
        dbname=dbname,
        connect_timeout=3,
        autocommit=True,
    )


def _pg_health() -> bool:
    try:
        with _pg_connect() as conn:
            conn.execute("SELECT 1")
        return True
    except Exception:
        return False


def _pg_version() -> str:
    with _pg_connect() as conn:
        row = conn.execute("SHOW server_version").fetchone()
    return str(row[0]) if row else "?"


def _kafka_admin() -> AdminClient:
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": f"{HOST}:{PORTS['kafka']}", "socket.timeout.ms": 3000})


def _kafka_health() -> bool:
    if not _port_in_use(PORTS["kafka"]):
        return False
    try:
        md = _kafka_admin().list_topics(timeout=3)
        return bool(md.brokers)
    except Exception:
        return False


def _kafka_version() -> str:
    jars = sorted((DIST / "kafka" / "libs").glob("kafka_2.13-*.jar"))
    return jars[0].stem.split("-", 1)[1] if jars else "?"


def _connect_health() -> bool:
    try:
        _http_json(f"http://{HOST}:{PORTS['connect']}/connectors", timeout=3)
        return True
    except Exception:
        return False


def _connect_version() -> str:
    info = _http_json(f"http://{HOST}:{PORTS['connect']}/")
    # connectorsOnly=false lists the transforms too.
    plugins = _http_json(f"http://{HOST}:{PORTS['connect']}/connector-plugins?connectorsOnly=false")
    deb = [p["version"] for p in plugins if "Postgres" in p["class"]]
    ours = [p["version"] for p in plugins if p["class"] == "dev.flotilla.connect.DropNullHeaders"]
    return (
        f"{info['version']} (debezium-postgres {deb[0] if deb else 'missing'}, "
        f"flotilla-transforms {ours[0] if ours else 'missing'})"
    )


def _registry_health() -> bool:
    try:
        body = _http_json(f"http://{HOST}:{PORTS['registry-management']}/health/ready", timeout=3)
        return isinstance(body, dict) and body.get("status") == "UP"
    except Exception:
        return False


def _registry_version() -> str:
    info = _http_json(f"http://{HOST}:{PORTS['registry']}/apis/registry/v3/system/info")
    return f"apicurio {info['version']}"


def _ready(port: int) -> bool:
    """Prometheus' and Alertmanager's readiness: 200 on /-/ready once they serve."""
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}/-/ready", timeout=3) as resp:
            return bool(resp.status == 200)
    except Exception:
        return False


def _prometheus_health() -> bool:
    return _ready(PORTS["prometheus"])


def _alertmanager_health() -> bool:
    return _ready(PORTS["alertmanager"])


COMPONENTS = [
    Component("postgres", PORTS["postgres"], LOGS / "postgres.log", _pg_health, _pg_version),
    Component("kafka", PORTS["kafka"], LOGS / "kafka.log", _kafka_health, _kafka_version),
    Component("registry", PORTS["registry"], LOGS / "registry.log", _registry_health, _registry_version),
    Component("connect", PORTS["connect"], LOGS / "connect.log", _connect_health, _connect_version),
    Component(
        "prometheus",
        PORTS["prometheus"],
        LOGS / "prometheus.log",
        _prometheus_health,
        lambda: _binary_version(PROMETHEUS_BIN),
    ),
    Component(
        "alertmanager",
        PORTS["alertmanager"],
        LOGS / "alertmanager.log",
        _alertmanager_health,
        lambda: _binary_version(ALERTMANAGER_BIN),
    ),
]
BY_NAME = {c.name: c for c in COMPONENTS}
# Optional: only `model-up` starts it, `status` shows it when it runs, and the stack is
# healthy without it.
MODEL_COMPONENT = Component(
    "model-server", PORTS["model-server"], LOGS / "model-server.log", MODEL_SERVER.healthy, MODEL_SERVER.version
)
MODEL_UP_TIMEOUT_S = 120.0  # loading a 98 MB GGUF takes seconds; a cold page cache a few more
# Ports a component opens besides its main one, checked for squatters before start.
EXTRA_PORTS = {"kafka": ("kafka-controller",), "registry": ("registry-management",)}


# ------------------------------------------------------------------ preparation


def _mvn(args: list[str], *, what: str, log: Path) -> None:
    """Run Maven (batch mode, quiet); its whole output goes to ``log`` when it fails."""
    if not shutil.which("mvn"):
        raise StackError(
            "Maven (`mvn`) is required to fetch Kafka, Debezium and Apicurio from Maven Central "
            "and to build infra/connect-transforms, but is not on PATH. Install it, e.g. `apt-get install maven`."
        )
    _run(["mvn", "-B", "-q", *args], what=what, log=log)


def _fetch_dist() -> None:
    marker = DIST / ".complete"
    pom = LOCAL_DIR / "pom.xml"
    if marker.exists() and marker.read_text() == pom.read_text():
        return
    _say("fetching Kafka, Kafka Connect, Debezium and Apicurio from Maven Central (first run only)")
    shutil.rmtree(DIST, ignore_errors=True)
    _mvn(
        ["-f", str(pom), "package", f"-Dstack.dist={DIST}"],
        what="Maven fetch of the stack's JVM components",
        log=LOGS / "maven.log",
    )
    marker.write_text(pom.read_text())


def transforms_digest(src: Path = TRANSFORMS_SRC) -> str:
    """A digest of everything the transforms' jar is built from: the POM and src/main."""
    files = [src / "pom.xml", *sorted(p for p in (src / "src" / "main").rglob("*") if p.is_file())]
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.relative_to(src).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _build_transforms() -> bool:
    """Build infra/connect-transforms into Debezium's plugin folder when its sources changed.

    True when the jar was (re)built: a running Connect worker must then restart, as it
    scans plugin.path only at start. The JUnit tests run in `make test-transforms`, not here.
    """
    marker = TRANSFORMS_PLUGIN / ".flotilla-source-digest"
    digest = transforms_digest()
    if marker.exists() and marker.read_text() == digest:
        return False
    _say("building Flotilla's Kafka Connect transforms (infra/connect-transforms)")
    shutil.rmtree(TRANSFORMS_BUILD, ignore_errors=True)  # no jar of an earlier version left to pick up
    _mvn(
        ["-f", str(TRANSFORMS_SRC / "pom.xml"), "package", "-DskipTests", f"-Dtransforms.build.dir={TRANSFORMS_BUILD}"],
        what="Maven build of infra/connect-transforms",
        log=LOGS / "maven-transforms.log",
    )
    jars = sorted(TRANSFORMS_BUILD.glob(TRANSFORMS_JAR_GLOB))
    if len(jars) != 1:
        raise StackError(f"the infra/connect-transforms build left {len(jars)} jars in {TRANSFORMS_BUILD}, not one")
    if not TRANSFORMS_PLUGIN.is_dir():
        raise StackError(
            f"Debezium's plugin folder {TRANSFORMS_PLUGIN} is missing; remove {DIST / '.complete'} and run "
            "`make stack-up` to fetch it again"
        )
    shutil.rmtree(TRANSFORMS_OLD_PLUGIN, ignore_errors=True)
    for old in TRANSFORMS_PLUGIN.glob(TRANSFORMS_JAR_GLOB):
        old.unlink()
    shutil.copy2(jars[0], TRANSFORMS_PLUGIN / jars[0].name)
    marker.write_text(digest)
    return True


def _init_postgres(bindir: Path, os_user: str | None, pgdata: Path) -> None:
    if (pgdata / "PG_VERSION").exists():
        return
    _say(f"initialising PostgreSQL cluster in {pgdata}")
    pgdata.mkdir(parents=True, exist_ok=True)
    pwfile = pgdata.parent / ".pgpass-init"
    pwfile.write_text(PG_PASSWORD + "\n")
    if os_user:
        shutil.chown(pgdata.parent, os_user)
        shutil.chown(pgdata, os_user)
        shutil.chown(pwfile, os_user)
    cmd = [
        str(bindir / "initdb"),
        "-D",
        str(pgdata),
        "-U",
        PG_USER,
        f"--pwfile={pwfile}",
        "--auth-host=scram-sha-256",
        "--auth-local=trust",
        "-E",
        "UTF8",
        "--locale=C",
    ]
    if os_user:
        cmd = ["runuser", "-u", os_user, "--", *cmd]
    try:
        _run(cmd, what="initdb", log=LOGS / "initdb.log")
    finally:
        pwfile.unlink(missing_ok=True)
    conf = pgdata / "postgresql.conf"
    with conf.open("a") as f:
        f.write(
            "\n# --- flotilla local stack ---\n"
            f"listen_addresses = '{HOST}'\n"
            f"port = {PORTS['postgres']}\n"
            "unix_socket_directories = ''\n"
            "wal_level = logical\n"
            "max_wal_senders = 20\n"
            "max_replication_slots = 20\n"
            "max_connections = 200\n"
            "shared_buffers = 256MB\n"
            # The outbox hop waits on the WAL: write it out promptly so Debezium sees a
            # commit within a few ms instead of after the default 200 ms writer delay.
            "wal_writer_delay = 10ms\n"
            "logging_collector = off\n"
        )


def render_template(template: Path, **values: object) -> str:
    """``template`` with each ``$name`` replaced by its value written as JSON, which YAML
    reads as the same scalar: a path or URL needs no quoting of its own, and a name the
    template uses but the caller forgot is an error, not an empty field."""
    return string.Template(template.read_text()).substitute({k: json.dumps(v) for k, v in values.items()})


def prometheus_config(every: float = 1.0, *, rules: bool = True) -> str:
    """The local Prometheus: scrape the sim (the estate) and evaluate the estate rules every
    ``every`` seconds, alerting to our Alertmanager; ``rules=False``: neither rules nor alerts
    (a storm, where the agent's own readings open incidents)."""
    from flotilla.fleet import SIM  # here, not at the top: importing flotilla takes a second or two

    if every <= 0:
        raise StackError(f"Prometheus cannot scrape every {every:g} s")
    rendered = render_template(
        PROMETHEUS_TEMPLATE,
        sim_target=f"{HOST}:{SIM.http_port}",
        rule_file=str(ESTATE_RULES),
        alertmanager_target=f"{HOST}:{PORTS['alertmanager']}",
        scrape_interval=f"{round(every * 1000)}ms",
        scrape_timeout=f"{round(every * 900)}ms",  # a scrape must end before the next one
    )
    if rules:
        return rendered
    import yaml

    config = yaml.safe_load(rendered)
    config.pop("rule_files", None)
    config.pop("alerting", None)
    return yaml.safe_dump(config, sort_keys=False)


def prometheus_pace(every: float, *, rules: bool = True) -> None:
    """Re-render the running Prometheus' config at another pace and reload it. The file is
    replaced whole (a signal mid-write once left Prometheus an empty config), so a restart
    (the chaos soak kills it) keeps the pace; ``stackctl up`` renders the default again."""
    target = RUN / "prometheus.yml"
    partial = target.with_suffix(".pace-tmp")
    partial.write_text(prometheus_config(every, rules=rules))
    partial.replace(target)
    try:
        _http_json(f"http://{HOST}:{PORTS['prometheus']}/-/reload", method="POST", timeout=30)
    except OSError as exc:
        raise StackError(f"Prometheus did not reload {target}: {exc} (is the stack up?)") from exc


def alertmanager_config() -> str:
    """The local Alertmanager: every alert to the health agent's webhook, with the stack's bearer token."""
    from flotilla.fleet import HEALTH, url

    return render_template(
        ALERTMANAGER_TEMPLATE,
        webhook_url=f"{url(HEALTH)}/alerts",
        token_file=str(ALERT_WEBHOOK_TOKEN_FILE),
    )


def prometheus_command(config: Path) -> list[str]:
    return [
        str(PROMETHEUS_BIN),
        f"--config.file={config}",
        f"--storage.tsdb.path={DATA / 'prometheus'}",
        "--storage.tsdb.retention.time=1d",
        f"--web.listen-address={HOST}:{PORTS['prometheus']}",
        "--web.enable-lifecycle",  # POST /-/reload picks up an edited rule file
    ]


def alertmanager_command(config: Path) -> list[str]:
    return [
        str(ALERTMANAGER_BIN),
        f"--config.file={config}",
        f"--storage.path={DATA / 'alertmanager'}",
        f"--web.listen-address={HOST}:{PORTS['alertmanager']}",
        "--cluster.listen-address=",  # empty: no HA gossip (it would listen on 0.0.0.0:9094)
    ]


def _write_configs(java: str, registry_java: str, pg_bindir: Path, pg_user: str | None, pgdata: Path) -> Path:
    """Render every process's config into .stack/run and return supervisord's."""
    from flotilla.delivery import worker_exactly_once_source_support

    for d in (RUN, LOGS, DATA / "kafka", DATA / "connect", DATA / "prometheus", DATA / "alertmanager"):
        d.mkdir(parents=True, exist_ok=True)
    prometheus_yml = RUN / "prometheus.yml"
    prometheus_yml.write_text(prometheus_config())
    alertmanager_yml = RUN / "alertmanager.yml"
    alertmanager_yml.write_text(alertmanager_config())
    libs = DIST / "kafka" / "libs"
    kafka_props = RUN / "kafka.properties"
    kafka_props.write_text(
        "process.roles=broker,controller\n"
        "node.id=1\n"
        f"controller.quorum.voters=1@{HOST}:{PORTS['kafka-controller']}\n"
        f"listeners=PLAINTEXT://{HOST}:{PORTS['kafka']},CONTROLLER://{HOST}:{PORTS['kafka-controller']}\n"
        f"advertised.listeners=PLAINTEXT://{HOST}:{PORTS['kafka']}\n"
        "controller.listener.names=CONTROLLER\n"
        "inter.broker.listener.name=PLAINTEXT\n"
        "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT\n"
        f"log.dirs={DATA / 'kafka'}\n"
        "num.partitions=6\n"
        "offsets.topic.replication.factor=1\n"
        "transaction.state.log.replication.factor=1\n"
        "transaction.state.log.min.isr=1\n"
        "share.coordinator.state.topic.replication.factor=1\n"
        "share.coordinator.state.topic.min.isr=1\n"
        "group.initial.rebalance.delay.ms=0\n"
        "auto.create.topics.enable=false\n"
        "num.network.threads=2\n"
        "num.io.threads=4\n"
    )
    connect_props = RUN / "connect.properties"
    connect_props.write_text(
        f"bootstrap.servers={HOST}:{PORTS['kafka']}\n"
        "group.id=flotilla-connect\n"
        "config.storage.topic=_connect-configs\n"
        "offset.storage.topic=_connect-offsets\n"
        "status.storage.topic=_connect-status\n"
        "config.storage.replication.factor=1\n"
        "offset.storage.replication.factor=1\n"
        "status.storage.replication.factor=1\n"
        # KIP-618's tasks read the offsets topic to its end after every poll (Debezium flushes
        # the slot's LSN from what it reads); one partition, not Connect's 25, keeps that read cheap.
        "offset.storage.partitions=1\n"
        "offset.flush.interval.ms=1000\n"
        # KIP-618 or not (flotilla.delivery): enabled, each poll batch of an outbox connector and
        # its source offset commit in one Kafka transaction, so a killed worker re-publishes
        # nothing; disabled, offsets commit every offset.flush.interval.ms beside the rows.
        f"exactly.once.source.support={worker_exactly_once_source_support(outbox_delivery())}\n"
        # Kafka 4 producers linger 5 ms by default; an outbox hop should not wait for a batch.
        "producer.linger.ms=0\n"
        "key.converter=org.apache.kafka.connect.storage.StringConverter\n"
        "value.converter=org.apache.kafka.connect.converters.ByteArrayConverter\n"
        f"listeners=http://{HOST}:{PORTS['connect']}\n"
        f"rest.advertised.host.name={HOST}\n"
        f"rest.advertised.port={PORTS['connect']}\n"
        f"plugin.path={CONNECT_PLUGINS}\n"
        "plugin.discovery=hybrid_warn\n"
        # Connector definitions name their database password as ${env:...}, so the same
        # JSON works here and in docker compose without a secret in the file.
        "config.providers=env\n"
        "config.providers.env.class=org.apache.kafka.common.config.provider.EnvVarConfigProvider\n"
    )
    log4j = LOCAL_DIR / "log4j2.properties"
    if not (DATA / "kafka" / "meta.properties").exists():
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        _say("formatting Kafka storage (KRaft)")
        _run(
            [
                java,
                "-cp",
                f"{libs}/*",
                f"-Dlog4j2.configurationFile={log4j}",
                "kafka.tools.StorageTool",
                "format",
                "-t",
                cluster_id,
                "-c",
                str(kafka_props),
            ],
            what="Kafka storage format",
            log=LOGS / "kafka-format.log",
        )

    env_common = {**stack_env(), "LOG_DIR": str(LOGS)}

    def env_line(extra: dict[str, str]) -> str:
        merged = {**env_common, **extra}
        return ",".join(f'{k}="{v}"' for k, v in merged.items())

    registry_env = {
        **REGISTRY_AUTH_ENV,
        "QUARKUS_CONFIG_LOCATIONS": str(REGISTRY_USERS_FILE),
        "APICURIO_STORAGE_KIND": "sql",
        "APICURIO_STORAGE_SQL_KIND": "postgresql",
        "APICURIO_DATASOURCE_URL": f"jdbc:postgresql://{HOST}:{PORTS['postgres']}/registry",
        "APICURIO_DATASOURCE_USERNAME": PG_USER,
        "APICURIO_DATASOURCE_PASSWORD": PG_PASSWORD,
        "QUARKUS_HTTP_HOST": HOST,
        "QUARKUS_HTTP_PORT": str(PORTS["registry"]),
        "QUARKUS_MANAGEMENT_HOST": HOST,
        "QUARKUS_MANAGEMENT_PORT": str(PORTS["registry-management"]),
        "QUARKUS_LOG_CONSOLE_JSON": "false",
        "APICURIO_REST_DELETION_ARTIFACT_ENABLED": "true",
        "APICURIO_REST_DELETION_ARTIFACT_VERSION_ENABLED": "true",
        "APICURIO_REST_DELETION_GROUP_ENABLED": "true",
    }
    _write_registry_users(registrar_credentials())
    pg_user_line = f"user={pg_user}\n" if pg_user else ""
    jvm_kafka = f'{JVM_COMMON} -Dlog4j2.configurationFile={log4j} -Dkafka.logs.dir={LOGS} -cp "{libs}/*"'
    conf = RUN / "supervisord.conf"
    conf.write_text(
        SUPERVISOR.header(LOGS, pwd.getpwuid(os.geteuid()).pw_name)
        + f"""
[program:postgres]
command={pg_bindir / "postgres"} -D {pgdata}
{pg_user_line}autostart=false
autorestart=true
startretries=20
startsecs=2
stopsignal=INT
stopwaitsecs=60
redirect_stderr=true
stdout_logfile={LOGS / "postgres.log"}

[program:kafka]
command={java} {KAFKA_HEAP} {jvm_kafka} kafka.Kafka {kafka_props}
autostart=false
autorestart=true
startretries=20
startsecs=3
stopsignal=TERM
stopwaitsecs=60
redirect_stderr=true
stdout_logfile={LOGS / "kafka.log"}
environment={env_line({})}

[program:registry]
command={registry_java} {REGISTRY_HEAP} {JVM_COMMON} -jar {DIST / "apicurio" / "quarkus-run.jar"}
directory={DIST / "apicurio"}
autostart=false
autorestart=true
startretries=20
startsecs=3
stopsignal=TERM
stopwaitsecs=30
redirect_stderr=true
stdout_logfile={LOGS / "registry.log"}
environment={env_line(registry_env)}

[program:connect]
command={java} {CONNECT_HEAP} {jvm_kafka} org.apache.kafka.connect.cli.ConnectDistributed {connect_props}
autostart=false
autorestart=true
startretries=20
startsecs=3
stopsignal=TERM
stopwaitsecs=60
redirect_stderr=true
stdout_logfile={LOGS / "connect.log"}
environment={env_line({})}

[program:{TXN_WATCHDOG}]
command={sys.executable} {LOCAL_DIR / "txn_watchdog.py"} --bootstrap {HOST}:{PORTS["kafka"]} --java {java}
    --kafka-libs {libs} --log4j-config {LOCAL_DIR / "log4j2-tools.properties"} --record {TXN_WATCHDOG_RECORD}
autostart=false
autorestart=true
startretries=20
startsecs=2
stopsignal=TERM
stopwaitsecs=10
redirect_stderr=true
stdout_logfile={LOGS / f"{TXN_WATCHDOG}.log"}

[program:alertmanager]
command={" ".join(alertmanager_command(alertmanager_yml))}
autostart=false
autorestart=true
startretries=20
startsecs=2
stopsignal=TERM
stopwaitsecs=30
redirect_stderr=true
stdout_logfile={LOGS / "alertmanager.log"}

[program:model-server]
command={" ".join(MODEL_SERVER.command())}
autostart=false
autorestart=true
startretries=5
startsecs=2
stopsignal=TERM
stopwaitsecs=15
redirect_stderr=true
stdout_logfile={LOGS / "model-server.log"}

[program:prometheus]
command={" ".join(prometheus_command(prometheus_yml))}
autostart=false
autorestart=true
startretries=20
startsecs=2
stopsignal=TERM
stopwaitsecs=30
redirect_stderr=true
stdout_logfile={LOGS / "prometheus.log"}
"""
    )
    return conf


# --------------------------------------------------------------------- control


def _wait_healthy(comp: Component, timeout: float) -> None:
    SUPERVISOR.wait_until_up(
        comp.name, comp.health, endpoint=comp.endpoint, log=comp.log, timeout=timeout, interval=0.5
    )


def _start(comp: Component, timeout: float, *, restart: bool = False) -> None:
    """Start a component unless it runs healthy; ``restart`` restarts a running one (new plugins)."""
    state = SUPERVISOR.states().get(comp.name)
    if state == "RUNNING" and comp.health() and not restart:
        return
    t0 = time.monotonic()
    if state == "RUNNING" and restart:
        _say(f"restarting {comp.name} on {comp.endpoint}")
        SUPERVISOR.ctl("restart", comp.name, check=False)
    else:
        _say(f"starting {comp.name} on {comp.endpoint}")
    if state != "RUNNING":
        SUPERVISOR.ctl("start", comp.name, check=False)
    _wait_healthy(comp, timeout)
    _say(f"{comp.name} healthy after {time.monotonic() - t0:.1f}s")


def _ensure_databases() -> None:
    with _pg_connect() as conn:
        existing = {r[0] for r in conn.execute("SELECT datname FROM pg_database").fetchall()}
        for db in PG_DATABASES:
            if db not in existing:
                conn.execute(f'CREATE DATABASE "{db}"')
        conn.execute(f'ALTER ROLE "{PG_USER}" WITH REPLICATION')


def _ensure_topics() -> None:
    from confluent_kafka.cimpl import NewTopic

    admin = _kafka_admin()
    existing = set(admin.list_topics(timeout=10).topics)
    new = [
        NewTopic(name, num_partitions=parts, replication_factor=1, config=cfg)
        for name, (parts, cfg) in TOPICS.items()
        if name not in existing
    ]
    if new:
        for name, fut in admin.create_topics(new, request_timeout=15).items():
            fut.result()
            _say(f"created topic {name}")


def _ensure_compatibility() -> None:
    url = f"http://{HOST}:{PORTS['registry']}/apis/ccompat/v7/config"
    current = _http_json(url)  # a read: anonymous
    level = current.get("compatibilityLevel") if isinstance(current, dict) else None
    if level != GLOBAL_COMPATIBILITY:  # a write: as the registrar
        body = {"compatibility": GLOBAL_COMPATIBILITY}
        _http_json(url, method="PUT", body=body, auth=registrar_credentials())
        _say(f"registry global compatibility set to {GLOBAL_COMPATIBILITY}")


def _registry_requires_credentials(conf: Path) -> bool:
    """Whether supervisord's config (written by this checkout or an older one) runs the
    registry with anonymous writes refused."""
    if not conf.exists():
        return False
    section = conf.read_text().partition("[program:registry]")[2].partition("\n[")[0]
    return all(f'{k}="{v}"' in section for k, v in REGISTRY_AUTH_ENV.items()) and "QUARKUS_CONFIG_LOCATIONS=" in section


def write_env_file() -> None:
    STACK_HOME.mkdir(parents=True, exist_ok=True)
    lines = ["# written by infra/local/stackctl.py; read by the Makefile, services and tests"]
    # A value with blanks, quotes or $ goes in single quotes, which python-dotenv (what the
    # settings read it with) takes literally: a PromQL override holds all three.
    settings = {**stack_env(), **LOCAL_ESTATE}
    lines += [f"{k}='{v}'" if any(c in v for c in ' "#$') else f"{k}={v}" for k, v in settings.items()]
    ENV_FILE.write_text("\n".join(lines) + "\n")


def _preflight_ports() -> None:
    """Fail fast, before any download or start, when a port we need is someone else's."""
    states = SUPERVISOR.states()
    for comp in COMPONENTS:
        if states.get(comp.name) == "RUNNING":
            continue  # ours
        for key in (comp.name, *EXTRA_PORTS.get(comp.name, ())):
            port = PORTS[key]
            if _port_in_use(port):
                raise StackError(
                    f"port {port} ({key}) for {comp.name} is held by {_port_holder(port)}, not by this stack; "
                    f"stop that process or move the stack with {PORT_ENV[key]} "
                    "(see docs/operations/local-stack.md)"
                )


def up() -> None:
    t0 = time.monotonic()
    java, major = _java(17, "Kafka 4 and Debezium 3")
    registry_java, registry_major = _java(21, "Apicurio Registry 3.3")
    _preflight_ports()
    LOGS.mkdir(parents=True, exist_ok=True)
    _fetch_dist()
    transforms_rebuilt = _build_transforms()
    pg_bindir = _pg_bindir()
    _observer_binaries()
    pg_user = _pg_os_user()
    pgdata = _pg_data_dir(pg_user)
    if pgdata != DATA / "postgres" and pgdata.exists() and not (DATA / "kafka").exists():
        # A cluster outside .stack left by an earlier checkout at this path: its
        # replication slots and registry ids would not match a fresh Kafka. Start clean.
        shutil.rmtree(pgdata)
    ensure_private_token(ALERT_WEBHOOK_TOKEN_FILE, what="the alert webhook's bearer token")
    registrar_credentials()
    if not SUPERVISOR.running():
        _init_postgres(pg_bindir, pg_user, pgdata)
        _write_configs(java, registry_java, pg_bindir, pg_user, pgdata)
        SUPERVISOR.launch(LOGS / "supervisord-start.log")
    else:
        missing = [c.name for c in COMPONENTS if c.name not in SUPERVISOR.states()]
        if missing:  # its config was written by an older checkout
            raise StackError(
                f"the running stack's supervisord has no {', '.join(missing)}: "
                "`make stack-down stack-up` adds them (data is kept)"
            )
        if not _registry_requires_credentials(RUN / "supervisord.conf"):
            _say(
                "warning: the running registry accepts anonymous writes (its config is older than "
                "this checkout): `make stack-down stack-up` makes it require the registrar's credentials"
            )
    write_env_file()
    _start(BY_NAME["postgres"], 60)
    _ensure_databases()
    _start(BY_NAME["kafka"], UP_TIMEOUT_S)
    _ensure_topics()
    _start(BY_NAME["registry"], UP_TIMEOUT_S)
    _ensure_compatibility()
    _start(BY_NAME["connect"], UP_TIMEOUT_S, restart=transforms_rebuilt)
    _start(BY_NAME["alertmanager"], 60)  # before Prometheus, which sends it the alerts
    _start(BY_NAME["prometheus"], 60)
    watchdog = SUPERVISOR.states().get(TXN_WATCHDOG)
    if watchdog is None:  # supervisord runs a config written by an older checkout
        _say(f"no {TXN_WATCHDOG} in the running supervisord: `make stack-down stack-up` to add it")
    elif watchdog != "RUNNING":
        SUPERVISOR.ctl("start", TXN_WATCHDOG, check=False)
    took = time.monotonic() - t0
    _say(f"stack up in {took:.1f}s (java {major}, registry on java {registry_major}); settings in {ENV_FILE}")


def _install_model_server() -> None:
    """Build the model server's venv unless it holds what model-server.txt pins."""
    if MODEL_SERVER.installed():
        return
    missing = [tool for tool in ("cmake", "c++") if not shutil.which(tool)]
    if missing:
        if os.geteuid() != 0:
            raise StackError(
                f"{' and '.join(missing)} needed to build llama-cpp-python and installing needs root: "
                "run `sudo apt-get install -y --no-install-recommends cmake g++ make`"
            )
        _say(f"{', '.join(missing)} not found: installing Debian's cmake, g++ and make")
        _apt_install(["cmake", "g++", "make"])
    _say(
        "building the model server (llama-cpp-python from source: about 6 minutes on 2 cores, "
        "first run only; pip keeps the wheel)"
    )
    t0 = time.monotonic()
    shutil.rmtree(MODEL_SERVER.home, ignore_errors=True)
    MODEL_SERVER.home.mkdir(parents=True)
    # llama.cpp's CMake build runs one compiler per core it is given.
    env = dict(os.environ, CMAKE_BUILD_PARALLEL_LEVEL=str(os.cpu_count() or 2))
    for step in MODEL_SERVER.install_steps(sys.executable):
        _run(step, what="the model server's install", log=LOGS / "model-server-install.log", env=env)
    MODEL_SERVER.record_installed()
    _say(f"model server built in {time.monotonic() - t0:.0f}s")


def model_up() -> None:
    """Start the model server on a running stack, building it first if needed."""
    if not SUPERVISOR.running():
        raise StackError("the stack is not running: `make stack-up` (or `make model-up`, which starts it)")
    states = SUPERVISOR.states()
    if MODEL_COMPONENT.name not in states:
        raise StackError(
            "the running stack's supervisord has no model-server: `make stack-down stack-up` adds it (data is kept)"
        )
    if states[MODEL_COMPONENT.name] != "RUNNING" and _port_in_use(MODEL_COMPONENT.port):
        raise StackError(
            f"port {MODEL_COMPONENT.port} (model-server) is held by {_port_holder(MODEL_COMPONENT.port)}, "
            f"not by this stack; move the model server with {PORT_ENV['model-server']}"
        )
    model_server_key()
    _install_model_server()
    _sync_model_program()
    # running but refusing our key (a key file made again since it started): restart it
    stale = SUPERVISOR.states().get(MODEL_COMPONENT.name) == "RUNNING" and not MODEL_SERVER.healthy()
    _start(MODEL_COMPONENT, MODEL_UP_TIMEOUT_S, restart=stale)
    _say(
        f"model server: FLOTILLA_LLM_BASE_URL={MODEL_SERVER.url} FLOTILLA_LLM_MODEL={MODEL_ALIAS} "
        f"FLOTILLA_LLM_API_KEY_FILE={MODEL_SERVER.key_file}"
    )


def model_server_key() -> str:
    """The model server's API key (made the first time): the server refuses a request without it."""
    return ensure_private_token(MODEL_SERVER.key_file, what="the model server's API key")


def _sync_model_program() -> None:
    """Give the running supervisord this checkout's model-server command (one written by an
    older checkout started the server without its key). Only that program is replaced:
    ``update model-server`` leaves the rest of the stack running."""
    conf = SUPERVISOR.conf.read_text()
    head, section, rest = conf.partition("[program:model-server]\n")
    body, bracket, tail = rest.partition("\n[")
    wanted = f"command={' '.join(MODEL_SERVER.command())}"
    lines = body.splitlines()
    if not section or wanted in lines:
        return
    body = "\n".join(wanted if line.startswith("command=") else line for line in lines)
    SUPERVISOR.conf.write_text(head + section + body + bracket + tail)
    SUPERVISOR.ctl("reread")
    SUPERVISOR.ctl("update", MODEL_COMPONENT.name)
    _say("model server: supervisord given this checkout's command (with its API key)")


def model_down() -> None:
    if SUPERVISOR.states().get(MODEL_COMPONENT.name) == "RUNNING":
        SUPERVISOR.ctl("stop", MODEL_COMPONENT.name, check=False)
        _say("model server stopped")


def down() -> None:
    if not SUPERVISOR.running():
        _say("stack is not running")
        return
    # Reverse dependency order: Prometheus before the Alertmanager it alerts, Connect and the
    # registry before Kafka and PostgreSQL.
    SUPERVISOR.shutdown(
        [MODEL_COMPONENT.name, TXN_WATCHDOG, "prometheus", "alertmanager", "connect", "registry", "kafka", "postgres"]
    )
    _say("stack stopped (data kept in " + str(DATA) + ")")


def reset() -> None:
    down()
    pgdata = _pg_data_dir(_pg_os_user()) if os.geteuid() == 0 else DATA / "postgres"
    shutil.rmtree(DATA, ignore_errors=True)
    shutil.rmtree(pgdata, ignore_errors=True)
    shutil.rmtree(RUN, ignore_errors=True)
    ENV_FILE.unlink(missing_ok=True)
    _say("stack data wiped")


def status(as_json: bool) -> int:
    states = SUPERVISOR.states()
    rows = []
    optional = [MODEL_COMPONENT] if states.get(MODEL_COMPONENT.name) == "RUNNING" else []
    for comp in [*COMPONENTS, *optional]:
        healthy = comp.health()
        version = ""
        if healthy:
            try:
                version = comp.version()
            except Exception as exc:  # a status line must never crash the status command
                version = f"? ({exc.__class__.__name__})"
        rows.append(
            {
                "component": comp.name,
                "state": "up" if healthy else "down",
                "supervisor": states.get(comp.name, "-"),
                "endpoint": comp.endpoint,
                "version": version,
                "log": str(comp.log),
            }
        )
    if as_json:
        print(json.dumps(rows, indent=2))
    else:
        for r in rows:
            print(f"{r['component']:<12} {r['state']:<5} {r['endpoint']:<16} {r['version'] or '-':<40} {r['log']}")
    return 0 if all(r["state"] == "up" for r in rows) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "action",
        choices=["up", "down", "reset", "status", "env", "pid", "model-up", "model-down", "fetch", "prometheus-pace"],
    )
    parser.add_argument("component", nargs="?", help=f"with pid: one component ({', '.join(BY_NAME)})")
    parser.add_argument("--json", action="store_true", help="machine-readable status")
    parser.add_argument(
        "--every", type=float, default=1.0, help="with prometheus-pace: seconds between scrapes (default 1)"
    )
    parser.add_argument("--no-rules", action="store_true", help="with prometheus-pace: no alert rules, no alerting")
    args = parser.parse_args(argv)
    try:
        if args.action == "up":
            up()
        elif args.action == "down":
            down()
        elif args.action == "model-up":
            model_up()
        elif args.action == "model-down":
            model_down()
        elif args.action == "reset":
            reset()
        elif args.action == "env":
            write_env_file()
            print(ENV_FILE)
        elif args.action == "fetch":  # the JVM parts from Maven Central only (compose's stand-ins reuse them)
            _fetch_dist()
        elif args.action == "prometheus-pace":  # storms and the long soak over thousands of services
            prometheus_pace(args.every, rules=not args.no_rules)
        elif args.action == "pid":  # what the chaos soak SIGKILLs (supervisord starts it again)
            print(SUPERVISOR.ctl("pid", args.component or "all").strip())
        else:
            return status(args.json)
    except StackError as exc:
        print(f"[stack] ERROR: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
