"""Restart a service's instances, rolling or all at once (nothing to undo)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flotilla.actions.spec import ActionSpec, Param, ParamType, Reversal


def _how(params: Mapping[str, Any]) -> str:
    return "rolling" if params.get("rolling") else "all instances at once"


def _describe(where: str, params: Mapping[str, Any]) -> str:
    return f"restart {where} ({_how(params)})"


def _outcome(name: str, params: Mapping[str, Any], before: Mapping[str, Any], after: Mapping[str, Any]) -> str:
    return f"{name} restarted ({'rolling' if params.get('rolling') else 'all at once'})"


def _undo(name: str, params: Mapping[str, Any], before: Mapping[str, Any], after: Mapping[str, Any]) -> Reversal:
    return Reversal(None, f"restart of {name} has nothing to undo")


SPEC = ActionSpec(
    kind="RestartService",
    action="restart",
    usage="restart (rolling: true or false)",
    params=(Param("rolling", ParamType.BOOL, "restart: one instance at a time"),),
    describe=_describe,
    outcome=_outcome,
    undo=_undo,
)
