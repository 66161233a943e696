"""Shared test configuration: tests under integration/, e2e/, chaos/, model/ and k8s/ are marked by path."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]

# The real stack, started once per session, for integration and end-to-end tests.
pytest_plugins = ["tests.stack_fixtures"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).relative_to(REPO_ROOT).parts
        if "integration" in parts:
            item.add_marker(pytest.mark.integration)
        if "e2e" in parts:
            item.add_marker(pytest.mark.e2e)
        if "chaos" in parts:
            item.add_marker(pytest.mark.chaos)
        if "model" in parts and parts[1] == "model":
            item.add_marker(pytest.mark.model)
        if parts[1] == "k8s":
            item.add_marker(pytest.mark.k8s)
        if parts[1] == "compose":
            item.add_marker(pytest.mark.compose)


@pytest.fixture()
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No FLOTILLA_* variable or stack env file of the surrounding shell leaks in
    (modules that build settings ask for it with ``pytest.mark.usefixtures``)."""
    for name in list(os.environ):
        if name.startswith("FLOTILLA_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("FLOTILLA_ENV_FILE", str(tmp_path / "absent" / "stack.env"))


@pytest.fixture()
def signing_keys(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, Path]:
    """Fresh policy (command), remediation (proposal) and audit keys, and the producers' fact
    key (tests.keys), named by the FLOTILLA_* settings the services read, for tests that
    build the services' specs."""
    from flotilla.keys import load_or_create, public_key_text

    paths = {}
    for purpose in ("authorization", "proposal"):
        path = tmp_path / "secrets" / f"{purpose}-signing-key.pem"
        key, _ = load_or_create(path)
        monkeypatch.setenv(f"FLOTILLA_{purpose.upper()}_SIGNING_KEY_FILE", str(path))
        monkeypatch.setenv(f"FLOTILLA_{purpose.upper()}_PUBLIC_KEYS", json.dumps([public_key_text(key.public_key())]))
        paths[purpose] = path
    audit, _ = load_or_create(tmp_path / "secrets" / "audit-signing-key.pem")
    monkeypatch.setenv("FLOTILLA_AUDIT_SIGNING_KEY_FILE", str(tmp_path / "secrets" / "audit-signing-key.pem"))
    monkeypatch.setenv("FLOTILLA_AUDIT_PUBLIC_KEYS", json.dumps([public_key_text(audit.public_key())]))
    paths["audit"] = tmp_path / "secrets" / "audit-signing-key.pem"
    from tests.keys import fact_settings

    facts = fact_settings(tmp_path / "secrets")
    monkeypatch.setenv("FLOTILLA_SIGNING_KEY_FILE", str(facts["signing_key_file"]))
    monkeypatch.setenv("FLOTILLA_PRODUCER_KEYS", json.dumps(facts["producer_keys"]))
    paths["facts"] = facts["signing_key_file"]
    return paths
