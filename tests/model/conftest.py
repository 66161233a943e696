"""The fleet reasoning through a real model server: llama-cpp-python serving SmolLM2.

The stack's model server (``stackctl model-up``: built on first use, its wheel cached by
pip) answers both agents, through a recording tap (tap.py) so the tests can read what the
server said. SmolLM2-135M is tiny and often wrong: these tests assert what the fleet does
with whatever it answers, never whether the answer is right.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from flotilla.serde import AvroSerde
from flotilla.settings import StackSettings
from tests.e2e.conftest import E2E_SETTINGS
from tests.e2e.fleet import Fleet, Watch

from .tap import ModelTap

REPO_ROOT = Path(__file__).resolve().parents[2]
STACKCTL = [sys.executable, str(REPO_ROOT / "infra" / "local" / "stackctl.py")]
FLEETCTL = [sys.executable, str(REPO_ROOT / "infra" / "local" / "fleetctl.py")]

# How long one call may take before the agent gives up on it, and how often the client
# tries again: a hung server costs an incident 2 x 60 s before it escalates. On 2 cores
# SmolLM2 reads a prompt at ~160 tokens/s (a local-estate decision is 2-3k tokens) and
# writes ~50 tokens/s (an answer is at most 320).
LLM_TIMEOUT_SECONDS = 60.0
LLM_SETTINGS = {
    "FLOTILLA_REASONER": "llm",
    "FLOTILLA_LLM_MODEL": "smollm2",
    "FLOTILLA_LLM_TIMEOUT_SECONDS": str(LLM_TIMEOUT_SECONDS),
    "FLOTILLA_LLM_MAX_RETRIES": "1",
    "FLOTILLA_LLM_MAX_TOKENS": "320",
    # the model is slow next to the rules: give each decision time before a worker's lease lapses
    "FLOTILLA_DIAGNOSTIC_JOB_SECONDS": "1",
}


def stackctl(*args: str, timeout: float) -> str:
    done = subprocess.run([*STACKCTL, *args], capture_output=True, text=True, timeout=timeout)
    sys.stdout.write(done.stdout)
    if done.returncode != 0:
        pytest.fail(f"stackctl {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


@pytest.fixture(scope="session")
def model_server(stack: StackSettings) -> str:
    """The model server's base URL (without /v1), started (and built, the first time)."""
    t0 = time.monotonic()
    stackctl("model-up", timeout=1800)  # a cold build is ~6 min on 2 cores; allow a slow machine
    print(f"[model] model server up after {time.monotonic() - t0:.0f}s")
    port = os.environ.get("FLOTILLA_MODEL_SERVER_PORT", "18122")
    return f"http://127.0.0.1:{port}"


@pytest.fixture(scope="session")
def tap(model_server: str) -> Iterator[ModelTap]:
    with ModelTap(model_server, client_timeout=LLM_TIMEOUT_SECONDS) as recording:
        yield recording


def start_fleet(tap: ModelTap, **overrides: str) -> dict[str, str]:
    env = {**os.environ, **E2E_SETTINGS, **LLM_SETTINGS, "FLOTILLA_LLM_BASE_URL": tap.url, **overrides}
    subprocess.run([*FLEETCTL, "down"], capture_output=True, timeout=180, env=env)
    started = subprocess.run([*FLEETCTL, "up"], capture_output=True, text=True, timeout=600, env=env)
    sys.stdout.write(started.stdout)
    if started.returncode != 0:
        pytest.fail(f"fleet did not come up:\n{started.stdout}\n{started.stderr}")
    return env


@pytest.fixture(scope="session")
def fleet(stack: StackSettings, serde: AvroSerde, tap: ModelTap) -> Iterator[Fleet]:
    env = start_fleet(tap)
    try:
        yield Fleet(stack, serde)
    finally:
        subprocess.run([*FLEETCTL, "down"], capture_output=True, timeout=180, env=env)


@pytest.fixture()
def watch(fleet: Fleet) -> Iterator[Watch]:
    """A tail of incidents + commands from now on, the sim reset and the demo service settled."""
    with fleet.fresh_watch() as w:
        yield w
