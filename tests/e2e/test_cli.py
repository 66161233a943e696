"""The `flotilla` CLI against the running fleet: an incident driven to a human approval,
approved from the command line, then its timeline and the audit chain read back."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from flotilla_ops.cli import app
from typer.testing import CliRunner

from .fleet import Fleet, Watch, awaiting_approval

pytestmark = pytest.mark.timeout(300)

APPROVER = "alice-token"
VIEWER = "bob-token"
FLOTILLA = Path(sys.executable).parent / "flotilla"


def flotilla(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def as_json(*args: str) -> Any:
    code, out, err = flotilla("--json", *args)
    assert code == 0, out + err
    return json.loads(out)


def test_approve_from_the_cli_then_read_the_timeline_and_verify_the_audit(fleet: Fleet, watch: Watch) -> None:
    incident, request = awaiting_approval(fleet, watch)
    proposal, digest = str(request.value["proposalId"]), str(request.value["digest"])

    # what is waiting, as a viewer sees it
    pending = as_json("approvals", "list", "--token", VIEWER)["approvals"]
    mine = [p for p in pending if p["proposalId"] == proposal]
    assert mine and mine[0]["incidentId"] == incident and mine[0]["digest"] == digest
    assert mine[0]["commands"] and mine[0]["secondsLeft"] > 0

    # a viewer cannot approve (403 → 1); nothing happens
    code, _, err = flotilla("approve", proposal, "--yes", "--token", VIEWER)
    assert code == 1 and "403" in err

    # the approver: shown the proposal, approves the digest shown
    code, out, err = flotilla("approve", proposal, "--yes", "--token", APPROVER)
    assert code == 0, out + err
    assert digest in out and incident in out and "approved by alice" in out
    approved = watch.kind("RecoveryApproved", incident)
    assert approved.value["approvedBy"] == "alice" and approved.value["digest"] == digest
    watch.kind("RecoveryExecuted", incident)
    watch.kind("RecoveryCompleted", incident, timeout=60)

    # a second approval is refused before anything is sent
    code, _, err = flotilla("approve", proposal, "--yes", "--token", APPROVER)
    assert code == 1 and "there is nothing to approve" in err

    # tail finds the approval, decoded
    tailed = CliRunner().invoke(
        app,
        ["tail", "--since", "10m", "--incident", incident, "--type", "RecoveryApproved", "--max", "1",
         "--timeout", "30", "--json"],
    )  # fmt: skip
    assert tailed.exit_code == 0, tailed.stderr
    assert json.loads(tailed.stdout.splitlines()[0])["value"]["proposalId"] == proposal

    # the timeline, once the audit has recorded the completion
    deadline = time.monotonic() + 30
    while True:
        found = as_json("incidents", "show", incident)
        kinds = [e["type"].rsplit(".", 1)[-1] for e in found["timeline"]]
        if "RecoveryCompleted" in kinds or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    for kind in ("ServiceLatencyIncreased", "HumanApprovalRequired", "RecoveryApproved", "RecoveryExecuted",
                 "RecoveryCompleted"):  # fmt: skip
        assert kind in kinds, kinds
    assert kinds[0] == "ServiceLatencyIncreased"
    by_kind = {e["type"].rsplit(".", 1)[-1]: e for e in found["timeline"]}
    approval = by_kind["RecoveryApproved"]
    assert approval["causePosition"] is not None and approval["sinceCauseMs"] >= 0
    assert all(e["sincePreviousMs"] is None or e["sincePreviousMs"] >= 0 for e in found["timeline"])
    code, out, _ = flotilla("incidents", "show", incident)
    assert code == 0 and f"incident {incident}" in out and "caused by" in out
    listed = as_json("incidents", "list")["incidents"]
    assert any(i["incidentId"] == incident for i in listed)

    # the audit chain, through the console script (the whole log is walked: allow for its size)
    verified = subprocess.run([str(FLOTILLA), "audit", "verify"], capture_output=True, text=True, timeout=240)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "audit chain intact" in verified.stdout
