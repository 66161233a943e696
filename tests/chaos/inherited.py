"""State the soak inherits: a proposal left waiting for a person by whatever ran before.

``make demo`` and the e2e suite run on the same stack before ``make test`` reaches the
soak, and their last incidents can still wait for an approval when the soak's fleet
starts with its own estate (issue 31: the soak's approver approved such a proposal for
``production/checkout-api``, which the soak's estate does not have, and the executor's
command failed at the sim). This makes that situation on purpose, every run: the default
estate's fleet opens an incident for checkout-api and leaves its proposal pending, and
only then does the soak's fleet start.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

from flotilla.fleet import POLICY, SIM, url
from tests.chaos.config import APPROVER_TOKEN
from tests.chaos.http import call

SERVICE, DEPENDENCY = "checkout-api", "payments-api"  # the default estate's demo incident

# The default estate's fleet, quick to detect, with an approval that outlives the soak.
SETTINGS = {
    "FLOTILLA_HEALTH_SCRAPE_SECONDS": "0.5",
    "FLOTILLA_HEALTH_BREACH_SCRAPES": "2",
    "FLOTILLA_APPROVAL_TTL_SECONDS": "3600",
    "FLOTILLA_POLICY_USERS": json.dumps({APPROVER_TOKEN: {"user": "chaos-approver", "roles": ["approver"]}}),
}


@dataclass(frozen=True)
class Inherited:
    proposal_id: str
    incident_id: str
    digest: str
    target: str  # <environment>/<name>


def environment() -> dict[str, str]:
    """The default estate's fleet: no FLOTILLA_SIM_SERVICES from the surroundings."""
    env = {k: v for k, v in os.environ.items() if k != "FLOTILLA_SIM_SERVICES"}
    return {**env, **SETTINGS}


def leave_a_proposal_pending(timeout: float = 120) -> Inherited:
    """Slow the demo dependency until checkout-api's recovery waits for a person, then end
    the fault (the breach is over, the approval still waits, as in issue 31)."""
    call("POST", f"{url(SIM)}/reset")
    fault = call("POST", f"{url(SIM)}/faults", {"service": DEPENDENCY, "kind": "dependency-slow"})
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for pending in call("GET", f"{url(POLICY)}/approvals?status=pending", token=APPROVER_TOKEN):
                targets = {c["target"] for c in pending["commands"]}
                if f"production/{SERVICE}" in targets:
                    return Inherited(
                        pending["proposalId"], pending["incidentId"], pending["digest"], f"production/{SERVICE}"
                    )
            time.sleep(0.5)
        raise AssertionError(f"no proposal for production/{SERVICE} waited for a person within {timeout:.0f} s")
    finally:
        call("DELETE", f"{url(SIM)}/faults/{fault['id']}")
