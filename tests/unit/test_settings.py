"""Stack connection settings from FLOTILLA_* variables and the stack's env file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict

from flotilla.settings import MissingCredentials, StackSettings, default_env_file, load_settings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No FLOTILLA_* variable of the surrounding shell (or a running stack) leaks in."""
    for name in list(os.environ):
        if name.startswith("FLOTILLA_"):
            monkeypatch.delenv(name)


def _dsn_parts(dsn: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in dsn.split())


def test_defaults_point_at_the_local_stack() -> None:
    s = StackSettings()
    assert s.stack == "local"
    assert s.pg_host == "127.0.0.1"
    assert s.pg_port == 55432
    assert s.kafka_bootstrap == "127.0.0.1:19092"
    assert s.prometheus_url == "http://127.0.0.1:18120"
    assert s.alertmanager_url == "http://127.0.0.1:18121"


def test_the_profile_is_production_unless_demo_is_chosen(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert StackSettings().profile == "production"
    with pytest.raises(MissingCredentials, match="FLOTILLA_X is not set") as refused:
        StackSettings().allow_demo_credentials("FLOTILLA_X")
    assert "FLOTILLA_PROFILE=production" in str(refused.value)
    monkeypatch.setenv("FLOTILLA_PROFILE", "demo")
    StackSettings().allow_demo_credentials("FLOTILLA_X")  # allowed: returns
    monkeypatch.setenv("FLOTILLA_PROFILE", "Demo ")  # no guessing at what was meant
    with pytest.raises(ValueError, match="profile"):
        StackSettings()
    monkeypatch.delenv("FLOTILLA_PROFILE")
    env_file = tmp_path / "stack.env"
    env_file.write_text("FLOTILLA_PROFILE=demo\n")  # as the local stack writes it
    assert load_settings(env_file).profile == "demo"


def test_reads_flotilla_environment_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOTILLA_STACK", "compose")
    monkeypatch.setenv("FLOTILLA_KAFKA_BOOTSTRAP", "kafka:9092")
    monkeypatch.setenv("FLOTILLA_SCHEMA_REGISTRY_URL", "http://registry:8080/apis/ccompat/v7")
    monkeypatch.setenv("FLOTILLA_CONNECT_URL", "http://connect:8083")
    monkeypatch.setenv("FLOTILLA_PG_HOST", "db.internal")
    monkeypatch.setenv("FLOTILLA_PG_PORT", "6543")
    monkeypatch.setenv("FLOTILLA_PG_USER", "svc")
    monkeypatch.setenv("FLOTILLA_PG_PASSWORD", "s3cret")
    monkeypatch.setenv("FLOTILLA_PG_DATABASE", "incidents")
    monkeypatch.setenv("FLOTILLA_PROMETHEUS_URL", "http://prometheus:9090")
    monkeypatch.setenv("FLOTILLA_ALERTMANAGER_URL", "http://alertmanager:9093")
    s = StackSettings()
    assert s.stack == "compose"
    assert s.kafka_bootstrap == "kafka:9092"
    assert s.schema_registry_url == "http://registry:8080/apis/ccompat/v7"
    assert s.connect_url == "http://connect:8083"
    assert s.pg_host == "db.internal"
    assert s.pg_port == 6543
    assert isinstance(s.pg_port, int)
    assert s.pg_user == "svc"
    assert s.pg_password == "s3cret"
    assert s.pg_database == "incidents"
    assert s.prometheus_url == "http://prometheus:9090"
    assert s.alertmanager_url == "http://alertmanager:9093"


def test_unprefixed_variables_are_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PG_HOST", "wrong")
    monkeypatch.setenv("KAFKA_BOOTSTRAP", "wrong:1")
    s = StackSettings()
    assert s.pg_host == "127.0.0.1"
    assert s.kafka_bootstrap == "127.0.0.1:19092"


def test_reads_the_env_file_with_environment_variables_winning(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    env_file = tmp_path / "stack.env"
    env_file.write_text(
        "# written by infra/local/stackctl.py\n"
        "FLOTILLA_STACK=local\n"
        "FLOTILLA_KAFKA_BOOTSTRAP=127.0.0.1:29092\n"
        "FLOTILLA_PG_HOST=from-file\n"
        "FLOTILLA_PG_PORT=60001\n"
        "FLOTILLA_PG_DSN=postgresql://flotilla:flotilla@127.0.0.1:60001/flotilla\n"
    )
    monkeypatch.setenv("FLOTILLA_PG_HOST", "from-env")
    s = load_settings(env_file)
    assert s.pg_host == "from-env"
    assert s.pg_port == 60001
    assert s.kafka_bootstrap == "127.0.0.1:29092"


def test_a_missing_env_file_means_defaults(tmp_path: Path) -> None:
    s = load_settings(tmp_path / "absent.env")
    assert s == StackSettings()


def test_load_settings_uses_flotilla_env_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    env_file = tmp_path / "other.env"
    env_file.write_text("FLOTILLA_CONNECT_URL=http://127.0.0.1:28083\n")
    monkeypatch.setenv("FLOTILLA_ENV_FILE", str(env_file))
    assert load_settings().connect_url == "http://127.0.0.1:28083"


def test_pg_dsn_names_host_port_user_and_database(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOTILLA_PG_HOST", "db.internal")
    monkeypatch.setenv("FLOTILLA_PG_PORT", "6543")
    monkeypatch.setenv("FLOTILLA_PG_USER", "svc")
    monkeypatch.setenv("FLOTILLA_PG_PASSWORD", "pw")
    monkeypatch.setenv("FLOTILLA_PG_DATABASE", "incidents")
    s = StackSettings()
    parts = _dsn_parts(s.pg_dsn())
    assert parts["host"] == "db.internal"
    assert parts["port"] == "6543"
    assert parts["user"] == "svc"
    assert parts["password"] == "pw"
    assert parts["dbname"] == "incidents"
    assert _dsn_parts(s.pg_dsn("commands"))["dbname"] == "commands"
    assert _dsn_parts(s.pg_dsn("commands"))["host"] == "db.internal"


@pytest.mark.parametrize(
    "password",
    ["with spaces", "it's", "a=b", "back\\slash", "x host=evil.example dbname=postgres", "' sslmode=disable '", ""],
)
def test_pg_dsn_passes_any_password_as_it_is(monkeypatch: pytest.MonkeyPatch, password: str) -> None:
    """Quoted by psycopg: the password is one value, and cannot add or replace a parameter."""
    monkeypatch.setenv("FLOTILLA_PG_HOST", "db.internal")
    monkeypatch.setenv("FLOTILLA_PG_PASSWORD", password)
    parsed = conninfo_to_dict(StackSettings().pg_dsn("incidents"))
    assert parsed == {
        "host": "db.internal",
        "port": "55432",
        "user": "flotilla",
        "password": password,
        "dbname": "incidents",
        "connect_timeout": "5",
        "client_encoding": "UTF8",
    }


def test_pg_dsn_defaults() -> None:
    parts = _dsn_parts(StackSettings().pg_dsn())
    assert parts["host"] == "127.0.0.1"
    assert parts["port"] == "55432"
    assert parts["user"] == "flotilla"
    assert parts["dbname"] == "flotilla"


# ------------------------------------------------------------ default_env_file


def test_default_env_file_honours_flotilla_env_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    explicit = tmp_path / "does-not-need-to-exist.env"
    monkeypatch.setenv("FLOTILLA_ENV_FILE", str(explicit))
    assert default_env_file() == explicit


def test_default_env_file_finds_the_stack_env_in_a_parent(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    root = tmp_path.resolve()
    (root / ".stack").mkdir()
    (root / ".stack" / "stack.env").write_text("FLOTILLA_PG_PORT=60002\n")
    deep = root / "services" / "health" / "src"
    deep.mkdir(parents=True)
    monkeypatch.chdir(deep)
    assert default_env_file() == root / ".stack" / "stack.env"
    assert load_settings().pg_port == 60002


def test_default_env_file_prefers_the_nearest(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    root = tmp_path.resolve()
    for folder in (root, root / "a"):
        (folder / ".stack").mkdir(parents=True)
        (folder / ".stack" / "stack.env").write_text("")
    (root / "a" / "b").mkdir()
    monkeypatch.chdir(root / "a" / "b")
    assert default_env_file() == root / "a" / ".stack" / "stack.env"
    monkeypatch.chdir(root / "a")
    assert default_env_file() == root / "a" / ".stack" / "stack.env"


def test_default_env_file_without_any_is_under_the_cwd(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    here = tmp_path.resolve() / "nowhere"
    here.mkdir()
    if any((p / ".stack" / "stack.env").exists() for p in here.parents):
        pytest.skip("a .stack/stack.env exists above the temporary directory")
    monkeypatch.chdir(here)
    assert default_env_file() == here / ".stack" / "stack.env"
    assert not default_env_file().exists()
