"""The rules a person's approval or rejection must pass, as pure functions.

Principle 8: humans approve *exact* actions. An approval names a proposal and the
digest of its exact steps; it expires; the approver must hold the approver role and
must not be the proposer. A late or mismatched approval is a stale transition and is
refused. The HTTP layer maps each refusal to a status code; the database layer runs
these checks again on the row it has locked, just before acting.
"""

from __future__ import annotations

import enum
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from flotilla import Status as IncidentStatus
from flotilla.digest import command_digest
from services.policy import preview
from services.policy.auth import Person
from services.policy.decide import PersonCheck, PolicyEngine, Target


class ProposalStatus(enum.StrEnum):
    AUTHORIZED = "authorized"  # auto-approved by policy, commands issued
    PENDING = "pending"  # waiting for a person
    DENIED = "denied"
    DRY_RUN = "dry-run"  # decided, reported, nothing authorized
    APPROVED = "approved"  # approved by a person, commands issued
    REJECTED = "rejected"
    EXPIRED = "expired"
    SUPERSEDED = "superseded"  # a newer proposal for the same incident and resource
    CANCELLED = "cancelled"  # the incident escalated while it waited
    WITHDRAWN = "withdrawn"  # a target of the plan left the estate while it waited


# Incident states in which an approval may still move the incident forward. NEW means
# this service has no workflow row for the incident (nothing to contradict).
DECIDABLE_INCIDENT_STATES = frozenset({IncidentStatus.NEW, IncidentStatus.PROPOSED, IncidentStatus.AWAITING_APPROVAL})


class Action(enum.StrEnum):
    APPROVE = "approve"
    REJECT = "reject"

    @property
    def cedar(self) -> str:
        return "Approve" if self is Action.APPROVE else "Reject"


@dataclass(frozen=True)
class ProposalView:
    """What the rules look at of a stored proposal."""

    proposal_id: str
    incident_id: str
    proposed_by: str
    digest: str
    status: ProposalStatus
    deadline: datetime | None
    targets: tuple[Target, ...]
    required_role: str
    superseded_by: str | None = None
    change_digest: str | None = None  # of the changes the person was shown, when any


