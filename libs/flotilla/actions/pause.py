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
    """A pause is left in place: resuming a rollout that was stopped because it went bad,
    only because a later step failed, would restart the harm. A resume is undone by
    pausing again, the safe direction."""
    if params.get("paused"):
        return Reversal(None, f"the rollout of {name} stays paused: a person resumes it")
    if before.get("paused") is not True:
        raise CannotUndo("the recorded before-state does not say the rollout was paused")
    return Reversal({"paused": True}, f"pause the rollout of {name} again")


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
