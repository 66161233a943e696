"""What every command kind declares once: its parameters, its texts, its undo, its policy facts.

An :class:`ActionSpec` is the one definition of a kind of change (scale, roll back, ...).
The planner, the policy's Cedar context, the executor's dispatch and compensation, the
console and the CLI derive what they need from it, so adding an action is one module in
this package plus its contract (an ``.avsc``, a union line) and what each target does.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ActionSpec",
    "CannotUndo",
    "Param",
    "ParamType",
    "Reversal",
    "recorded",
]


class ParamType(enum.StrEnum):
    """A parameter's type, as Avro, JSON Schema and Cedar each name it."""

    INT = "int"
    LONG = "long"
    BOOL = "boolean"
    TEXT = "string"
    TEXTS = "strings"  # an array of strings

    def accepts(self, value: Any) -> bool:
        if self in (ParamType.INT, ParamType.LONG):
            return isinstance(value, int) and not isinstance(value, bool)
        if self is ParamType.BOOL:
            return isinstance(value, bool)
        if self is ParamType.TEXT:
            return isinstance(value, str)
        return isinstance(value, list | tuple) and all(isinstance(v, str) for v in value)

    @property
    def json_type(self) -> str:
        return {"int": "integer", "long": "integer", "boolean": "boolean", "string": "string"}.get(self.value, "array")

    @property
    def cedar_type(self) -> str:
        return {"int": "Long", "long": "Long", "boolean": "Bool", "string": "String"}.get(self.value, "Set<String>")


@dataclass(frozen=True)
class Param:
    """One of a command's own fields.

    ``nullable`` fields may be absent from a record written before the field existed (Avro
    default null; a list defaults to empty). ``in_key`` fields are part of the idempotency
    key. ``planned`` fields are chosen by a reasoner; the others are facts the agent fills
    from the evidence (a revision's hash and images), so a model never has to copy them.
    """

    name: str
    type: ParamType
    doc: str
    nullable: bool = False
    in_key: bool = True
    planned: bool = True

    @property
    def default(self) -> Any:
        return [] if self.type is ParamType.TEXTS else None

    @property
    def has_default(self) -> bool:
        return self.nullable or self.type is ParamType.TEXTS


class CannotUndo(ValueError):
    """The recorded before-state does not say what to return to."""


@dataclass(frozen=True)
class Reversal:
    """How a completed step is undone: the params of a step of the same kind, or nothing."""

    params: Mapping[str, Any] | None  # None: there is nothing to undo
    text: str


def recorded(before: Mapping[str, Any], key: str) -> Any:
    """``before[key]``, or CannotUndo naming what the recorded state lacks."""
    value = before.get(key)
    if value is None:
        raise CannotUndo(f"the recorded before-state has no {key}")
    return value


def _or_default(value: Mapping[str, Any], param: Param) -> Any:
    found = value.get(param.name)
    return param.default if found is None else found


def _no_problems(params: Mapping[str, Any]) -> list[str]:
    return []


def _cedar_facts(params: Mapping[str, Any]) -> dict[str, Any]:
    """Params as Cedar context: nulls left out (Cedar has none), lists as sets."""
    return {k: list(v) if isinstance(v, list | tuple) else v for k, v in params.items() if v is not None}


@dataclass(frozen=True)
class ActionSpec:
    """One command kind, end to end.

    ``describe(where, params)`` is the line a person approves (``where`` is
    ``"<name> in <environment>"``); ``outcome(name, params, before, after)`` the line that
    reports what happened; ``undo(name, params, before, after)`` the compensation
    (CannotUndo if the recorded state cannot tell); ``check(params)`` the kind's own
    bounds beyond types, each problem a sentence; ``cedar(params)`` the facts policies see.
    """

    kind: str  # the record's name, e.g. ScaleService
    action: str  # the action at the target, e.g. scale
    usage: str  # for a reasoner: what the action does and its params, one clause
    params: tuple[Param, ...]
    describe: Callable[[str, Mapping[str, Any]], str]
    outcome: Callable[[str, Mapping[str, Any], Mapping[str, Any], Mapping[str, Any]], str]
    undo: Callable[[str, Mapping[str, Any], Mapping[str, Any], Mapping[str, Any]], Reversal]
    check: Callable[[Mapping[str, Any]], list[str]] = _no_problems
    cedar: Callable[[Mapping[str, Any]], dict[str, Any]] = _cedar_facts
    cedar_extra: Mapping[str, str] = field(default_factory=dict)  # facts the policy adds: name -> Cedar type
    # Whether a reasoner may plan it: only where the evidence it reads has the facts its
    # params need (an autoscaler's ceiling, a container's limit are not read yet), so a
    # model is never asked to invent them. People and tools may still propose it.
    reasoners_plan: bool = True

    @property
    def record_type(self) -> str:
        return f"dev.flotilla.commands.{self.kind}"

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    @property
    def required(self) -> frozenset[str]:
        return frozenset(p.name for p in self.params if not p.has_default)

    @property
    def key_fields(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params if p.in_key)

    def param(self, name: str) -> Param:
        return next(p for p in self.params if p.name == name)

    def params_of(self, value: Mapping[str, Any]) -> dict[str, Any]:
        """The kind's own fields of a record or step, defaults filled for those absent."""
        return {p.name: _or_default(value, p) if p.has_default else value[p.name] for p in self.params}

    def problems(self, params: Mapping[str, Any]) -> list[str]:
        """Every way ``params`` is not a valid set of this kind's fields, each a sentence."""
        found = [f"{name} is not a parameter of {self.action}" for name in sorted(set(params) - set(self.fields))]
        for p in self.params:
            if p.name not in params:
                if not p.has_default:
                    found.append(f"{p.name} is required for {self.action}")
                continue
            value = params[p.name]
            if value is None and p.nullable:
                continue
            if not p.type.accepts(value):
                found.append(f"{p.name} must be {p.type.value}, got {type(value).__name__}")
        return found or self.check(params)
