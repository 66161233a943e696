"""flotilla.registry: anonymous readers, the registrar's credentials, the registry's users file."""

from __future__ import annotations

import hashlib
import stat
from pathlib import Path

import pytest
from confluent_kafka.schema_registry.error import SchemaRegistryError

from flotilla import registry
from flotilla.settings import StackSettings

AUTH_VARS = ("FLOTILLA_SCHEMA_REGISTRY_AUTH", "FLOTILLA_SCHEMA_REGISTRY_AUTH_FILE")


@pytest.fixture(autouse=True)
def _no_credentials_from_outside(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in AUTH_VARS:
        monkeypatch.delenv(name, raising=False)


def _settings(**values: object) -> StackSettings:
    return StackSettings(_env_file=None, **values)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_reader_is_anonymous_and_a_registrar_presents_basic_credentials() -> None:
    assert registry.registry_client("http://127.0.0.1:9/apis/ccompat/v7")._rest_client.auth is None
    client = registry.registry_client("http://127.0.0.1:9/apis/ccompat/v7", "registrar:s3cret:with-colon")
    assert client._rest_client.auth == ("registrar", "s3cret:with-colon")


@pytest.mark.parametrize("auth", ["hunter2", "hunter2:", ":hunter2", "  hunter2  "])
def test_malformed_credentials_are_refused_without_echoing_them(auth: str) -> None:
    with pytest.raises(ValueError, match="user:password") as err:
        registry.registry_client("http://127.0.0.1:9", auth)
    assert "hunter2" not in str(err.value)


def test_the_registrar_comes_from_the_value_or_the_file(tmp_path: Path) -> None:
    assert _settings().registrar_auth() is None
    assert _settings(schema_registry_auth="a:b").registrar_auth() == "a:b"
    path = tmp_path / "registrar"
    path.write_text("registrar:from-file\n")
    assert _settings(schema_registry_auth_file=path).registrar_auth() == "registrar:from-file"
    assert _settings(schema_registry_auth="a:b", schema_registry_auth_file=path).registrar_auth() == "a:b"
    assert _settings(schema_registry_auth="", schema_registry_auth_file="").registrar_auth() is None
    path.write_text("no-colon\n")
    with pytest.raises(ValueError, match=f"{path} does not hold registry credentials") as err:
        _settings(schema_registry_auth_file=path).registrar_auth()
    assert "no-colon" not in str(err.value)


def test_the_credentials_stay_out_of_the_settings_repr() -> None:
    assert "hunter2" not in repr(_settings(schema_registry_auth="registrar:hunter2"))


def test_registrar_client_uses_the_settings_credentials(tmp_path: Path) -> None:
    path = tmp_path / "registrar"
    path.write_text("registrar:pw\n")
    client = registry.registrar_client(_settings(schema_registry_auth_file=path))
    assert client._rest_client.auth == ("registrar", "pw")
    assert registry.registrar_client(_settings())._rest_client.auth is None  # the registry decides


def test_the_users_file_holds_the_quarkus_digest_and_the_admin_role() -> None:
    text = registry.users_properties("registrar:pw")
    digest = hashlib.sha512(b"registrar:Quarkus:pw").hexdigest()
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert lines == [
        f"quarkus.security.users.embedded.users.registrar={digest}",
        "quarkus.security.users.embedded.roles.registrar=sr-admin",
    ]
    assert "pw\n" not in text
    with pytest.raises(ValueError, match="config key"):
        registry.users_properties("a.b:pw")


def test_new_credentials_are_the_registrar_and_a_long_random_password() -> None:
    user, password = registry.split_credentials(registry.new_credentials())
    assert user == registry.REGISTRAR_USER and len(password) >= 43 and ":" not in password
    assert registry.new_credentials() != registry.new_credentials()


def test_write_refused_says_what_to_set_for_401_and_403_only() -> None:
    refused = registry.write_refused(SchemaRegistryError(401, 0, "no"), _settings())
    assert isinstance(refused, registry.RegistrarRefused)
    assert "refuses anonymous writes" in str(refused) and "FLOTILLA_SCHEMA_REGISTRY_AUTH" in str(refused)
    wrong = registry.write_refused(SchemaRegistryError(403, 0, "no"), _settings(schema_registry_auth="a:b"))
    assert wrong is not None and "refused the registrar's credentials" in str(wrong) and "a:b" not in str(wrong)
    assert registry.write_refused(SchemaRegistryError(409, 409, "incompatible"), _settings()) is None


def test_users_command_makes_the_credentials_once_and_the_users_file_from_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    creds, users = tmp_path / "registrar" / "registrar", tmp_path / "users" / "users.properties"
    argv = ["users", "--credentials", str(creds), "--users", str(users), "--users-mode", "640"]
    assert registry.main(argv) == 0
    auth = registry.read_credentials(creds)
    assert (_mode(creds), _mode(users)) == (0o600, 0o640)
    assert users.read_text() == registry.users_properties(auth)
    assert registry.main(argv) == 0
    assert registry.read_credentials(creds) == auth  # kept, not regenerated
    monkeypatch.setenv("FLOTILLA_SCHEMA_REGISTRY_AUTH", "registrar:chosen-in-env")
    assert registry.main(argv) == 0
    assert registry.read_credentials(creds) == "registrar:chosen-in-env"
    assert users.read_text() == registry.users_properties("registrar:chosen-in-env")
    monkeypatch.setenv("FLOTILLA_SCHEMA_REGISTRY_AUTH", "malformed")
    assert registry.main(argv) == 1
