"""Move a service's dependency to its configured failover target (undone by moving it back)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flotilla.actions.spec import ActionSpec, Param, ParamType, Reversal, recorded


def _describe(where: str, params: Mapping[str, Any]) -> str:
    return f"fail over {params['dependency']} of {where} to {params['toTarget']}"


def _outcome(name: str, params: Mapping[str, Any], before: Mapping[str, Any], after: Mapping[str, Any]) -> str:
    dependency = params.get("dependency", "?")
    return (
        f"{name}'s dependency {dependency} switched from {before.get('activeTarget', '?')}"
        f" to {after.get('activeTarget', '?')}"
    )


def _undo(name: str, params: Mapping[str, Any], before: Mapping[str, Any], after: Mapping[str, Any]) -> Reversal:
    dependency = str(params["dependency"])
    previous = str(recorded(before, "activeTarget"))
    return Reversal({"dependency": dependency, "toTarget": previous}, f"fail {name}'s {dependency} back to {previous}")


SPEC = ActionSpec(
    kind="FailoverDependency",
    action="failover",
    usage="failover (dependency and toTarget, one of the service's failoverTargets)",
    params=(
        Param("dependency", ParamType.TEXT, "failover: the dependency to move"),
        Param("toTarget", ParamType.TEXT, "failover: one of the service's failover targets"),
    ),
    describe=_describe,
    outcome=_outcome,
    undo=_undo,
)
