"""The approval API: people see pending proposals and approve or reject exact digests.

``POST /approvals/{proposalId}/approve`` and ``/reject`` take ``{"digest": ...,
"changeDigest"?: ..., "reason"?: ...}`` and a bearer token; an approval must repeat the
``changeDigest`` of the changes it was shown when the proposal has one (409 otherwise).
401 without a valid token; 403 without the role or when the approver proposed the plan;
404 for an unknown proposal; 409 for a digest mismatch, a passed deadline (the proposal
is then expired), a proposal already decided, superseded or no longer current, or an
incident that has moved on. ``GET /approvals`` (``?status=pending`` by default, ``all``
or any status) and ``GET /approvals/{id}`` show each proposal with its steps, digest,
the change each step makes (its target's dry run, or why there is none), reasons,
deadline and seconds left.
"""

# No `from __future__ import annotations` here: FastAPI reads the route signatures at
# run time, and the caller dependency is a local alias it could not resolve from a string.

import logging
import uuid
from datetime import datetime
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, HTTPException, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from flotilla import ServiceContext
from services.policy import store
from services.policy.approval_rules import Action, ProposalStatus, Refusal, seconds_left
from services.policy.approvals import decide_by_person
from services.policy.auth import Person
from services.policy.commands import command_kind, describe, from_epoch_ms
from services.policy.runtime import PolicyRuntime

log = logging.getLogger(__name__)


class DecisionBody(BaseModel):
    """What a person sends: the digest they saw, and optionally why."""

    model_config = ConfigDict(extra="forbid")

    digest: str = Field(min_length=1, max_length=200)
    reason: str | None = Field(default=None, max_length=2000)
    # The digest of the changes they were shown (``changeDigest`` of the proposal): an
    # approval of a proposal that has one must repeat it.
    change_digest: str | None = Field(default=None, alias="changeDigest", min_length=1, max_length=200)


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


# What a proposal decided before previews existed, or never put to a person, shows.
NOT_PREVIEWED = {"unavailable": "no dry run was asked for when this proposal was decided"}


def render(p: store.StoredProposal, now: datetime) -> dict[str, Any]:
    """A proposal with everything an approver needs to decide on it, including the exact
    change each step makes where its target could dry-run it (``change``: Change JSON with
    its ``lines``, or ``{"unavailable": why}``) and the ``changeDigest`` that binds them."""
    changes = p.changes if p.changes is not None and len(p.changes) == len(p.steps) else None
    return {
        "proposalId": p.proposal_id,
        "incidentId": p.incident_id,
        "status": p.status.value,
        "decision": p.decision,
        "dryRun": p.dry_run,
        "summary": p.summary,
        "digest": p.digest,
        "changeDigest": p.change_digest,
        # The exact digest input: sha256 of its canonical JSON is `digest`.
        "steps": p.steps,
        "commands": [
            {
                "commandId": step["commandId"],
                "kind": command_kind(step),
                "target": f"{step['target']['environment']}/{step['target']['name']}",
                "description": describe(step),
                "idempotencyKey": step["idempotencyKey"],
                "expiresAt": _iso(from_epoch_ms(int(step["expiresAt"]))),
                "change": NOT_PREVIEWED if changes is None else changes[index],
            }
            for index, step in enumerate(p.steps)
        ],
        "reasons": p.reasons,
        "policyIds": p.policy_ids,
        "decisionDetail": p.decision_detail,
        "requiredRole": p.required_role,
        "proposedBy": p.proposed_by,
        "proposedAt": _iso(p.proposed_at),
        "decidedAt": _iso(p.decided_at),
        "deadline": _iso(p.deadline),
        "secondsLeft": seconds_left(p.deadline, now) if p.status is ProposalStatus.PENDING else 0,
        "resources": p.resources,
        "supersededBy": p.superseded_by,
        "resolvedBy": p.resolved_by,
        "resolvedAt": _iso(p.resolved_at),
        "resolution": p.resolution,
    }


def install_routes(app: FastAPI, svc: ServiceContext, runtime: PolicyRuntime) -> None:
    if runtime.demo_users:
        log.warning(
            "approval API uses the public demo users (alice-token, bob-token) of FLOTILLA_PROFILE=demo: "
            "set FLOTILLA_POLICY_USERS"
        )

    def person(authorization: Annotated[str | None, Header()] = None) -> Person:
        found = runtime.tokens.authenticate_header(authorization)
        if found is None:
            raise HTTPException(401, "a valid bearer token is required", headers={"WWW-Authenticate": "Bearer"})
        return found

    Caller = Annotated[Person, Depends(person)]

    @app.get("/me")
    def who_am_i(caller: Caller) -> dict[str, Any]:
        """Who the token belongs to, so a console or CLI can say whose hands it is in."""
        return {"user": caller.name, "roles": sorted(caller.roles)}

    @app.get("/approvals")
    def list_approvals(caller: Caller, status: Annotated[str, Query()] = "pending") -> list[dict[str, Any]]:
        wanted: ProposalStatus | None = None
        if status != "all":
            try:
                wanted = ProposalStatus(status)
            except ValueError:
                raise HTTPException(422, f"unknown status {status!r}") from None
        with svc.pool.connection() as conn:
            found = store.listing(conn, wanted)
        now = svc.now()
        return [render(p, now) for p in found]

    @app.get("/approvals/{proposal_id}")
    def get_approval(proposal_id: uuid.UUID, caller: Caller) -> dict[str, Any]:
        with svc.pool.connection() as conn:
            found = store.get(conn, str(proposal_id))
        if found is None:
            raise HTTPException(404, f"no proposal {proposal_id}")
        return render(found, svc.now())

    def decide(proposal_id: uuid.UUID, body: DecisionBody, caller: Person, action: Action) -> Any:
        try:
            decided = decide_by_person(
                svc,
                runtime,
                proposal_id=str(proposal_id),
                person=caller,
                action=action,
                digest=body.digest,
                reason=body.reason,
                change_digest=body.change_digest,
            )
        except Refusal as refusal:
            log.info("%s of %s by %s refused (%d): %s", action, proposal_id, caller.name, refusal.status, refusal)
            return JSONResponse(
                status_code=refusal.status, content={"detail": refusal.detail, "policyIds": refusal.policy_ids}
            )
        return {
            "proposalId": decided.proposal_id,
            "incidentId": decided.incident_id,
            "status": decided.status.value,
            "by": decided.by,
            "eventIds": decided.event_ids,
            "commandIds": decided.command_ids,
        }

    @app.post("/approvals/{proposal_id}/approve")
    def approve(proposal_id: uuid.UUID, body: DecisionBody, caller: Caller) -> Any:
        return decide(proposal_id, body, caller, Action.APPROVE)

    @app.post("/approvals/{proposal_id}/reject")
    def reject(proposal_id: uuid.UUID, body: DecisionBody, caller: Caller) -> Any:
        return decide(proposal_id, body, caller, Action.REJECT)
