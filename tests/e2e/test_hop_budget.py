"""A ping-pong loop between two misconfigured services, inside the running fleet, is cut
by the hop budget: a chain started with ``ce_hops=N`` produces N records, then the one
with no hops left is dropped and reported once as LoopTerminated."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import pytest
from flotilla_ops.samples import sample_value

from flotilla.bootstrap import drop_outbox
from flotilla.contracts import load_contracts
from flotilla.envelope import Envelope

from . import misconfigured
from .conftest import REPO_ROOT
from .fleet import Fleet, Watch, group_members, produce

pytestmark = pytest.mark.timeout(240)

HOPS = 12


@pytest.fixture()
def misconfigured_pair(fleet: Fleet) -> Iterator[None]:
    processes = []
    for role in misconfigured.ROLES:
        log = (REPO_ROOT / ".stack" / "logs" / f"misconfigured-{role}.log").open("w")
        env = {
            **os.environ,
            "FLOTILLA_HTTP_PORT": "0",
            "PYTHONUNBUFFERED": "1",
            "FLOTILLA_SIGNING_KEY_FILE": str(fleet.producer_key_file(misconfigured.MEMBER[role])),
            "FLOTILLA_PRODUCER_KEYS": json.dumps(fleet.producer_keys()),
        }
        processes.append(
            subprocess.Popen(
                [sys.executable, "-m", "tests.e2e.misconfigured", role],
                cwd=REPO_ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
        log.close()
    try:
        deadline = time.monotonic() + 90
        for role in misconfigured.ROLES:
            while group_members(fleet, f"misconfigured-{role}") < 1:
                assert all(p.poll() is None for p in processes), "a misconfigured service exited: see .stack/logs"
                assert time.monotonic() < deadline, f"misconfigured-{role} never got its partitions"
                time.sleep(0.5)
        yield
    finally:
        for p in processes:
            p.send_signal(signal.SIGTERM)
        for p in processes:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        for role in misconfigured.ROLES:
            drop_outbox(fleet.stack, misconfigured.database(role))


def test_a_ping_pong_loop_in_the_fleet_is_cut_by_the_hop_budget(
    fleet: Fleet, watch: Watch, misconfigured_pair: None
) -> None:
    incident = f"incident-loop-{uuid.uuid4().hex[:6]}"
    schema = next(c.schema for c in load_contracts() if c.full_name == misconfigured.BUDGET_EXCEEDED)
    first = sample_value(schema, incidentId=incident)
    envelope = Envelope(
        type=misconfigured.BUDGET_EXCEEDED,
        source="/flotilla/policy-service",  # signed with its key by produce()
        correlationid=incident,
        id=first["eventId"],
        hops=HOPS,
    )
    started = time.monotonic()
    produce(fleet, "incidents", incident, misconfigured.BUDGET_EXCEEDED, first, envelope)

    report = watch.kind("LoopTerminated", incident, timeout=90)
    elapsed = time.monotonic() - started
    watch.settle(5)  # nothing else reports it, nothing keeps bouncing
    records = watch.of(incident)
    bounced = [s for s in records if s.kind in ("BudgetExceeded", "IncidentEscalated") and s.envelope.id != envelope.id]
    reports = [s for s in records if s.kind == "LoopTerminated"]
    assert sorted(s.envelope.hops for s in bounced) == list(range(HOPS))
    assert len(reports) == 1, [(r.value["consumer"], r.envelope.source) for r in reports]
    assert report.value["consumer"] == "misconfigured-escalator"  # the only one that handles BudgetExceeded
    assert report.value["droppedType"] == misconfigured.BUDGET_EXCEEDED and report.value["hops"] == 0
    # the audit log has the whole loop and its report
    timeline = fleet.audit_timeline(incident, lambda entries: len(entries) >= HOPS + 2)
    assert len(timeline) == HOPS + 2, [e.get("type") for e in timeline]
    print(
        f"\nping-pong in the fleet, ce_hops={HOPS}: {len(bounced)} records bounced + the first, "
        f"then {len(reports)} LoopTerminated after {elapsed:.1f} s"
    )
