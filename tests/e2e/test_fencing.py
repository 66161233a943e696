"""Two executors, one resource: the one paused past its lease is fenced out when it resumes.

A second executor process (another holder id, the same consumer group) runs beside the
fleet's. Whichever of the two takes the approved command is frozen with SIGSTOP while
its action is in flight at the sim. Its Kafka session lapses, its partitions move to the
other executor, its lease expires; the other one takes the lease with a newer epoch,
finds the key not applied, and applies it. When the frozen one resumes, its epoch is no
longer current: it can neither record an outcome nor act at the target, and PostgreSQL
has ended the transaction it was frozen in (otherwise its locks would block the takeover).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from flotilla.fleet import EXECUTOR
from flotilla.keys import public_key_text

from .conftest import E2E_SETTINGS, REPO_ROOT
from .fleet import Fleet, HttpError, Watch, awaiting_approval, group_members, http

pytestmark = pytest.mark.timeout(300)

STANDBY_ID = "standby-executor"
STANDBY_PORT = 18115
STANDBY_LOG = REPO_ROOT / ".stack" / "logs" / "executor-standby.log"


@dataclass(frozen=True)
class ExecutorProcess:
    pid: int
    holder: str
    base_url: str
    log: Path


def fleet_executor(fleet: Fleet) -> ExecutorProcess:
    pid = fleet.pid(EXECUTOR.name)
    holder = f"{os.uname().nodename}-{pid}"  # the default executor id: <hostname>-<pid>
    log = REPO_ROOT / ".stack" / "logs" / "executor.log"
    return ExecutorProcess(pid, holder, f"http://127.0.0.1:{EXECUTOR.http_port}", log)


@pytest.fixture()
def standby(fleet: Fleet) -> Iterator[ExecutorProcess]:
    """A second executor in the executor's consumer group, until both own partitions."""
    env = {
        **os.environ,
        **E2E_SETTINGS,
        "FLOTILLA_SERVICE_NAME": EXECUTOR.name,
        "FLOTILLA_SERVICE_DATABASE": str(EXECUTOR.database),
        "FLOTILLA_HTTP_PORT": str(STANDBY_PORT),
        "FLOTILLA_EXECUTOR_ID": STANDBY_ID,
        "FLOTILLA_SIM_ACTION_TOKEN": fleet.sim_action_token,  # as the fleet's executor holds it
        "FLOTILLA_AUTHORIZATION_PUBLIC_KEYS": json.dumps([public_key_text(fleet.policy_signer.public_key)]),
        # a second executor states outcomes as the executor does (flotilla.provenance)
        "FLOTILLA_SIGNING_KEY_FILE": str(fleet.producer_key_file(EXECUTOR.name)),
        "FLOTILLA_PRODUCER_KEYS": json.dumps(fleet.producer_keys()),
        "PYTHONUNBUFFERED": "1",
    }
    STANDBY_LOG.parent.mkdir(parents=True, exist_ok=True)
    with STANDBY_LOG.open("w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "services.executor"], cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 90
        while group_members(fleet, EXECUTOR.name) < 2:
            assert process.poll() is None, f"the standby executor exited: see {STANDBY_LOG}"
            assert time.monotonic() < deadline, "the two executors never shared the partitions"
            time.sleep(0.5)
        yield ExecutorProcess(process.pid, STANDBY_ID, f"http://127.0.0.1:{STANDBY_PORT}", STANDBY_LOG)
    finally:
        process.send_signal(signal.SIGCONT)
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()


def execution_row(fleet: Fleet, key: str) -> tuple[str, str, int] | None:
    with psycopg.connect(fleet.stack.pg_dsn(EXECUTOR.database)) as conn:
        row = conn.execute("SELECT state, holder, epoch FROM executions WHERE idempotency_key = %s", (key,)).fetchone()
    return None if row is None else (str(row[0]), str(row[1]), int(row[2]))


def lease_on(fleet: Fleet, resource: str) -> tuple[str, int] | None:
    with psycopg.connect(fleet.stack.pg_dsn(EXECUTOR.database)) as conn:
        row = conn.execute("SELECT holder, epoch FROM leases WHERE resource = %s", (resource,)).fetchone()
    return None if row is None else (str(row[0]), int(row[1]))


def test_an_executor_paused_past_its_lease_is_fenced_out(fleet: Fleet, watch: Watch, standby: ExecutorProcess) -> None:
    executors = {e.holder: e for e in (fleet_executor(fleet), standby)}
    incident, request = awaiting_approval(fleet, watch)
    # Long enough for the frozen executor's session and lease to lapse while its action waits.
    fleet.sim("PUT", "/settings", {"actionSeconds": 25})
    paused: ExecutorProcess | None = None
    try:
        fleet.approve(str(request.value["proposalId"]), str(request.value["digest"]))
        command = watch.wait(lambda s: s.topic == "commands" and s.value.get("incidentId") == incident, what="command")
        key = str(command.value["idempotencyKey"])
        target = command.value["target"]
        resource = f"{target['environment']}/{target['name']}"

        deadline = time.monotonic() + 30
        while True:  # one executor took the lease and marked the key PENDING: its action is in flight
            assert time.monotonic() < deadline, "no executor started the action"
            held = lease_on(fleet, resource)
            if held is not None and held[0] in executors and fleet.executor_pending(key):
                break
            time.sleep(0.05)
        first_holder, first_epoch = held
        paused = executors[first_holder]
        os.kill(paused.pid, signal.SIGSTOP)
        # The key is PENDING before the call is sent: wait until the sim admitted the frozen
        # call (it is then asleep for 25 s) before making the other executor's action quick,
        # so the frozen call cannot read the short time. Not admitted within 3 s: it was
        # never sent, and is refused as stale when the process resumes.
        admitted = time.monotonic() + 3
        while time.monotonic() < admitted:
            if fleet.sim("GET", f"/services/{resource}")["newestFencingToken"] == first_epoch:
                break
            time.sleep(0.05)
        fleet.sim("PUT", "/settings", {"actionSeconds": 0.1})

        executed = watch.kind("RecoveryExecuted", incident, timeout=90)
        taken = lease_on(fleet, resource)
        assert taken is not None
        assert taken[0] != first_holder and taken[1] > first_epoch, (taken, first_holder, first_epoch)
        assert executed.value["fencingEpoch"] == taken[1]

        os.kill(paused.pid, signal.SIGCONT)
        paused = None
        # The resumed executor's in-flight call returns, but everything it could write
        # with is gone: PostgreSQL ended its idle transaction (the dedupe claim and saga
        # locks it held went with it, which is what let the other one proceed), its
        # epoch is no longer current, and the key is settled under the newer epoch.
        time.sleep(12)  # past the sim's answer to the frozen call (25 s after it started)
        settled = execution_row(fleet, key)
        assert settled == ("APPLIED", taken[0], taken[1]), settled
        # The target refuses anything carrying the old epoch on that resource.
        with pytest.raises(HttpError) as stale:
            fleet.sim_action(
                "POST",
                "/actions/restart",
                {
                    "idempotencyKey": f"{key}:stale-probe",
                    "fencingToken": first_epoch,
                    "resource": resource,
                    "params": {},
                    "holder": first_holder,
                },
            )
        assert stale.value.status == 409, stale.value.body
    finally:
        if paused is not None:
            os.kill(paused.pid, signal.SIGCONT)
        fleet.sim("PUT", "/settings", {"actionSeconds": 0.1})
    watch.kind("RecoveryCompleted", incident, timeout=60)
    watch.settle(3)
    assert len(watch.of(incident, "RecoveryExecuted")) == 1
    assert not watch.of(incident, "CommandFailed")
    applied = fleet.sim_action("GET", f"/actions/{key}")
    assert applied["status"] == "applied"
    # Both executors answer again, and the one that was frozen kept its process.
    for e in executors.values():
        assert http("GET", e.base_url + "/readyz")["status"] == "ready"
