"""Raise one container's memory limit after it was killed for running out of memory.

The plan names the limit it found (``fromMemoryLimitBytes``): a target refuses when the
limit is no longer that, above 2x it, or above the maximum the Deployment declares
(``flotilla.dev/max-memory-limit``). A new limit is a new pod template, so it rolls out
as a new revision, which a rollback can undo.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flotilla.actions.quantity import format_bytes
from flotilla.actions.spec import ActionSpec, Param, ParamType, Reversal


def _describe(where: str, params: Mapping[str, Any]) -> str:
    return (
        f"raise the memory limit of container {params['container']} of {where}"
        f" from {format_bytes(params['fromMemoryLimitBytes'])} to {format_bytes(params['memoryLimitBytes'])}"
    )


def _outcome(name: str, params: Mapping[str, Any], before: Mapping[str, Any], after: Mapping[str, Any]) -> str:
    def shown(state: Mapping[str, Any]) -> str:
        size = state.get("memoryLimitBytes")
        return format_bytes(int(size)) if isinstance(size, int) else "?"

    return (
        f"{name}'s container {params.get('container', '?')} memory limit moved from {shown(before)} to {shown(after)}"
    )


def _undo(name: str, params: Mapping[str, Any], before: Mapping[str, Any], after: Mapping[str, Any]) -> Reversal:
    """Left raised: a lower limit is the one the pods were killed at; a person lowers it
    (targets refuse to lower one anyway: this kind only raises)."""
    limit = format_bytes(int(params["memoryLimitBytes"]))
    return Reversal(None, f"the memory limit of {name}'s {params['container']} stays at {limit}: a person may lower it")


def _check(params: Mapping[str, Any]) -> list[str]:
    found = [] if str(params["container"]).strip() else ["container must name the container"]
    if params["fromMemoryLimitBytes"] < 1 or params["memoryLimitBytes"] < 1:
        found.append("a memory limit is at least 1 byte")
    return found


SPEC = ActionSpec(
    kind="RaiseMemoryLimit",
    action="raise-memory",
    usage=(
        "raise-memory (container, fromMemoryLimitBytes: its current limit; memoryLimitBytes: the new one, at most 2x)"
    ),
    params=(
        Param("container", ParamType.TEXT, "raise-memory: the container of the service's pods"),
        Param("fromMemoryLimitBytes", ParamType.LONG, "raise-memory: its limit when planned", in_key=False),
        Param("memoryLimitBytes", ParamType.LONG, "raise-memory: the new limit in bytes"),
    ),
    describe=_describe,
    outcome=_outcome,
    undo=_undo,
    check=_check,
    reasoners_plan=False,  # the evidence does not read it yet
)
