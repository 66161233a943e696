"""What the soak inherits from the runs before it (issue 31), checked before the soak runs.

``inherited_proposal`` leaves a proposal for ``production/checkout-api`` waiting for a
person; the soak's fleet then starts with an estate that has no such service. Nobody may
approve it into a command the executor can only fail: the policy service withdraws it
on its own (its periodic target check), refuses an approval with 409, and hands the
incident to people. The soak that follows checks its approver left it alone and that no
command was issued for any incident it did not open (ground_truth.approved_applied).
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from flotilla.fleet import AUDIT, POLICY, url
from tests.chaos.config import APPROVER_TOKEN
from tests.chaos.http import call
from tests.chaos.inherited import Inherited
from tests.e2e.fleet import HttpError

pytestmark = pytest.mark.timeout(600)


def _poll(what: str, probe: Any, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while (found := probe()) is None:
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout:.0f} s")
        time.sleep(0.5)
    return found


def test_a_proposal_pending_from_before_the_soak_is_withdrawn_not_approvable(
    chaos_fleet: dict[str, str], inherited_proposal: Inherited
) -> None:
    left = inherited_proposal
    address = f"{url(POLICY)}/approvals/{left.proposal_id}"

    def withdrawn() -> dict[str, Any] | None:
        shown: dict[str, Any] = call("GET", address, token=APPROVER_TOKEN)
        return shown if shown["status"] != "pending" else None

    shown = _poll("the policy service never withdrew the inherited proposal", withdrawn)
    assert shown["status"] == "withdrawn", shown
    assert shown["resolvedBy"] == "policy-service"
    assert f"{left.target} no longer exists in the estate" in shown["resolution"]

    with pytest.raises(HttpError) as refused:
        call("POST", f"{address}/approve", {"digest": left.digest}, token=APPROVER_TOKEN)
    assert refused.value.status == 409 and "withdrawn" in str(refused.value.body)

    def escalated() -> dict[str, Any] | None:
        try:
            seen: dict[str, Any] = call("GET", f"{url(AUDIT)}/incidents/{left.incident_id}/timeline?limit=1000")
        except HttpError as exc:
            if exc.status == 404:
                return None
            raise
        return seen if seen["status"] == "ESCALATED" else None

    timeline = _poll("the audit never saw the incident escalated", escalated)["timeline"]
    kinds = [entry["type"].rsplit(".", 1)[-1] for entry in timeline]
    assert "RecoveryRejected" in kinds and "IncidentEscalated" in kinds, kinds
    assert "RecoveryApproved" not in kinds
    [rejected] = [e for e in timeline if e["type"].endswith(".RecoveryRejected")]
    assert rejected["value"]["rejectedBy"] == "policy-service"
    assert not [e for e in timeline if e["topic"] == "commands"]
