"""The real stack for integration tests, started once per test session.

Which stack, in order:
1. ``FLOTILLA_TEST_STACK=env`` or (by default) a healthy stack already named by the env
   file (``.stack/stack.env`` or ``$FLOTILLA_ENV_FILE``) — used as is, left running;
2. ``FLOTILLA_TEST_STACK=testcontainers`` where a Docker engine answers — the compose
   file's images through testcontainers;
3. otherwise the local stack (``infra/local/stackctl.py up``), the default and what CI
   uses; stopped again at the end if this session started it (data kept), unless
   ``FLOTILLA_KEEP_STACK=1``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient

from flotilla import stackcheck
from flotilla.contracts import register_all
from flotilla.registry import registrar_client, registry_client
from flotilla.serde import AvroSerde
from flotilla.settings import StackSettings, default_env_file, load_settings

REPO_ROOT = Path(__file__).resolve().parents[1]
STACKCTL = [sys.executable, str(REPO_ROOT / "infra" / "local" / "stackctl.py")]


def _local_env_file() -> Path:
    home = Path(os.environ.get("FLOTILLA_STACK_HOME", REPO_ROOT / ".stack"))
    return home / "stack.env"


@pytest.fixture(scope="session")
def stack() -> Iterator[StackSettings]:
    choice = os.environ.get("FLOTILLA_TEST_STACK", "auto")
    if choice == "testcontainers":
        from tests.support.containers import ComposeStack, docker_available

        if not docker_available():
            pytest.fail("FLOTILLA_TEST_STACK=testcontainers but no Docker engine answers")
        with ComposeStack() as env:
            os.environ.update(env)
            yield StackSettings()
        return

    env_file = default_env_file()
    if choice in ("auto", "env") and env_file.exists() and not stackcheck.problems(load_settings(env_file)):
        yield load_settings(env_file)
        return
    if choice == "env":
        pytest.fail(f"FLOTILLA_TEST_STACK=env but no healthy stack is named by {env_file}")

    started = subprocess.run([*STACKCTL, "up"], text=True, capture_output=True, timeout=900)
    sys.stdout.write(started.stdout)
    if started.returncode != 0:
        pytest.fail(f"local stack did not come up:\n{started.stdout}\n{started.stderr}")
    try:
        yield load_settings(_local_env_file())
    finally:
        if os.environ.get("FLOTILLA_KEEP_STACK") != "1":
            subprocess.run([*STACKCTL, "down"], capture_output=True, timeout=300)


@pytest.fixture(scope="session")
def registry(stack: StackSettings) -> SchemaRegistryClient:
    """The registrar's client (``stack.registrar_auth()``): the registry refuses anonymous
    writes, and tests register their own subjects and delete them again. Every contract is
    registered once per session."""
    client = registrar_client(stack)
    register_all(client)
    return client


@pytest.fixture(scope="session")
def serde(stack: StackSettings, registry: SchemaRegistryClient) -> AvroSerde:
    """A serde as the services have one: an anonymous client (reads only), after ``registry``
    registered the contracts."""
    return AvroSerde(registry_client(stack.schema_registry_url))
