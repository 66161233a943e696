"""stackctl's fail-fast checks, run as the operator runs it, against a throwaway stack home.

Every run gets FLOTILLA_STACK_HOME in a temporary directory and every FLOTILLA_*_PORT set
to a port free at the start of the test, so nothing here touches a real stack. ``up`` is
only driven into its early refusals (Java, a squatted port, Maven), which happen before
anything is downloaded or started. The build of our Connect transforms is run for real
(Maven, into the throwaway home), and Connect's restart after a rebuild against a
stand-in supervisor.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.support.scripts import load_script

REPO_ROOT = Path(__file__).resolve().parents[2]
STACKCTL = REPO_ROOT / "infra" / "local" / "stackctl.py"
JAVA17_HOME = Path("/usr/lib/jvm/java-17-openjdk-amd64")
JVM_ROOT = Path("/usr/lib/jvm")

# stackctl's port keys and the variable that moves each.
PORT_VARS = {
    "postgres": "FLOTILLA_PG_PORT",
    "kafka": "FLOTILLA_KAFKA_PORT",
    "kafka-controller": "FLOTILLA_KAFKA_CONTROLLER_PORT",
    "registry": "FLOTILLA_REGISTRY_PORT",
    "registry-management": "FLOTILLA_REGISTRY_MANAGEMENT_PORT",
    "connect": "FLOTILLA_CONNECT_PORT",
}
COMPONENTS = ("postgres", "kafka", "registry", "connect")


def _java_major(java: Path) -> int | None:
    try:
        out = subprocess.run([str(java), "-version"], capture_output=True, text=True, timeout=30).stderr
    except OSError:
        return None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    if not match:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def _majors(javas: list[Path]) -> set[int]:
    return {m for j in javas if j.exists() and (m := _java_major(j)) is not None}


def _jvm_root_majors() -> set[int]:
    return _majors(sorted(JVM_ROOT.glob("*/bin/java")))


def _ambient_majors() -> set[int]:
    """Java versions stackctl would find in this process's environment."""
    javas = []
    if os.environ.get("JAVA_HOME"):
        javas.append(Path(os.environ["JAVA_HOME"]) / "bin" / "java")
    on_path = shutil.which("java")
    if on_path:
        javas.append(Path(on_path))
    root = Path(os.environ.get("FLOTILLA_JVM_ROOT", str(JVM_ROOT)))
    javas += sorted(root.glob("*/bin/java"))
    return _majors(javas)


def _free_ports(n: int) -> list[int]:
    sockets = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@pytest.fixture
def ports() -> dict[str, int]:
    return dict(zip(PORT_VARS, _free_ports(len(PORT_VARS)), strict=True))


@pytest.fixture
def stack_home(tmp_path: Path) -> Path:
    return tmp_path / "stack"


