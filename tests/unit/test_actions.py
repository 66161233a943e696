"""The one definition of each command kind agrees with its contract and its Cedar action,
and everything that derives from it says the same."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flotilla import actions, commands
from flotilla.actions import ParamType
from flotilla.actions.quantity import format_bytes, parse_bytes
from services.policy.commands import command_kind, describe

ROOT = Path(__file__).resolve().parents[2]
AVRO_TYPES = {
    ParamType.INT: "int",
    ParamType.LONG: "long",
    ParamType.BOOL: "boolean",
    ParamType.TEXT: "string",
    ParamType.TEXTS: {"type": "array", "items": "string"},
}


def _schema(kind: str) -> dict[str, Any]:
    value: dict[str, Any] = json.loads((ROOT / "schemas" / "commands" / f"{kind}.avsc").read_text())
    return value


def _cedar_context(kind: str) -> dict[str, str]:
    """The context names and types of ``action <kind>`` in the Cedar schema."""
    text = (ROOT / "infra" / "policies" / "flotilla.cedarschema").read_text()
    found = re.search(rf"action {kind} in \[Remediate\] appliesTo \{{.*?context: \{{(.*?)\n  \}},", text, re.S)
    assert found, f"no Cedar action {kind}"
    body = re.sub(r"//[^\n]*", "", found.group(1))
    return {m.group(1): m.group(2) for m in re.finditer(r"(\w+)\??:\s*([\w<>]+)", body)}


@pytest.mark.parametrize("spec", actions.SPECS, ids=lambda s: s.kind)
def test_every_kind_has_a_record_with_exactly_its_fields(spec: actions.ActionSpec) -> None:
    schema = _schema(spec.kind)
    own = {f["name"]: f for f in schema["fields"]} | {}
    for name in commands.COMMON_FIELDS | {"authorization"}:
        own.pop(name)
    assert list(own) == list(spec.fields)
    for param in spec.params:
        field = own[param.name]
        wanted = AVRO_TYPES[param.type]
        assert field["type"] == (["null", wanted] if param.nullable else wanted), param.name
        assert ("default" in field) == param.has_default, param.name


@pytest.mark.parametrize("spec", actions.SPECS, ids=lambda s: s.kind)
def test_every_kind_is_a_step_of_a_proposal_and_a_cedar_action(spec: actions.ActionSpec) -> None:
    proposed = json.loads((ROOT / "schemas" / "incidents" / "RecoveryProposed.avsc").read_text())
    steps = next(f for f in proposed["fields"] if f["name"] == "steps")
    assert spec.record_type in steps["type"]["items"]
    context = _cedar_context(spec.kind)
    wanted = {p.name: p.type.cedar_type for p in spec.params} | dict(spec.cedar_extra)
    wanted |= {"humanApproved": "Bool", "plan": "Plan", "secondsToExpiry": "Long"}
    assert context == wanted


def test_the_union_and_the_kinds_are_the_same_set() -> None:
    proposed = json.loads((ROOT / "schemas" / "incidents" / "RecoveryProposed.avsc").read_text())
    steps = next(f for f in proposed["fields"] if f["name"] == "steps")
    assert steps["type"]["items"] == [spec.record_type for spec in actions.SPECS]
    on_disk = {p.stem for p in (ROOT / "schemas" / "commands").glob("*.avsc")}
    assert on_disk == {spec.kind for spec in actions.SPECS}
    assert [a.value for a in actions.Action] == [spec.action for spec in actions.SPECS]


def _step(spec: actions.ActionSpec, **params: Any) -> dict[str, Any]:
    return {
        "commandId": "c",
        "idempotencyKey": "k",
        "incidentId": "incident-1",
        "proposalId": "p",
        "target": {"kind": "service", "environment": "production", "name": "checkout-api"},
        "issuedAt": 0,
        "expiresAt": 1,
        **params,
    }


def test_a_step_is_read_as_its_kind_with_or_without_the_defaulted_fields() -> None:
    rollback = actions.by_action("rollback")
    old = _step(rollback, toRevision="3")
    new = _step(rollback, **rollback.params_of({"toRevision": "3"}))
    assert command_kind(old) == command_kind(new) == "RollbackDeployment"
    assert command_kind(_step(rollback, paused=True)) == "PauseRollout"
    with pytest.raises(ValueError, match="match no single command kind"):
        command_kind(_step(rollback, toRevision="3", paused=True))


def test_a_rollback_shows_the_person_both_revisions_and_their_images() -> None:
    step = _step(
        actions.by_action("rollback"),
        toRevision="2",
        fromRevision="3",
        fromImages=["shop=shop:1.5"],
        toImages=["shop=shop:1.4"],
    )
    assert describe(step) == (
        "roll checkout-api in production back from revision 3 (shop=shop:1.5) to revision 2 (shop=shop:1.4)"
    )


def test_each_kind_undoes_itself_from_the_recorded_state() -> None:
    rollback = actions.by_action("rollback")
    before = {"revision": "3", "templateHash": "aaa", "images": ["shop=shop:1.5"]}
    after = {"revision": "4", "templateHash": "bbb", "images": ["shop=shop:1.4"]}
    reversal = rollback.undo("checkout-api", {"toRevision": "2"}, before, after)
    assert reversal.params == {
        "toRevision": "3",
        "fromRevision": "4",
        "fromTemplateHash": "bbb",
        "toTemplateHash": "aaa",
        "fromImages": ["shop=shop:1.4"],
        "toImages": ["shop=shop:1.5"],
    }
    # what would be harmful to undo because a later step failed is left for a person
    ceiling = actions.by_action("raise-ceiling")
    params = {"autoscalerKind": "HorizontalPodAutoscaler", "autoscaler": "web", "fromMaxReplicas": 5, "maxReplicas": 8}
    left = ceiling.undo("web", params, {"maxReplicas": 5}, {"maxReplicas": 8})
    assert left.params is None and "stays at 8" in left.text
    memory = {"container": "app", "fromMemoryLimitBytes": 1 << 28, "memoryLimitBytes": 1 << 29}
    assert actions.by_action("raise-memory").undo("web", memory, {}, {}).params is None
    pause = actions.by_action("pause")
    assert pause.undo("web", {"paused": True}, {"paused": False}, {}).params is None  # never resumes a bad rollout
    assert pause.undo("web", {"paused": False}, {"paused": True}, {}).params == {"paused": True}
    with pytest.raises(actions.CannotUndo):
        pause.undo("web", {"paused": False}, {}, {})
    assert actions.by_action("restart").undo("web", {"rolling": True}, {}, {}).params is None


def test_params_are_checked_by_type_and_by_the_kinds_own_bounds() -> None:
    memory = actions.by_action("raise-memory")
    assert memory.problems({"container": "app", "fromMemoryLimitBytes": 1 << 28, "memoryLimitBytes": 1 << 29}) == []
    assert memory.problems({"container": "app", "fromMemoryLimitBytes": "256Mi", "memoryLimitBytes": 1}) == [
        "fromMemoryLimitBytes must be long, got str"
    ]
    assert actions.by_action("scale").problems({"replicas": True}) == ["replicas must be int, got bool"]
    assert actions.by_action("scale").problems({"replicas": 3, "extra": 1}) == ["extra is not a parameter of scale"]
    assert actions.by_action("rollback").problems({"toRevision": "3", "fromRevision": "3"}) == [
        "a rollback from revision 3 to itself changes nothing"
    ]
    with pytest.raises(actions.UnknownAction, match="known: scale"):
        actions.by_action("drain")


def test_the_key_of_a_step_names_its_kind_and_its_key_fields_only() -> None:
    rollback = actions.by_action("rollback")
    step = _step(rollback, **rollback.params_of({"toRevision": "2", "fromRevision": "3"}))
    assert commands.idempotency_key("RollbackDeployment", step) == "incident-1:p:rollback:checkout-api:2"
    assert commands.idempotency_key("PauseRollout", _step(rollback, paused=False)).endswith(
        ":pause:checkout-api:not-paused"
    )


@given(st.integers(min_value=0, max_value=1 << 50))
def test_a_memory_quantity_is_exact(size: int) -> None:
    assert parse_bytes(format_bytes(size)) == size


def test_the_cedar_schema_declares_every_kind_as_its_spec_says() -> None:
    """The generated part of flotilla.cedarschema is current (``make records`` rewrites it)."""
    from flotilla_ops.gencedar import render

    current = (ROOT / "infra" / "policies" / "flotilla.cedarschema").read_text()
    assert render(current) == current


def test_a_step_stored_before_a_kind_gained_fields_is_issued_with_their_defaults() -> None:
    """The executor decodes the issued command with Avro's defaults, and the authorization
    signs the decoded form: the policy issues the same."""
    from services.policy.commands import command_record

    stored = _step(actions.by_action("rollback"), toRevision="v40")
    issued = command_record(stored)
    assert issued["fromRevision"] is None and issued["toImages"] == [] and issued["toRevision"] == "v40"
    assert command_record(_step(actions.by_action("scale"), replicas=3))["replicas"] == 3
