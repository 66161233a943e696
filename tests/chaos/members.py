"""The members the chaos monkey kills: the seven services, the sim and the stack."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

from flotilla.fleet import AGENTS, SIM
from tests.chaos.config import REPO_ROOT

STACKCTL = REPO_ROOT / "infra" / "local" / "stackctl.py"
FLEETCTL = REPO_ROOT / "infra" / "local" / "fleetctl.py"
# Prometheus and Alertmanager too: what the agents see by, and what alerts come through.
STACK_COMPONENTS = ("postgres", "kafka", "connect", "registry", "prometheus", "alertmanager")


@dataclass(frozen=True)
class Target:
    """One killable member: a supervisord program of the stack or of the fleet."""

    kind: str  # "stack" or "fleet"
    program: str  # e.g. kafka, executor, executor-1

    @property
    def component(self) -> str:
        """What the report counts kills by: a replica counts as its service."""
        base = self.program.rsplit("-", 1)
        return base[0] if len(base) == 2 and base[1].isdigit() else self.program

    def pid(self) -> int | None:
        tool = STACKCTL if self.kind == "stack" else FLEETCTL
        done = subprocess.run(
            [sys.executable, str(tool), "pid", self.program], capture_output=True, text=True, timeout=60
        )
        text = done.stdout.strip()
        return int(text) if done.returncode == 0 and text.isdigit() and int(text) > 0 else None

    def wait_running(self, timeout: float = 120.0, *, after: int | None = None) -> int:
        """Until supervisord runs the program again (a new pid if ``after`` is given)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid = self.pid()
            if pid is not None and pid != after:
                return pid
            time.sleep(0.5)
        raise AssertionError(f"{self.program} was not running again within {timeout:.0f}s")

    def signal(self, signum: signal.Signals) -> int:
        pid = self.pid()
        if pid is None:
            raise AssertionError(f"{self.program} is not running")
        os.kill(pid, signum)
        return pid


def targets() -> list[Target]:
    """Every member, one entry per component; a service with replicas is one component
    whose replica is picked at kill time (``pick``)."""
    fleet = [Target("fleet", m.name) for m in (SIM, *AGENTS)]
    return [*(Target("stack", c) for c in STACK_COMPONENTS), *fleet]


def pick(target: Target, replicas: dict[str, int], rng: random.Random) -> Target:
    count = replicas.get(target.program, 1)
    index = rng.randrange(count)
    return target if index == 0 else Target(target.kind, f"{target.program}-{index}")