@pytest.fixture
def base_env(ports: dict[str, int], stack_home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOTILLA_")}
    env["FLOTILLA_STACK_HOME"] = str(stack_home)
    for key, var in PORT_VARS.items():
        env[var] = str(ports[key])
    return env


def _stackctl(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(STACKCTL), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        cwd=REPO_ROOT,
    )


def _listen(port: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen(8)
    return s


@pytest.fixture
def squatter(ports: dict[str, int]) -> Iterator[dict[str, socket.socket]]:
    held: dict[str, socket.socket] = {}
    yield held
    for s in held.values():
        s.close()


@pytest.fixture
def java_available() -> None:
    majors = _ambient_majors()
    if not any(m >= 17 for m in majors) or not any(m >= 21 for m in majors):
        pytest.skip(f"stackctl up needs Java 17 and 21 before its port preflight; found {sorted(majors)}")


# ------------------------------------------------------------- port preflight


@pytest.mark.usefixtures("java_available")
@pytest.mark.parametrize(
    ("key", "component"),
    [("postgres", "postgres"), ("kafka", "kafka"), ("kafka-controller", "kafka"), ("registry-management", "registry")],
)
def test_up_refuses_a_port_held_by_another_process(
    base_env: dict[str, str],
    ports: dict[str, int],
    stack_home: Path,
    squatter: dict[str, socket.socket],
    key: str,
    component: str,
) -> None:
    port = ports[key]
    squatter[key] = _listen(port)
    proc = _stackctl(base_env, "up")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert str(port) in proc.stderr
    assert f"for {component}" in proc.stderr
    assert f"({key})" in proc.stderr
    assert "held by" in proc.stderr
    assert "ERROR" in proc.stderr
    # Refused before any download or start: nothing was written under the stack home.
    assert not (stack_home / "dist").exists()
    assert not (stack_home / "logs").exists()
    assert not (stack_home / "stack.env").exists()


@pytest.mark.usefixtures("java_available")
def test_a_busy_port_hint_names_the_variable_stackctl_reads(
    base_env: dict[str, str], ports: dict[str, int], squatter: dict[str, socket.socket]
) -> None:
    squatter["postgres"] = _listen(ports["postgres"])
    proc = _stackctl(base_env, "up")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert PORT_VARS["postgres"] in proc.stderr


@pytest.mark.usefixtures("java_available")
def test_a_busy_port_hint_names_the_variable_for_other_ports(
    base_env: dict[str, str], ports: dict[str, int], squatter: dict[str, socket.socket]
) -> None:
    squatter["kafka-controller"] = _listen(ports["kafka-controller"])
    proc = _stackctl(base_env, "up")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert PORT_VARS["kafka-controller"] in proc.stderr


# ---------------------------------------------------------------------- tools


def test_up_without_java_names_java_17(base_env: dict[str, str], tmp_path: Path, stack_home: Path) -> None:
    empty_bin = tmp_path / "bin"
    empty_jvms = tmp_path / "jvm"
    empty_bin.mkdir()
    empty_jvms.mkdir()
    env = dict(base_env, PATH=str(empty_bin), FLOTILLA_JVM_ROOT=str(empty_jvms))
    env.pop("JAVA_HOME", None)
    proc = _stackctl(env, "up")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Java 17" in proc.stderr
    assert "JAVA_HOME" in proc.stderr
    assert not (stack_home / "logs").exists()


def _java17_only_path(tmp_path: Path) -> Path:
    java = JAVA17_HOME / "bin" / "java"
    if not java.exists():
        pytest.skip(f"{java} is not installed")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "java").symlink_to(java)
    return bin_dir


def test_up_with_java_17_but_no_java_21_names_the_registry(base_env: dict[str, str], tmp_path: Path) -> None:
    bin_dir = _java17_only_path(tmp_path)
    empty_jvms = tmp_path / "jvm"
    empty_jvms.mkdir()
    env = dict(base_env, PATH=str(bin_dir), JAVA_HOME=str(JAVA17_HOME), FLOTILLA_JVM_ROOT=str(empty_jvms))
    proc = _stackctl(env, "up")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Java 21" in proc.stderr
    assert "Apicurio" in proc.stderr


def test_up_without_maven_names_maven(base_env: dict[str, str], tmp_path: Path, stack_home: Path) -> None:
    bin_dir = _java17_only_path(tmp_path)
    if not any(m >= 21 for m in _jvm_root_majors()):
        pytest.skip(f"no Java 21+ under {JVM_ROOT} for the registry check that precedes the Maven one")
    env = dict(base_env, PATH=str(bin_dir), JAVA_HOME=str(JAVA17_HOME))
    env.pop("FLOTILLA_JVM_ROOT", None)
    proc = _stackctl(env, "up")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Maven" in proc.stderr
    assert "mvn" in proc.stderr
    assert not (stack_home / "dist" / ".complete").exists()


# --------------------------------------------------------------------- status


def test_status_json_reports_every_component_down(base_env: dict[str, str], ports: dict[str, int]) -> None:
    proc = _stackctl(base_env, "status", "--json")
    assert proc.returncode != 0, proc.stdout
    assert proc.returncode == 1
    rows = json.loads(proc.stdout)
    assert [r["component"] for r in rows] == list(COMPONENTS)
    for row in rows:
        assert row["state"] == "down", row
        assert row["supervisor"] == "-"
        assert row["version"] == ""
        assert row["endpoint"] == f"127.0.0.1:{ports[row['component']]}"
        assert row["log"].startswith(base_env["FLOTILLA_STACK_HOME"])


def test_status_text_lists_every_component(base_env: dict[str, str]) -> None:
    proc = _stackctl(base_env, "status")
    assert proc.returncode == 1
    lines = proc.stdout.strip().splitlines()
    assert [line.split()[0] for line in lines] == list(COMPONENTS)
    assert all(line.split()[1] == "down" for line in lines)


def test_an_unknown_action_is_a_usage_error(base_env: dict[str, str]) -> None:
    proc = _stackctl(base_env, "launch")
    assert proc.returncode == 2
    assert "invalid choice" in proc.stderr


# ------------------------------------------------------ our Connect transforms


@pytest.fixture
def stackctl_at(stack_home: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """stackctl loaded with its home in a temporary directory (nothing of a real stack is touched)."""
    monkeypatch.setenv("FLOTILLA_STACK_HOME", str(stack_home))
    return load_script("_stackctl_transforms_under_test", STACKCTL)


def _copy_transforms_src(tmp_path: Path) -> Path:
    src = tmp_path / "connect-transforms"
    shutil.copytree(REPO_ROOT / "infra" / "connect-transforms", src, ignore=shutil.ignore_patterns("target"))
    return src


def test_transforms_digest_follows_the_pom_and_main_sources_only(stackctl_at: ModuleType, tmp_path: Path) -> None:
    src = _copy_transforms_src(tmp_path)
    first = stackctl_at.transforms_digest(src)
    assert first == stackctl_at.transforms_digest(src)

    (src / "src" / "test" / "java" / "Scratch.java").write_text("class Scratch {}\n")
    (src / "target").mkdir()
    (src / "target" / "stale.jar").write_bytes(b"PK")
    assert stackctl_at.transforms_digest(src) == first, "tests and build output do not change the jar"

    java = next((src / "src" / "main" / "java").rglob("DropNullHeaders.java"))
    java.write_text(java.read_text() + "\n// edited\n")
    edited = stackctl_at.transforms_digest(src)
    assert edited != first

    (src / "src" / "main" / "resources" / "extra.properties").write_text("a=b\n")
    added = stackctl_at.transforms_digest(src)
    assert added not in (first, edited)

    (src / "pom.xml").write_text(
        (src / "pom.xml").read_text().replace("<version>0.1.0</version>", "<version>0.2.0</version>", 1)
    )
    assert stackctl_at.transforms_digest(src) not in (first, edited, added)


def test_an_unchanged_jar_is_not_rebuilt(stackctl_at: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    plugin = stackctl_at.TRANSFORMS_PLUGIN
    plugin.mkdir(parents=True)
    (plugin / ".flotilla-source-digest").write_text(stackctl_at.transforms_digest())
    monkeypatch.setenv("PATH", "/nonexistent")  # any Maven run would fail loudly
    assert stackctl_at._build_transforms() is False


def test_a_changed_source_without_maven_is_a_clear_error(
    stackctl_at: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    plugin = stackctl_at.TRANSFORMS_PLUGIN
    plugin.mkdir(parents=True)
    (plugin / ".flotilla-source-digest").write_text("an older digest")
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(stackctl_at.StackError, match=r"Maven \(`mvn`\) is required .* infra/connect-transforms"):
        stackctl_at._build_transforms()


def test_the_jar_is_built_into_debeziums_plugin_folder_once(stackctl_at: ModuleType) -> None:
    if not shutil.which("mvn"):
        pytest.skip("Maven is not installed")
    plugin = stackctl_at.TRANSFORMS_PLUGIN
    assert plugin.parent == stackctl_at.CONNECT_PLUGINS  # a folder of plugin.path: Debezium's own
    plugin.mkdir(parents=True)  # as the fetch unpacks it
    (plugin / "debezium-connector-postgres-3.6.1.Final.jar").write_bytes(b"PK")
    (plugin / "flotilla-connect-transforms-0.0.9.jar").write_bytes(b"PK")  # an earlier build
    stackctl_at.TRANSFORMS_OLD_PLUGIN.mkdir(parents=True)  # where the jar used to be a plugin of its own
    assert stackctl_at._build_transforms() is True
    jars = sorted(plugin.glob("*.jar"))
    assert [j.name for j in jars] == [
        "debezium-connector-postgres-3.6.1.Final.jar",
        "flotilla-connect-transforms-0.1.0.jar",
    ]
    assert not stackctl_at.TRANSFORMS_OLD_PLUGIN.exists(), "DropNullHeaders must not be found in two plugins"
    with zipfile.ZipFile(jars[1]) as jar:
        names = set(jar.namelist())
        assert "dev/flotilla/connect/DropNullHeaders.class" in names
        assert "dev/flotilla/connect/OutboxPostgresConnector.class" in names
        services = "META-INF/services/"
        assert jar.read(services + "org.apache.kafka.connect.transforms.Transformation").decode().split() == [
            "dev.flotilla.connect.DropNullHeaders"
        ]
        assert jar.read(services + "io.debezium.connector.base.QueueProvider").decode().split() == [
            "dev.flotilla.connect.SignallingQueueProvider"
        ]
        assert not any(n.startswith(("org/apache/kafka/", "io/debezium/")) for n in names), "provided, never bundled"
    assert stackctl_at.TRANSFORMS_BUILD.is_relative_to(stackctl_at.STACK_HOME)  # built outside the source tree
    assert stackctl_at._build_transforms() is False  # the second up does not run Maven again


def test_without_debeziums_plugin_folder_the_jar_has_nowhere_to_go(
    stackctl_at: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not shutil.which("mvn"):
        pytest.skip("Maven is not installed")
    with pytest.raises(stackctl_at.StackError, match=r"Debezium's plugin folder .* is missing"):
        stackctl_at._build_transforms()


class _RecordingSupervisor:
    """Stands in for stackctl's Supervisor: one program in a given state, ctl calls recorded."""

    def __init__(self, state: str) -> None:
        self.state = state
        self.calls: list[tuple[str, ...]] = []

    def states(self) -> dict[str, str]:
        return {"connect": self.state}

    def ctl(self, *args: str, check: bool = True) -> str:
        self.calls.append(args)
        return ""

    def wait_until_up(self, program: str, check: Any, **kwargs: Any) -> None:
        self.calls.append(("waited", program))


@pytest.mark.parametrize(
    ("state", "restart", "calls"),
    [
        ("RUNNING", False, []),  # healthy and nothing new: left alone
        ("RUNNING", True, [("restart", "connect"), ("waited", "connect")]),  # a new jar: Connect rescans plugin.path
        ("STOPPED", True, [("start", "connect"), ("waited", "connect")]),
        ("STOPPED", False, [("start", "connect"), ("waited", "connect")]),
    ],
)
def test_connect_restarts_when_the_transforms_were_rebuilt(
    stackctl_at: ModuleType,
    monkeypatch: pytest.MonkeyPatch,
    state: str,
    restart: bool,
    calls: list[tuple[str, ...]],
) -> None:
    supervisor = _RecordingSupervisor(state)
    monkeypatch.setattr(stackctl_at, "SUPERVISOR", supervisor)
    connect = stackctl_at.Component("connect", 1, Path("/dev/null"), lambda: True, lambda: "")
    stackctl_at._start(connect, 5, restart=restart)
    assert supervisor.calls == calls
