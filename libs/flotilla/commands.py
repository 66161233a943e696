"""The commands, as every service that proposes, authorizes or executes them sees them.

A command record is the same whether a remediation agent proposes it (a step of a
RecoveryProposed), the policy service issues it (on ``commands``, signed) or the
executor carries it out: common fields, plus the few fields of its kind. This module
says, from the one definition of each kind (:mod:`flotilla.actions`), which kind has
which fields, which action it is at the target, and how its idempotency key is derived —
in one place, so that the key the agent proposes is the key the policy service checks
and the executor dedupes by.

Idempotency keys are ``<incidentId>:<proposalId>:<action>:<target name>:<params>``, e.g.
``incident-7:0b6f…:scale:checkout-api:12``. The proposal id (a random UUID, fixed when
the agent proposes) makes a key unguessable for anyone who has not seen the proposal:
nobody can squat the key of a command still waiting for a person, and two incidents — or
one incident's number reused after a database was recreated — never share keys. The
cost: a revised proposal for the same effect is a new key, so the executor may run the
same absolute action twice (scaling to 12 twice changes nothing; a restart twice is two
restarts, which a revision that asks for it again means).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flotilla.actions import SPECS, by_kind

__all__ = [
    "ACTIONS",
    "COMMANDS_TOPIC",
    "COMMON_FIELDS",
    "KINDS",
    "NAMESPACE",
    "idempotency_key",
    "kind_of",
    "params_of",
    "record_type",
    "resource_key",
]

NAMESPACE = "dev.flotilla.commands"
COMMANDS_TOPIC = "commands"

# kind -> (the action at the target, the kind's own fields in record order), from the specs
KINDS: dict[str, tuple[str, tuple[str, ...]]] = {spec.kind: (spec.action, spec.fields) for spec in SPECS}
ACTIONS = {action: kind for kind, (action, _) in KINDS.items()}

# Fields every command has; each kind adds its own (and nothing else). A command on the
# topic also carries `authorization` (flotilla.digest.AUTHORIZATION_FIELD), never a step.
COMMON_FIELDS = frozenset(
    {"commandId", "idempotencyKey", "incidentId", "proposalId", "target", "issuedAt", "expiresAt"}
)


def record_type(kind: str) -> str:
    """The record's full name, which is also its ce_type: ``dev.flotilla.commands.<kind>``."""
    return f"{NAMESPACE}.{kind}"


def kind_of(record_type_name: str) -> str | None:
    """``ScaleService`` for ``dev.flotilla.commands.ScaleService``; None for anything else."""
    namespace, _, kind = record_type_name.rpartition(".")
    return kind if namespace == NAMESPACE and kind in KINDS else None


def params_of(kind: str, step: Mapping[str, Any]) -> dict[str, Any]:
    """The kind's own fields of ``step``: the parameters of the action (defaults filled)."""
    return by_kind(kind).params_of(step)


def resource_key(target: Mapping[str, Any]) -> str:
    """``<environment>/<name>``: the Kafka key on ``commands``, the lease and fencing scope."""
    return f"{target['environment']}/{target['name']}"


def _param_text(name: str, value: Any) -> str:
    if name == "rolling":  # the key's words for a restart, unchanged since keys were first written
        return "rolling" if value else "all"
    if isinstance(value, bool):
        return name if value else f"not-{name}"
    return str(value)


def idempotency_key(kind: str, step: Mapping[str, Any]) -> str:
    """The one key of this step (see the module docstring for why it has this shape)."""
    spec = by_kind(kind)
    params = ":".join(_param_text(name, step[name]) for name in spec.key_fields)
    return f"{step['incidentId']}:{step['proposalId']}:{spec.action}:{step['target']['name']}:{params}"
