"""The fleet for the chaos soak: a generated estate, a sim that keeps its ledger on disk,
two executors, and the timings of an operator who expects crashes (config.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from flotilla.settings import StackSettings
from tests.chaos import inherited
from tests.chaos.config import REPO_ROOT, ChaosConfig, fleet_settings
from tests.support.scripts import load_script

FLEETCTL = [sys.executable, str(REPO_ROOT / "infra" / "local" / "fleetctl.py")]
LEDGER = REPO_ROOT / ".stack" / "chaos" / "sim-ledger.sqlite"


@pytest.fixture(scope="session")
def chaos_config() -> ChaosConfig:
    return ChaosConfig.from_env()


@pytest.fixture(scope="session")
def chaos_env(chaos_config: ChaosConfig) -> dict[str, str]:
    return {**os.environ, **fleet_settings(chaos_config, LEDGER)}


def fleetctl(action: str, env: dict[str, str], timeout: float = 600) -> None:
    done = subprocess.run([*FLEETCTL, action], capture_output=True, text=True, timeout=timeout, env=env)
    sys.stdout.write(done.stdout)
    if done.returncode != 0:
        pytest.fail(f"fleetctl {action} failed:\n{done.stdout}\n{done.stderr}")


@pytest.fixture(scope="session")
def inherited_proposal(stack: StackSettings) -> inherited.Inherited:
    """A proposal left pending by a fleet of the default estate (tests/chaos/inherited.py),
    made before the soak's fleet starts, so every run inherits one."""
    env = inherited.environment()
    subprocess.run([*FLEETCTL, "down"], capture_output=True, timeout=180, env=env)
    fleetctl("up", env)
    try:
        return inherited.leave_a_proposal_pending()
    finally:
        subprocess.run([*FLEETCTL, "down"], capture_output=True, timeout=180, env=env)


@pytest.fixture(scope="session")
def chaos_pace(chaos_config: ChaosConfig) -> Iterator[None]:
    """Prometheus at the soak's pace (CHAOS_READ_SECONDS) while it runs, and back to the
    stack's after. Slower than the stack's 1 s, the estate's alert rules (rates over 5 s)
    would see one sample a window and never fire, so they are off: the alert path is the
    short soak's and the e2e tests'; the agent's own readings open the long soak's incidents."""
    if chaos_config.read_seconds == 1:
        yield
        return
    stackctl = load_script("_chaos_pace_stackctl", REPO_ROOT / "infra" / "local" / "stackctl.py")
    stackctl.prometheus_pace(chaos_config.read_seconds, rules=False)
    try:
        yield
    finally:
        stackctl.prometheus_pace(1, rules=True)


@pytest.fixture(scope="session")
def chaos_fleet(
    stack: StackSettings, chaos_env: dict[str, str], inherited_proposal: inherited.Inherited, chaos_pace: None
) -> Iterator[dict[str, str]]:
    """A fresh chaos fleet (a fresh sim ledger) on the session's stack, started after a
    fleet of the default estate left a proposal waiting; stopped at the end."""
    subprocess.run([*FLEETCTL, "down"], capture_output=True, timeout=180, env=chaos_env)
    for leftover in LEDGER.parent.glob(LEDGER.name + "*"):
        leftover.unlink()
    fleetctl("up", chaos_env)
    try:
        yield chaos_env
    finally:
        if os.environ.get("FLOTILLA_KEEP_FLEET") != "1":
            subprocess.run([*FLEETCTL, "down"], capture_output=True, timeout=180, env=chaos_env)


def executor_token() -> str:
    done = subprocess.run([*FLEETCTL, "sim-token-file"], capture_output=True, text=True, timeout=30, check=True)
    return Path(done.stdout.strip()).read_text().strip()
