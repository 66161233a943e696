"""Commands as the executor carries them out: one :class:`Step` per mutation.

A step is either an authorized command read off the ``commands`` topic or a
compensation the executor derived itself (:mod:`services.executor.saga`); both go through
the same lease, idempotency and target code. This module is pure: no I/O.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from flotilla import BusinessRuleViolation, actions
from flotilla.actions import ActionSpec
from flotilla.commands import resource_key

# command record -> its kind's definition, from the one table of kinds
SPECS: dict[str, ActionSpec] = {spec.record_type: spec for spec in actions.SPECS}
SCALE, RESTART, ROLLBACK, FAILOVER = (
    actions.by_action(a).record_type for a in (actions.Action.SCALE, "restart", "rollback", "failover")
)

COMPENSATE_SUFFIX = ":compensate"
_COMPENSATION_IDS = uuid.UUID("6d0f4c1e-5a0b-4f7e-9a43-3c1b2f8e7d10")  # namespace for derived command ids


@dataclass(frozen=True)
class Step:
    """One mutation of one resource, with everything needed to run, record and report it."""

    command_id: str
    command_type: str
    idempotency_key: str
    incident_id: str
    proposal_id: str
    target: Mapping[str, str]  # ResourceRef: kind, environment, name
    action: str
    params: Mapping[str, Any]
    expires_at: datetime | None = None  # None: never (compensations must always run)
    compensates: str | None = None  # commandId of the step this one undoes
    # The digest of the change a person approved (the authorization's signed
    # expectedChange): the target dry-runs the step and refuses another change. None: no
    # change was shown (automatic, or a target that cannot dry-run); compensations carry none.
    expected_change: str | None = None

    @property
    def resource(self) -> str:
        """The lease and fencing scope, and the commands-topic key: ``<environment>/<name>``."""
        return resource_key(self.target)

    @property
    def spec(self) -> ActionSpec:
        """The definition of this step's kind (texts, undo)."""
        return actions.by_action(self.action)

    @property
    def name(self) -> str:
        return str(self.target["name"])

    def expired(self, now: datetime) -> bool:
        return self.expires_at is not None and now >= self.expires_at


def is_command(record_type: str) -> bool:
    return record_type in SPECS


def from_record(record_type: str, value: Mapping[str, Any], expected_change: str | None = None) -> Step:
    """The step a decoded command record asks for; BusinessRuleViolation if it cannot run.
    ``expected_change``: what the verified authorization says a person approved."""
    if record_type not in SPECS:
        raise BusinessRuleViolation(f"{record_type} is not a command the executor carries out")
    spec = SPECS[record_type]
    key = str(value["idempotencyKey"]).strip()
    if not key:
        raise BusinessRuleViolation("a command without an idempotency key is never executed")
    if key.endswith(COMPENSATE_SUFFIX):
        raise BusinessRuleViolation(f"idempotency key {key!r} is reserved for the executor's compensations")
    target = {k: str(value["target"][k]) for k in ("kind", "environment", "name")}
    if not target["name"] or not target["environment"]:
        raise BusinessRuleViolation("a command must name its target's environment and name")
    return Step(
        command_id=str(value["commandId"]),
        command_type=record_type,
        idempotency_key=key,
        incident_id=str(value["incidentId"]),
        proposal_id=str(value["proposalId"]),
        target=target,
        action=spec.action,
        params=spec.params_of(value),
        expires_at=value["expiresAt"],
        expected_change=expected_change,
    )


def compensation(of: Step, action: str, params: Mapping[str, Any]) -> Step:
    """The step that undoes ``of``: its own key (``<key>:compensate``) and a command id
    derived from the original's, so a retried compensation is the same compensation."""
    return Step(
        command_id=str(uuid.uuid5(_COMPENSATION_IDS, f"{of.command_id}{COMPENSATE_SUFFIX}")),
        command_type=actions.by_action(action).record_type,
        idempotency_key=of.idempotency_key + COMPENSATE_SUFFIX,
        incident_id=of.incident_id,
        proposal_id=of.proposal_id,
        target=of.target,
        action=action,
        params=dict(params),
        expires_at=None,
        compensates=of.command_id,
    )
