"""Pause a rollout that is going bad while a person decides, or resume it.

One kind for both directions (``paused`` true or false): a paused Deployment keeps the
pods it has and starts no new revision until it is resumed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flotilla.actions.spec import ActionSpec, CannotUndo, Param, ParamType, Reversal


def _verb(params: Mapping[str, Any]) -> str:
    return "pause" if params.get("paused") else "resume"


def _describe(where: str, params: Mapping[str, Any]) -> str:
    return f"{_verb(params)} the rollout of {where}"


def _outcome(name: str, params: Mapping[str, Any], before: Mapping[str, Any], after: Mapping[str, Any]) -> str:
    state = "paused" if after.get("paused") else "resumed"
    return f"{name}'s rollout {state}" + (" (it already was)" if before.get("paused") == after.get("paused") else "")


def _undo(name: str, params: Mapping[str, Any], before: Mapping[str, Any], after: Mapping[str, Any]) -> Reversal:
    if not isinstance(before.get("paused"), bool):
        raise CannotUndo("the recorded before-state has no paused")
    paused = bool(before["paused"])
    return Reversal({"paused": paused}, f"{'pause' if paused else 'resume'} the rollout of {name} again")


SPEC = ActionSpec(
    kind="PauseRollout",
    action="pause",
    usage="pause (paused: true stops the service's rollout where it is, false resumes it)",
    params=(Param("paused", ParamType.BOOL, "pause: true pauses the rollout, false resumes it"),),
    describe=_describe,
    outcome=_outcome,
    undo=_undo,
    reasoners_plan=False,  # the evidence does not read it yet
)
