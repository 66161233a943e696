"""The contract catalogue in schemas/: complete, documented, and kinds kept apart.

Facts, agent decisions and commands are distinct kinds of record (design brief,
principle 1), told apart by namespace. These tests read the contracts as the registry
sees them (shared types inlined by ``load_contracts``) and check what every producer
and consumer relies on: ids, timestamps, command fields, reasoning on decisions, a doc
on every record and field, and that a value of every record survives an Avro round trip.
"""

from __future__ import annotations

import io
import json
import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_reader, schemaless_writer

from flotilla.contracts import Contract, load_contracts
from flotilla.digest import command_digest
from flotilla.validation import RecordValidator

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
CONTRACTS = load_contracts(SCHEMAS)
BY_NAME = {c.full_name: c for c in CONTRACTS}

FACTS = "dev.flotilla.incidents"
DECISIONS = "dev.flotilla.decisions"
COMMANDS = "dev.flotilla.commands"
AUDIT = "dev.flotilla.audit"  # the audit's own anchors, on a topic of their own
TOPIC_OF_KIND = {FACTS: "incidents", DECISIONS: "incidents", COMMANDS: "commands", AUDIT: "audit.anchors"}

CATALOGUE = {
    FACTS: [
        "ServiceLatencyIncreased",
        "ServiceDegraded",
        "AlertObserved",
        "DiagnosisRequested",
        "DiagnosticJobStarted",
        "HumanApprovalRequired",
        "RecoveryApproved",
        "RecoveryRejected",
        "ApprovalExpired",
        "CommandDenied",
        "RecoveryExecuted",
        "CommandFailed",
        "CommandRejected",
        "RecoveryCompleted",
        "RecoveryFailed",
        "CompensationCompleted",
        "IncidentEscalated",
        "LoopTerminated",
        "BudgetExceeded",
        "DeadLetterQuarantined",
    ],
    DECISIONS: ["DependencyFailureSuspected", "DiagnosisConcluded", "RecoveryProposed"],
    COMMANDS: [
        "ScaleService",
        "RestartService",
        "RollbackDeployment",
        "FailoverDependency",
        "PauseRollout",
        "RaiseAutoscalerCeiling",
        "RaiseMemoryLimit",
    ],
    AUDIT: ["ChainAnchored"],
}
SHARED_TYPES = [
    "dev.flotilla.decisions.Reasoning",
    "dev.flotilla.decisions.Evidence",
    "dev.flotilla.decisions.TokenUsage",
    "dev.flotilla.commands.ResourceRef",
    "dev.flotilla.commands.Authorization",
    "dev.flotilla.decisions.Attestation",
    "dev.flotilla.incidents.AlertRef",
]
COMMAND_NAMES = [f"{COMMANDS}.{n}" for n in CATALOGUE[COMMANDS]]

UUID: dict[str, Any] = {"type": "string", "logicalType": "uuid"}
TIMESTAMP: dict[str, Any] = {"type": "long", "logicalType": "timestamp-millis"}


def _of_kind(namespace: str) -> list[Contract]:
    return [c for c in CONTRACTS if c.schema["namespace"] == namespace]


def _ids(contracts: list[Contract]) -> list[str]:
    return [str(c.schema["name"]) for c in contracts]


def _fields(schema: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["name"]: f for f in schema["fields"]}


def _full(schema: dict[str, Any], namespace: str | None) -> str:
    name = str(schema["name"])
    ns = schema.get("namespace", namespace)
    return name if "." in name or not ns else f"{ns}.{name}"