class Refusal(Exception):
    """The request is refused; ``status`` is the HTTP status code to answer with."""

    def __init__(
        self,
        status: int,
        detail: str,
        *,
        expire: bool = False,
        withdraw: bool = False,
        policy_ids: list[str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.expire = expire  # the proposal is past its deadline: record the expiry
        self.withdraw = withdraw  # a target left the estate: record the withdrawal
        self.policy_ids = policy_ids or []


def same_principal(a: str, b: str) -> bool:
    """Names compare without case or surrounding blanks: "Alice " is alice."""
    return a.strip().casefold() == b.strip().casefold()


def check_person(engine: PolicyEngine, action: Action, person: Person, proposal: ProposalView) -> PersonCheck:
    """403 unless the Cedar policies let ``person`` take ``action`` on every target, and
    (checked again outside Cedar, so a policy edit cannot drop it) the person holds the
    required role and, to approve, is not the proposer."""
    check = engine.check_person(
        user=person.name,
        roles=person.roles,
        action=action.cedar,
        targets=proposal.targets,
        proposed_by=proposal.proposed_by,
    )
    if not check.allowed:
        raise Refusal(403, "; ".join(check.reasons) or f"{person.name} may not {action}", policy_ids=check.policy_ids)
    if not person.holds(proposal.required_role):
        raise Refusal(403, f"{person.name} does not hold the {proposal.required_role} role")
    if action is Action.APPROVE and same_principal(person.name, proposal.proposed_by):
        raise Refusal(403, f"{person.name} proposed this plan and cannot approve it")
    return check


def check_digest(proposal: ProposalView, digest: str) -> None:
    """409 unless the caller names the exact steps that are pending."""
    if not hmac.compare_digest(digest.encode(), proposal.digest.encode()):
        raise Refusal(409, f"digest mismatch: proposal {proposal.proposal_id} has digest {proposal.digest}")


def check_change(proposal: ProposalView, change_digest: str | None) -> None:
    """409 unless an approval names the changes the person was shown (the targets' dry
    runs, services/policy/preview.py): a proposal that binds a change needs its digest, and
    one that binds none takes no digest (a page that showed a change this proposal does
    not have was showing another one)."""
    if proposal.change_digest is None and change_digest is None:
        return
    if (
        proposal.change_digest is None
        or change_digest is None
        or not hmac.compare_digest(change_digest.encode(), proposal.change_digest.encode())
    ):
        raise Refusal(
            409,
            f"you were shown another change: proposal {proposal.proposal_id} binds the change digest "
            f"{proposal.change_digest or '(none: its targets gave no dry run)'}, and the approval named "
            f"{change_digest or 'none'}; look at the proposal again before approving it",
        )


def check_stored_changes(proposal: ProposalView, changes: Sequence[Mapping[str, Any]] | None) -> None:
    """409 unless the stored changes (what the person was shown, and what each command's
    ``expectedChange`` is taken from) still hash to the change digest the person approved."""
    try:
        stored = None if changes is None else preview.changes_digest(preview.from_json(changes))
    except (KeyError, TypeError, ValueError) as exc:  # not readable: edited by hand
        stored = f"(none: {exc})"
    if stored != proposal.change_digest:
        raise Refusal(
            409,
            f"proposal {proposal.proposal_id}: the stored changes were edited after they were shown (they hash to "
            f"{stored}, not to {proposal.change_digest}); nothing was signed",
        )


def check_stored_steps(proposal: ProposalView, steps: Sequence[Mapping[str, Any]]) -> None:
    """409 unless the stored ``steps`` still hash to the proposal's digest: the digest the
    remediation agent's attestation covered when the proposal was received, and the one the
    approver named. The commands an approval signs are rebuilt from these steps, and
    whoever holds the policy database's role could have edited them since (the console
    warns of that; the API must refuse): then nothing is signed."""
    try:
        stored = command_digest(steps)
    except (TypeError, ValueError) as exc:  # not even digestible: edited by hand
        stored = f"(none: {exc})"
    if not hmac.compare_digest(stored.encode(), proposal.digest.encode()):
        raise Refusal(
            409,
            f"proposal {proposal.proposal_id}: the stored proposal was edited after it was proposed (its steps "
            f"hash to {stored}, not to the proposed digest {proposal.digest}); nothing was signed",
        )


def check_open(proposal: ProposalView, now: datetime) -> None:
    """409 unless the proposal still waits for a person and its deadline has not passed."""
    if proposal.status is ProposalStatus.SUPERSEDED:
        raise Refusal(409, f"proposal {proposal.proposal_id} was superseded by proposal {proposal.superseded_by}")
    if proposal.status is not ProposalStatus.PENDING:
        raise Refusal(409, f"proposal {proposal.proposal_id} is {proposal.status}, not waiting for approval")
    if proposal.deadline is None or now > proposal.deadline:
        raise Refusal(409, f"approval deadline {_iso(proposal.deadline)} has passed: the proposal expired", expire=True)


def check_incident(proposal: ProposalView, status: IncidentStatus) -> None:
    """409 when the incident has moved on (authorized, escalated, resolved, ...)."""
    if status not in DECIDABLE_INCIDENT_STATES:
        raise Refusal(409, f"incident {proposal.incident_id} is {status}: it no longer accepts a decision")


def check_request(
    engine: PolicyEngine, action: Action, person: Person, proposal: ProposalView, digest: str, now: datetime
) -> PersonCheck:
    """Every rule that needs no lock, in the order a caller should learn about them:
    who you are (403), what you named (409), whether it is still open (409)."""
    check = check_person(engine, action, person, proposal)
    check_digest(proposal, digest)
    check_open(proposal, now)
    return check


def seconds_left(deadline: datetime | None, now: datetime) -> int:
    if deadline is None:
        return 0
    return max(0, int((deadline - now).total_seconds()))


def _iso(value: datetime | None) -> str:
    return value.isoformat() if value is not None else "(none)"
