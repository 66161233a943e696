"""Shared test configuration: tests under integration/ and e2e/ are marked by path."""

from __future__ import annotations

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


@pytest.fixture()
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No FLOTILLA_* variable or stack env file of the surrounding shell leaks in
    (modules that build settings ask for it with ``pytest.mark.usefixtures``)."""
    for name in list(os.environ):
        if name.startswith("FLOTILLA_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("FLOTILLA_ENV_FILE", str(tmp_path / "absent" / "stack.env"))
