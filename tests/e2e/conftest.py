"""The whole fleet on the real stack, started once for the end-to-end tests.

Timings are shortened through the same FLOTILLA_* settings an operator would use
(faster scrapes, a short verification window, quick simulated actions).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from flotilla.serde import AvroSerde
from flotilla.settings import StackSettings

from .fleet import Fleet, Watch
from .otlp import OtlpReceiver

REPO_ROOT = Path(__file__).resolve().parents[2]
FLEETCTL = [sys.executable, str(REPO_ROOT / "infra" / "local" / "fleetctl.py")]

E2E_SETTINGS = {
    "FLOTILLA_HEALTH_SCRAPE_SECONDS": "0.5",
    "FLOTILLA_HEALTH_BREACH_SCRAPES": "2",
    "FLOTILLA_HEALTH_CLEAR_SCRAPES": "2",
    "FLOTILLA_HEALTH_VERIFY_SECONDS": "2",
    # the lanes open dozens of incidents on checkout-dev an hour, on purpose; the cap on
    # incidents per service has its own test (tests/integration/services/test_health_incident_cap.py)
    "FLOTILLA_HEALTH_INCIDENTS_PER_HOUR": "0",
    "FLOTILLA_SIM_ACTION_SECONDS": "0.1",
    "FLOTILLA_APPROVAL_SWEEP_SECONDS": "0.5",
    # every diagnosis goes through a durable slow job (so one test can restart the agent mid-job)
    "FLOTILLA_DIAGNOSTIC_JOB_SECONDS": "2",
    # long enough to restart every service while an approval waits (15-17 s idle, ~4x
    # headroom for a loaded machine), short enough to test expiry
    "FLOTILLA_APPROVAL_TTL_SECONDS": "75",
    "FLOTILLA_POLICY_USERS": json.dumps(
        {
            "alice-token": {"user": "alice", "roles": ["approver"]},
            "bob-token": {"user": "bob", "roles": ["viewer"]},
            # an approver who is also the proposer: must never approve its own proposal
            "mallory-token": {"user": "remediation-agent", "roles": ["approver"]},
        }
    ),
}


@pytest.fixture(scope="session")
def otlp() -> Iterator[OtlpReceiver]:
    """Where every member of the e2e fleet exports its spans (OTLP/HTTP, in memory)."""
    with OtlpReceiver() as receiver:
        yield receiver


@pytest.fixture(scope="session")
def fleet(stack: StackSettings, serde: AvroSerde, otlp: OtlpReceiver) -> Iterator[Fleet]:
    tracing = {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": otlp.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "200",  # ms: spans reach the test soon after they end
    }
    env = {**os.environ, **E2E_SETTINGS, **tracing}
    FLEETCTL_DOWN = [*FLEETCTL, "down"]
    subprocess.run(FLEETCTL_DOWN, capture_output=True, timeout=120, env=env)  # a fleet from earlier settings
    started = subprocess.run([*FLEETCTL, "up"], capture_output=True, text=True, timeout=600, env=env)
    sys.stdout.write(started.stdout)
    if started.returncode != 0:
        pytest.fail(f"fleet did not come up:\n{started.stdout}\n{started.stderr}")
    try:
        yield Fleet(stack, serde)
    finally:
        if os.environ.get("FLOTILLA_KEEP_FLEET") != "1":
            subprocess.run(FLEETCTL_DOWN, capture_output=True, timeout=180, env=env)


@pytest.fixture()
def watch(fleet: Fleet) -> Iterator[Watch]:
    """A tail of incidents + commands from now on, with the sim reset and the demo service
    healthy again (so each test opens a fresh incident)."""
    with fleet.fresh_watch() as w:
        yield w