def _definitions(schema: Any, namespace: str | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every named type defined (not merely referred to) in a schema: (full name, definition)."""
    if isinstance(schema, list):
        for branch in schema:
            yield from _definitions(branch, namespace)
    elif isinstance(schema, dict):
        kind = schema.get("type")
        if kind in ("record", "enum", "fixed"):
            full = _full(schema, namespace)
            yield full, schema
            for field in schema.get("fields", []):
                yield from _definitions(field["type"], full.rpartition(".")[0])
        elif kind == "array":
            yield from _definitions(schema["items"], namespace)
        elif kind == "map":
            yield from _definitions(schema["values"], namespace)


def _records(schema: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    return ((n, d) for n, d in _definitions(schema) if d["type"] == "record")


def _non_null(avro_type: Any) -> Any:
    """The type itself, or the other branch of a ``["null", T]`` union."""
    if isinstance(avro_type, list) and len(avro_type) == 2 and avro_type[0] == "null":
        return avro_type[1]
    return avro_type


def _is_uuid(avro_type: Any) -> bool:
    return _non_null(avro_type) == UUID


def _is_timestamp(avro_type: Any) -> bool:
    return _non_null(avro_type) == TIMESTAMP


by_contract = pytest.mark.parametrize("contract", CONTRACTS, ids=lambda c: c.full_name)


# ------------------------------------------------------------------ the catalogue


def test_every_required_record_is_in_the_catalogue_and_nothing_else() -> None:
    expected = {f"{ns}.{name}" for ns, names in CATALOGUE.items() for name in names}
    assert set(BY_NAME) == expected
    assert len(CONTRACTS) == len(expected), "each record type is one contract"


@by_contract
def test_kinds_are_kept_apart_by_namespace_and_topic(contract: Contract) -> None:
    namespace = str(contract.schema["namespace"])
    assert namespace in TOPIC_OF_KIND, f"{contract.full_name}: namespace is not one of the kinds"
    assert contract.topic == TOPIC_OF_KIND[namespace]
    assert (SCHEMAS / contract.topic / f"{contract.schema['name']}.avsc").is_file()
    assert contract.subject == f"{TOPIC_OF_KIND[namespace]}-{contract.full_name}"


def test_each_kind_is_where_the_design_puts_it() -> None:
    assert sorted(_ids(_of_kind(FACTS))) == sorted(CATALOGUE[FACTS])
    assert sorted(_ids(_of_kind(DECISIONS))) == sorted(CATALOGUE[DECISIONS])
    assert sorted(_ids(_of_kind(COMMANDS))) == sorted(CATALOGUE[COMMANDS])
    assert {c.topic for c in _of_kind(FACTS) + _of_kind(DECISIONS)} == {"incidents"}
    assert {c.topic for c in _of_kind(COMMANDS)} == {"commands"}


@by_contract
def test_every_contract_parses_on_its_own_once_expanded(contract: Contract) -> None:
    parsed = parse_schema(json.loads(contract.schema_str))  # the text the registry gets, nothing else
    assert parsed["name"] == contract.full_name


@by_contract
def test_every_record_and_every_field_is_documented(contract: Contract) -> None:
    for name, definition in _definitions(contract.schema):
        assert str(definition.get("doc", "")).strip(), f"{contract.full_name}: {name} has no doc"
        for field in definition.get("fields", []):
            assert str(field.get("doc", "")).strip(), f"{contract.full_name}: {name}.{field['name']} has no doc"


def test_shared_types_are_written_once_under_types() -> None:
    defined_in: dict[str, list[str]] = {}
    for path in sorted(SCHEMAS.glob("*/*.avsc")):
        for name, _ in _definitions(json.loads(path.read_text())):
            defined_in.setdefault(name, []).append(f"{path.parent.name}/{path.name}")
    twice = {name: files for name, files in defined_in.items() if len(files) > 1}
    assert not twice, f"named types defined in more than one file: {twice}"
    for name in SHARED_TYPES:
        assert defined_in[name] == [f"_types/{name}.avsc"]
    for name in COMMAND_NAMES:
        assert defined_in[name] == [f"commands/{name.rpartition('.')[2]}.avsc"]


def test_every_shared_type_file_is_named_after_its_type_and_used() -> None:
    used = {name for c in CONTRACTS for name, _ in _definitions(c.schema)}
    for path in sorted((SCHEMAS / "_types").glob("*.avsc")):
        schema = json.loads(path.read_text())
        assert path.stem == _full(schema, None)
        assert path.stem in used, f"{path.name} is referred to by no contract"


@by_contract
def test_optional_fields_are_null_first_with_a_null_default(contract: Contract) -> None:
    for name, record in _records(contract.schema):
        for field in record["fields"]:
            if isinstance(field["type"], list) and "null" in field["type"]:
                assert field["type"][0] == "null", f"{name}.{field['name']}"
                assert "default" in field and field["default"] is None, f"{name}.{field['name']}"


# ------------------------------------------------------------------ ids and timestamps


@pytest.mark.parametrize("contract", _of_kind(FACTS) + _of_kind(DECISIONS), ids=lambda c: c.full_name)
def test_facts_and_decisions_carry_event_id_incident_id_and_a_time(contract: Contract) -> None:
    fields = _fields(contract.schema)
    assert fields["eventId"]["type"] == UUID
    assert "ce_id" in fields["eventId"]["doc"]
    assert fields["incidentId"]["type"] == "string"
    assert [n for n in fields if n.endswith("At") and _is_timestamp(fields[n]["type"])], "no ...At timestamp"


@by_contract
def test_times_are_timestamp_millis(contract: Contract) -> None:
    for name, record in _records(contract.schema):
        for field in record["fields"]:
            timeish = field["name"].endswith("At") or "deadline" in field["name"].lower()
            if timeish:
                assert _is_timestamp(field["type"]), f"{name}.{field['name']} is not timestamp-millis"
            if _is_timestamp(field["type"]):
                assert timeish, f"{name}.{field['name']}: a timestamp should be named ...At or deadline"


UUID_FIELDS = {"eventId", "commandId", "proposalId", "quarantineId", "jobId"}


@by_contract
def test_identities_are_uuids(contract: Contract) -> None:
    for name, record in _records(contract.schema):
        for field in record["fields"]:
            if field["name"] in UUID_FIELDS or field["name"].endswith("EventId"):
                assert _is_uuid(field["type"]), f"{name}.{field['name']} is not a uuid"


# ------------------------------------------------------------------ commands

COMMAND_PARAMETERS = {
    "ScaleService": {"replicas": "int"},
    "RestartService": {"rolling": "boolean"},
    "RollbackDeployment": {
        "toRevision": "string",
        "fromRevision": ["null", "string"],
        "fromTemplateHash": ["null", "string"],
        "toTemplateHash": ["null", "string"],
        "fromImages": {"type": "array", "items": "string"},
        "toImages": {"type": "array", "items": "string"},
    },
    "FailoverDependency": {"dependency": "string", "toTarget": "string"},
    "PauseRollout": {"paused": "boolean"},
    "RaiseAutoscalerCeiling": {
        "autoscalerKind": "string",
        "autoscaler": "string",
        "fromMaxReplicas": "int",
        "maxReplicas": "int",
    },
    "RaiseMemoryLimit": {"container": "string", "fromMemoryLimitBytes": "long", "memoryLimitBytes": "long"},
}


@pytest.mark.parametrize("contract", _of_kind(COMMANDS), ids=lambda c: c.full_name)
def test_every_command_has_the_command_fields_and_its_parameters(contract: Contract) -> None:
    fields = _fields(contract.schema)
    assert fields["commandId"]["type"] == UUID
    assert fields["idempotencyKey"]["type"] == "string"
    assert fields["incidentId"]["type"] == "string"
    assert fields["proposalId"]["type"] == UUID
    target = fields["target"]["type"]
    assert _full(target, None) == "dev.flotilla.commands.ResourceRef"
    assert [(f["name"], f["type"]) for f in target["fields"]] == [
        ("kind", "string"),
        ("environment", "string"),
        ("name", "string"),
    ]
    assert fields["issuedAt"]["type"] == fields["expiresAt"]["type"] == TIMESTAMP
    parameters = COMMAND_PARAMETERS[str(contract.schema["name"])]
    common = {"commandId", "idempotencyKey", "incidentId", "proposalId", "target", "issuedAt", "expiresAt"}
    assert {n: f["type"] for n, f in fields.items() if n not in common | {"authorization"}} == parameters
    # the policy service's signature: optional (a proposal's steps carry none), last, defaulted
    authorization = fields["authorization"]
    assert list(fields)[-1] == "authorization" and authorization["default"] is None
    null, block = authorization["type"]
    assert null == "null" and _full(block, None) == "dev.flotilla.commands.Authorization"


# ------------------------------------------------------------------ decisions


@pytest.mark.parametrize("contract", _of_kind(DECISIONS), ids=lambda c: c.full_name)
def test_every_decision_carries_its_reasoning(contract: Contract) -> None:
    reasoning = _fields(contract.schema)["reasoning"]["type"]
    assert _full(reasoning, None) == "dev.flotilla.decisions.Reasoning"  # inlined: first occurrence
    fields = _fields(reasoning)
    assert fields["summary"]["type"] == "string"
    assert fields["confidence"]["type"] == "double"
    assert fields["reasoner"]["type"] == "string"
    assert fields["model"]["type"] == ["null", "string"]
    evidence = fields["evidence"]["type"]
    assert evidence["type"] == "array"
    assert _full(evidence["items"], DECISIONS) == "dev.flotilla.decisions.Evidence"
    assert {f["name"]: f["type"] for f in evidence["items"]["fields"]} == {
        "kind": "string",
        "source": "string",
        "description": "string",
        "observedValue": ["null", "string"],
    }
    usage = fields["tokenUsage"]["type"]
    assert _full(usage, DECISIONS) == "dev.flotilla.decisions.TokenUsage"
    assert {f["name"]: f["type"] for f in usage["fields"]} == {"promptTokens": "long", "completionTokens": "long"}


def test_a_proposal_is_a_plan_of_the_commands_with_a_digest() -> None:
    proposal = BY_NAME[f"{DECISIONS}.RecoveryProposed"].schema
    fields = _fields(proposal)
    assert fields["proposalId"]["type"] == UUID
    assert fields["proposedBy"]["type"] == "string"
    assert fields["digest"]["type"] == "string"
    assert "SHA-256" in fields["digest"]["doc"]
    steps = fields["steps"]["type"]
    assert steps["type"] == "array"
    assert [_full(step, None) for step in steps["items"]] == COMMAND_NAMES
    # The very records the commands topic carries, not look-alikes.
    for step, name in zip(steps["items"], COMMAND_NAMES, strict=True):
        command = BY_NAME[name].schema
        assert [(f["name"], f["doc"]) for f in step["fields"]] == [(f["name"], f["doc"]) for f in command["fields"]]
    assert steps["items"][0]["fields"][4]["type"]["name"] == "ResourceRef"  # inlined in the first step
    assert [s["fields"][4]["type"] for s in steps["items"][1:]] == ["dev.flotilla.commands.ResourceRef"] * (
        len(COMMAND_NAMES) - 1
    )


# ------------------------------------------------------------------ fields the design names

DESIGN_FIELDS = {
    "DiagnosisRequested": {"service", "triggerEventId", "requestedAt"},
    "DiagnosticJobStarted": {"jobId", "jobKind", "deadline", "startedAt"},
    "DependencyFailureSuspected": {"suspectedDependency", "failureMode", "reasoning", "concludedAt"},
    "DiagnosisConcluded": {"causeCategory", "summary", "reasoning", "concludedAt"},
    "RecoveryProposed": {"proposalId", "proposedBy", "steps", "digest", "reasoning", "proposedAt"},
    "HumanApprovalRequired": {"proposalId", "digest", "reasons", "policyIds", "requiredRole", "deadline"},
    "RecoveryApproved": {"proposalId", "digest", "approvedBy", "auto", "approvedAt"},
    "RecoveryRejected": {"proposalId", "digest", "rejectedBy", "reason", "rejectedAt"},
    "ApprovalExpired": {"proposalId", "digest", "deadline", "expiredAt"},
    "CommandDenied": {"proposalId", "reasons", "policyIds", "deniedAt"},
    "RecoveryExecuted": {
        "proposalId",
        "commandId",
        "idempotencyKey",
        "target",
        "fencingEpoch",
        "outcome",
        "actionDurationMs",
        "executedAt",
    },
    "CommandFailed": {"commandId", "idempotencyKey", "errorClass", "errorMessage", "retryable", "failedAt"},
    "CommandRejected": {"commandId", "commandType", "idempotencyKey", "target", "refusal", "reason", "rejectedAt"},
    "RecoveryCompleted": {"proposalId", "completedAt"},
    "RecoveryFailed": {"proposalId", "reason", "failedAt"},
    "CompensationCompleted": {"proposalId", "compensatedCommandIds", "completedAt"},
    "IncidentEscalated": {"reason", "causeEventId", "escalatedAt"},
    "LoopTerminated": {
        "droppedEventId",
        "droppedType",
        "consumer",
        "originTopic",
        "originPartition",
        "originOffset",
        "hops",
        "terminatedAt",
    },
    "BudgetExceeded": {"budget", "limit", "used", "exceededAt"},
    "DeadLetterQuarantined": {
        "quarantineId",
        "originTopic",
        "originPartition",
        "originOffset",
        "originalEventId",
        "errorClass",
        "errorMessage",
        "consumer",
        "tags",
        "quarantinedAt",
    },
}


@pytest.mark.parametrize("name", sorted(DESIGN_FIELDS))
def test_records_have_the_fields_the_design_names(name: str) -> None:
    (contract,) = [c for c in CONTRACTS if c.schema["name"] == name]
    missing = DESIGN_FIELDS[name] - set(_fields(contract.schema))
    assert not missing, f"{name} lacks {sorted(missing)}"


def test_specific_field_types() -> None:
    def field(record: str, name: str) -> Any:
        (contract,) = [c for c in CONTRACTS if c.schema["name"] == record]
        return _fields(contract.schema)[name]["type"]

    assert field("BudgetExceeded", "budget")["symbols"] == ["LLM_TOKENS", "WALL_TIME", "STEPS"]
    assert field("BudgetExceeded", "limit") == field("BudgetExceeded", "used") == "long"
    assert field("DeadLetterQuarantined", "tags") == {"type": "map", "values": "string"}
    assert field("DeadLetterQuarantined", "originalEventId") == ["null", UUID]
    assert field("DeadLetterQuarantined", "originOffset") == field("LoopTerminated", "originOffset") == "long"
    assert field("RecoveryExecuted", "fencingEpoch") == field("RecoveryExecuted", "actionDurationMs") == "long"
    assert _full(field("RecoveryExecuted", "target"), None) == "dev.flotilla.commands.ResourceRef"
    assert field("RecoveryApproved", "auto") == field("CommandFailed", "retryable") == "boolean"
    assert field("HumanApprovalRequired", "reasons") == {"type": "array", "items": "string"}
    assert field("HumanApprovalRequired", "policyIds") == {"type": "array", "items": "string"}
    assert field("LoopTerminated", "hops") == "int"
    assert field("IncidentEscalated", "causeEventId") == UUID


# ------------------------------------------------------------------ round trip

_PRIMITIVE_SAMPLES: dict[str, Any] = {
    "null": None,
    "boolean": True,
    "int": 12,
    "long": 4096,
    "float": 0.5,
    "double": 0.75,
    "bytes": b"\x00\x01",
}
_WHEN = datetime(2026, 3, 4, 5, 6, 7, 890_000, tzinfo=UTC)  # whole milliseconds: exact in timestamp-millis


class _Sampler:
    """Builds a value for a schema by filling each field from its type.

    ``rich`` takes the non-null branch of every optional field and puts items in every
    array (one per branch for an array of a union); otherwise optional fields are null
    and arrays empty. Named types are remembered as the walk defines them, so later
    references resolve like they do in a parser.
    """

    def __init__(self, rich: bool) -> None:
        self.rich = rich
        self.named: dict[str, Any] = {}

    def value(self, schema: Any, namespace: str | None, label: str) -> Any:
        if isinstance(schema, list):
            branches = [b for b in schema if b != "null"] if self.rich else schema
            return self.value(branches[0], namespace, label)
        if isinstance(schema, str):
            if schema in _PRIMITIVE_SAMPLES:
                return _PRIMITIVE_SAMPLES[schema]
            if schema == "string":
                return f"{label}-sample"
            full = schema if "." in schema else f"{namespace}.{schema}"
            return self.value(self.named[full], namespace, label)
        kind = schema["type"]
        if kind in ("record", "enum", "fixed"):
            full = _full(schema, namespace)
            self.named.setdefault(full, schema)
            inner = full.rpartition(".")[0]
            if kind == "enum":
                return schema["symbols"][-1]
            if kind == "fixed":
                return b"\x00" * schema["size"]
            return {f["name"]: self.value(f["type"], inner, f["name"]) for f in schema["fields"]}
        if kind == "array":
            if not self.rich:
                return []
            items = schema["items"]
            branches = items if isinstance(items, list) else [items]
            return [self.value(b, namespace, label) for b in branches if b != "null"]
        if kind == "map":
            return {"key": self.value(schema["values"], namespace, label)} if self.rich else {}
        logical = schema.get("logicalType")
        if logical == "uuid":
            return str(uuid.uuid4())
        if logical == "timestamp-millis":
            return _WHEN
        return self.value(kind, namespace, label)


def sample_value(contract: Contract, *, rich: bool = True) -> dict[str, Any]:
    """A valid value of ``contract``'s record, every field filled from its type."""
    value: dict[str, Any] = _Sampler(rich).value(contract.schema, None, "")
    return value


def comparable(value: Any) -> Any:
    """fastavro reads uuid strings back as UUID objects; compare them as text."""
    if isinstance(value, dict):
        return {k: comparable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [comparable(v) for v in value]
    return str(value) if isinstance(value, uuid.UUID) else value


@pytest.mark.parametrize("rich", [True, False], ids=["filled", "minimal"])
@by_contract
def test_a_sample_of_every_record_round_trips(contract: Contract, rich: bool) -> None:
    parsed = parse_schema(json.loads(contract.schema_str))
    sample = sample_value(contract, rich=rich)
    buf = io.BytesIO()
    schemaless_writer(buf, parsed, sample)
    buf.seek(0)
    back = schemaless_reader(buf, parsed, None)
    assert comparable(back) == sample
    assert buf.read() == b"", "the reader consumed exactly what the writer wrote"


# RecoveryProposed matters most here: its steps hold four commands that share one
# ResourceRef, defined once and then referred to by name, which a per-field validator
# must resolve without redefining it.
@by_contract
def test_the_strict_validator_accepts_a_sample_of_every_record(contract: Contract) -> None:
    parsed = parse_schema(json.loads(contract.schema_str))
    for rich in (True, False):
        sample = sample_value(contract, rich=rich)
        assert RecordValidator(parsed).problems(sample) == []  # what producers check before the outbox


def test_a_proposal_sample_carries_one_step_of_each_command() -> None:
    proposal = BY_NAME[f"{DECISIONS}.RecoveryProposed"]
    parsed = parse_schema(json.loads(proposal.schema_str))
    sample = sample_value(proposal)
    assert [sorted(step) for step in sample["steps"]] == [
        sorted(_fields(BY_NAME[name].schema)) for name in COMMAND_NAMES
    ]
    buf = io.BytesIO()
    schemaless_writer(buf, parsed, sample)
    buf.seek(0)
    back = schemaless_reader(buf, parsed, None, return_record_name=True)
    # Each step comes back as the command it was written as (the union branch is kept).
    assert [name for name, _ in back["steps"]] == COMMAND_NAMES


def test_the_strict_validator_names_what_is_wrong_inside_a_step() -> None:
    proposal = BY_NAME[f"{DECISIONS}.RecoveryProposed"]
    sample = sample_value(proposal)
    del sample["steps"][0]["target"]
    sample["reasoning"]["confidence"] = "high"
    problems = RecordValidator(parse_schema(json.loads(proposal.schema_str))).problems(sample)
    assert len(problems) == 2, problems
    steps, reasoning = problems
    assert steps.startswith("field 'steps'") and "target" in steps
    assert reasoning.startswith("field 'reasoning'") and "confidence" in reasoning


def test_a_decoded_proposal_yields_the_digest_it_was_written_with() -> None:
    # The policy service recomputes the digest from the record it decoded (UUID objects,
    # aware datetimes); it must match what the remediation agent computed before writing.
    proposal = BY_NAME[f"{DECISIONS}.RecoveryProposed"]
    parsed = parse_schema(json.loads(proposal.schema_str))
    sample = sample_value(proposal)
    sample["digest"] = command_digest(sample["steps"])
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", sample["digest"])
    buf = io.BytesIO()
    schemaless_writer(buf, parsed, sample)
    buf.seek(0)
    decoded = schemaless_reader(buf, parsed, None)
    assert command_digest(decoded["steps"]) == decoded["digest"]
