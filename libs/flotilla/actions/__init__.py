"""The command kinds: one module each, one :class:`ActionSpec` per module.

Everything else that knows about actions derives from :data:`SPECS`: the command
records' fields and idempotency keys (``flotilla.commands``), the reasoners' step schema
and prompt, the remediation agent's records, the policy's Cedar context and the texts a
person approves, the executor's dispatch, outcomes and compensation, the console and the
CLI. Adding a kind: a module here (and its line below), its ``.avsc`` with a line in
``RecoveryProposed``'s union, and what each target does with it; ``make records`` then
regenerates the typed records and the kind's Cedar action (``flotilla_ops.gencedar``).
"""

from __future__ import annotations

import enum

from flotilla.actions import autoscaler_ceiling, failover, memory_limit, pause, restart, rollback, scale
from flotilla.actions.change import Change, NoPreview, change_digest, change_from_json
from flotilla.actions.spec import ActionSpec, CannotUndo, Param, ParamType, Reversal, recorded

__all__ = [
    "SPECS",
    "Action",
    "ActionSpec",
    "CannotUndo",
    "Change",
    "NoPreview",
    "Param",
    "ParamType",
    "Reversal",
    "UnknownAction",
    "by_action",
    "by_kind",
    "change_digest",
    "change_from_json",
    "recorded",
]

SPECS: tuple[ActionSpec, ...] = (
    scale.SPEC,
    restart.SPEC,
    rollback.SPEC,
    failover.SPEC,
    pause.SPEC,
    autoscaler_ceiling.SPEC,
    memory_limit.SPEC,
)


class Action(enum.StrEnum):
    """What a command does at its target (the sim's and the executor's action names)."""

    SCALE = scale.SPEC.action
    RESTART = restart.SPEC.action
    ROLLBACK = rollback.SPEC.action
    FAILOVER = failover.SPEC.action
    PAUSE = pause.SPEC.action
    RAISE_CEILING = autoscaler_ceiling.SPEC.action
    RAISE_MEMORY = memory_limit.SPEC.action


class UnknownAction(KeyError):
    """No kind of that name; the message names the known ones."""


_BY_ACTION = {spec.action: spec for spec in SPECS}
_BY_KIND = {spec.kind: spec for spec in SPECS}


def by_action(action: str) -> ActionSpec:
    try:
        return _BY_ACTION[action]
    except KeyError:
        raise UnknownAction(f"unknown action {action!r} (known: {', '.join(_BY_ACTION)})") from None


def by_kind(kind: str) -> ActionSpec:
    """The spec of ``ScaleService`` or of ``dev.flotilla.commands.ScaleService``."""
    try:
        return _BY_KIND[kind.rpartition(".")[2]]
    except KeyError:
        raise UnknownAction(f"unknown command kind {kind!r} (known: {', '.join(_BY_KIND)})") from None
