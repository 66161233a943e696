"""`docker compose up` on a real Docker engine: a whole incident, approved with the CLI.

The engine and the images come from ``infra/compose/engine.py`` (Debian's docker.io, a
debootstrapped base, a stand-in under each official image's name, since no registry can
be reached here); the compose file is used exactly as users get it. Every service but
Grafana (no source for it here) and Jaeger (nothing waits for it) is started; the demo's
``incident`` job runs with DEMO_AUTO_APPROVE=0, so it waits for a person, and the test
approves the proposal with ``flotilla approve`` against the compose fleet's published
policy port, as an operator would. The job's exit code says whether the recovery was
verified and the audit chain intact. Everything is torn down with ``down -v`` whatever
happens; the project name is this test's own, so nothing else is touched.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.scripts import load_script

REPO_ROOT = Path(__file__).resolve().parents[2]
PROJECT = "flotilla-compose-test"
LEFT_OUT = {"grafana", "jaeger", "incident"}
FLOTILLA = Path(sys.executable).parent / "flotilla"
PY = sys.executable

engine = load_script("flotilla_compose_engine", REPO_ROOT / "infra" / "compose" / "engine.py")

pytestmark = pytest.mark.timeout(1200)


def compose(*args: str, timeout: float = 900, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DOCKER_BUILDKIT": "0"}
    done = subprocess.run(
        ["docker", "compose", "-p", PROJECT, *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    if check and done.returncode != 0:
        raise AssertionError(f"docker compose {' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


def services() -> list[str]:
    names = compose("config", "--services").stdout.split()
    return [n for n in names if n not in LEFT_OUT]


def states() -> dict[str, str]:
    out = compose("ps", "-a", "--format", "json").stdout
    rows = [json.loads(line) for line in out.splitlines() if line.strip()]
    return {r["Service"]: f"{r['State']} {r.get('Health', '')}".strip() for r in rows}


@pytest.fixture(scope="module")
def compose_fleet() -> Iterator[None]:
    # The compose file publishes the local stack's ports: the local stack and fleet stop first.
    subprocess.run([PY, "infra/local/fleetctl.py", "down"], cwd=REPO_ROOT, capture_output=True, timeout=300)
    subprocess.run([PY, "infra/local/stackctl.py", "down"], cwd=REPO_ROOT, capture_output=True, timeout=300)
    subprocess.run([PY, "infra/local/stackctl.py", "fetch"], cwd=REPO_ROOT, check=True, timeout=1800)
    engine.images()
    try:
        compose("up", "-d", "--build", *services(), timeout=1500)
        deadline = time.monotonic() + 600
        while True:
            now = states()
            waiting = {s: st for s, st in now.items() if st not in ("running healthy", "exited")}
            if not waiting:
                break
            assert time.monotonic() < deadline, f"not healthy within 600 s: {waiting}"
            time.sleep(3)
        failed = compose("ps", "-a", "--status", "exited", "--format", "{{.Service}} {{.ExitCode}}").stdout
        assert all(line.endswith(" 0") for line in failed.splitlines() if line), failed
        yield
    finally:
        logs = compose("logs", "--no-color", "--tail", "200", check=False).stdout
        (REPO_ROOT / ".stack").mkdir(exist_ok=True)
        (REPO_ROOT / ".stack" / "compose-test.log").write_text(logs)
        compose("down", "-v", "--remove-orphans", check=False, timeout=300)


def flotilla(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(FLOTILLA), *args], capture_output=True, text=True, timeout=60)


def test_an_incident_on_the_compose_fleet_is_approved_with_the_cli_and_recovers(compose_fleet: None) -> None:
    job = compose("run", "-d", "--no-deps", "-e", "DEMO_AUTO_APPROVE=0", "incident").stdout.strip().splitlines()[-1]
    try:
        deadline = time.monotonic() + 300
        proposal = None
        while proposal is None:
            listed = flotilla("--json", "approvals", "list", "--token", "alice-token")
            pending = json.loads(listed.stdout)["approvals"] if listed.returncode == 0 else []
            proposal = next((p["proposalId"] for p in pending), None)
            assert time.monotonic() < deadline, f"no proposal waiting within 300 s: {listed.stdout} {listed.stderr}"
            time.sleep(2)
        approved = flotilla("approve", proposal, "--yes", "--token", "alice-token")
        assert approved.returncode == 0, approved.stdout + approved.stderr
        assert "approved by alice" in approved.stdout
        waited = subprocess.run(["docker", "wait", job], capture_output=True, text=True, timeout=600)
        logs = subprocess.run(["docker", "logs", job], capture_output=True, text=True).stdout
        assert waited.stdout.strip() == "0", logs[-3000:]
        assert "recovered" in logs and '"ok": true' in logs, logs[-3000:]
    finally:
        subprocess.run(["docker", "rm", "-f", job], capture_output=True)
