"""A bad rollout on the running fleet: detected, diagnosed as the deployment, planned as a
rollback to the exact revision before it, shown to a person with both images, approved
with the CLI, executed once and verified (issue 40's end-to-end test on the local fleet)."""

from __future__ import annotations

import pytest
from flotilla_ops.cli import app
from typer.testing import CliRunner

from .fleet import APPROVER, DEMO_SERVICE, Fleet, Watch

pytestmark = pytest.mark.timeout(300)


def test_a_bad_rollout_is_rolled_back_after_a_person_saw_the_image_change(fleet: Fleet, watch: Watch) -> None:
    before = fleet.sim("GET", f"/services/{DEMO_SERVICE}")
    healthy = str(before["revision"])
    watch.settle(4)  # the agents see the healthy revision before the change, as they would in an estate
    fleet.fault(DEMO_SERVICE, "bad-deploy")
    bad = str(fleet.sim("GET", f"/services/{DEMO_SERVICE}")["revision"])
    assert bad != healthy

    opened = watch.wait(
        lambda s: s.kind == "ServiceLatencyIncreased" and s.value.get("service") == DEMO_SERVICE,
        timeout=60,
        what=f"ServiceLatencyIncreased for {DEMO_SERVICE}",
    )
    incident = opened.envelope.correlationid
    diagnosis = watch.kind("DiagnosisConcluded", incident, timeout=90)
    assert diagnosis.value["causeCategory"] == "bad-deployment", diagnosis.value
    request = watch.kind("HumanApprovalRequired", incident, timeout=90)
    proposal, digest = str(request.value["proposalId"]), str(request.value["digest"])

    # what the person is shown: the exact revisions and images, from the policy's own reading
    # of the proposal's steps (the sim cannot dry-run, so the step's own text is the change)
    shown = CliRunner().invoke(app, ["approvals", "show", proposal, "--token", APPROVER])
    assert shown.exit_code == 0, shown.stderr
    wanted = (
        f"roll {DEMO_SERVICE} in production back from revision {bad} ({DEMO_SERVICE}={DEMO_SERVICE}:{bad})"
        f" to revision {healthy} ({DEMO_SERVICE}={DEMO_SERVICE}:{healthy})"
    )
    assert wanted in shown.stdout, shown.stdout

    approved = CliRunner().invoke(app, ["approve", proposal, "--yes", "--token", APPROVER])
    assert approved.exit_code == 0, approved.stdout + approved.stderr
    assert digest in approved.stdout and wanted in approved.stdout

    executed = watch.kind("RecoveryExecuted", incident)
    assert executed.value["idempotencyKey"] == f"{incident}:{proposal}:rollback:{DEMO_SERVICE}:{healthy}"
    assert f"moved from {bad} to {healthy}" in executed.value["outcome"], executed.value["outcome"]
    watch.kind("RecoveryCompleted", incident, timeout=60)
    after = fleet.sim("GET", f"/services/{DEMO_SERVICE}")
    assert after["revision"] == healthy
    assert len(watch.of(incident, "RecoveryExecuted")) == 1


def test_a_release_marked_irreversible_goes_to_a_person_without_a_rollback(fleet: Fleet, watch: Watch) -> None:
    watch.settle(4)
    fleet.fault(DEMO_SERVICE, "bad-deploy")
    fleet.fault(DEMO_SERVICE, "rollback-forbidden")
    opened = watch.wait(
        lambda s: s.kind == "ServiceLatencyIncreased" and s.value.get("service") == DEMO_SERVICE,
        timeout=60,
        what=f"ServiceLatencyIncreased for {DEMO_SERVICE}",
    )
    incident = opened.envelope.correlationid
    escalated = watch.kind("IncidentEscalated", incident, timeout=120)
    assert "irreversible" in escalated.value["reason"] or "forbid" in escalated.value["reason"], escalated.value
    assert not watch.of(incident, "RecoveryExecuted")
    assert not [s for s in watch.of(incident, "RecoveryProposed") if "rollback" in str(s.value["steps"])]
