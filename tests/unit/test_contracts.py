"""The Avro contracts in schemas/ and their registry subjects."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.schema_registry import Schema
from confluent_kafka.schema_registry.error import SchemaRegistryError
from fastavro import parse_schema

from flotilla.contracts import (
    Contract,
    IncompatibleSchemaError,
    load_contracts,
    register,
    register_all,
    schemas_dir,
    subject_for,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
SCHEMA_FILES = sorted((REPO_ROOT / "schemas").glob("*/*.avsc"))


def test_there_are_contracts() -> None:
    assert SCHEMA_FILES, "no schemas/<topic>/*.avsc found"


@pytest.mark.parametrize("path", SCHEMA_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_contract_is_a_documented_namespaced_record(path: Path) -> None:
    schema = json.loads(path.read_text())
    parse_schema(schema)  # raises on anything fastavro would not accept
    assert schema["type"] == "record"
    assert schema.get("namespace"), "a contract needs a namespace (subjects use the full name)"
    assert schema["name"] == path.stem, "the file is named after its record"
    assert str(schema.get("doc", "")).strip(), "the record has no doc"
    assert schema["fields"], "a record without fields"
    for field in schema["fields"]:
        assert str(field.get("doc", "")).strip(), f"field {field['name']} has no doc"


@pytest.fixture
def no_schemas_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLOTILLA_SCHEMAS_DIR", raising=False)


@pytest.mark.usefixtures("no_schemas_override")
def test_default_schemas_dir_is_the_repositorys() -> None:
    assert schemas_dir() == REPO_ROOT / "schemas"


def test_schemas_dir_honours_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FLOTILLA_SCHEMAS_DIR", str(tmp_path))
    assert schemas_dir() == tmp_path


@pytest.mark.usefixtures("no_schemas_override")
def test_load_contracts_reads_every_file_with_its_topic_and_subject() -> None:
    contracts = load_contracts()
    assert len(contracts) == len(SCHEMA_FILES)
    for contract, path in zip(contracts, SCHEMA_FILES, strict=True):
        schema = json.loads(path.read_text())
        assert contract.topic == path.parent.name
        assert contract.schema == schema
        assert contract.full_name == f"{schema['namespace']}.{schema['name']}"
        assert contract.subject == f"{path.parent.name}-{schema['namespace']}.{schema['name']}"


@pytest.mark.usefixtures("no_schemas_override")
def test_the_latency_contract_subject() -> None:
    subjects = {c.subject for c in load_contracts()}
    assert "incidents-dev.flotilla.incidents.ServiceLatencyIncreased" in subjects


def test_subject_for_is_topic_dash_full_name() -> None:
    assert subject_for("incidents", "dev.flotilla.incidents.X") == "incidents-dev.flotilla.incidents.X"
    assert subject_for("commands.dlq", "a.B") == "commands.dlq-a.B"
    assert subject_for("t", "Bare") == "t-Bare"


def test_contract_subject_and_full_name() -> None:
    contract = Contract(topic="commands", schema={"type": "record", "name": "Restart", "namespace": "dev.f.c"})
    assert contract.full_name == "dev.f.c.Restart"
    assert contract.subject == "commands-dev.f.c.Restart"
    assert contract.subject == subject_for(contract.topic, contract.full_name)
    bare = Contract(topic="commands", schema={"type": "record", "name": "Restart"})
    assert bare.full_name == "Restart"
    assert bare.subject == "commands-Restart"


def test_schema_str_is_canonical_compact_json() -> None:
    a = Contract(topic="t", schema={"name": "R", "type": "record", "fields": []})
    b = Contract(topic="t", schema={"fields": [], "type": "record", "name": "R"})
    assert a.schema_str == b.schema_str == '{"fields":[],"name":"R","type":"record"}'
    assert json.loads(a.schema_str) == a.schema


def _write(root: Path, rel: str, text: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_load_contracts_sorts_and_ignores_other_files(tmp_path: Path) -> None:
    _write(tmp_path, "zeta/B.avsc", json.dumps({"type": "record", "name": "B", "namespace": "n", "fields": []}))
    _write(tmp_path, "alpha/A.avsc", json.dumps({"type": "record", "name": "A", "namespace": "n", "fields": []}))
    _write(tmp_path, "alpha/notes.txt", "not a schema")
    _write(tmp_path, "top.avsc", "{ not even json")  # not under a topic folder
    contracts = load_contracts(tmp_path)
    assert [c.subject for c in contracts] == ["alpha-n.A", "zeta-n.B"]


def test_load_contracts_names_a_file_with_invalid_json(tmp_path: Path) -> None:
    _write(tmp_path, "alpha/A.avsc", json.dumps({"type": "record", "name": "A", "fields": []}))
    bad = _write(tmp_path, "beta/Broken.avsc", '{"type": "record", "name": ')
    with pytest.raises(ValueError, match="not valid JSON") as info:
        load_contracts(tmp_path)
    assert str(bad) in str(info.value)


def test_load_contracts_of_an_empty_dir_is_empty(tmp_path: Path) -> None:
    assert load_contracts(tmp_path) == []


# ------------------------------------------------------------------ register


class _Registrar:
    def __init__(self, error: SchemaRegistryError | None = None) -> None:
        self.registered: list[tuple[str, Any]] = []
        self.error = error

    def register_schema(self, subject: str, schema: Schema) -> int:
        if self.error is not None:
            raise self.error
        self.registered.append((subject, schema))
        return 100 + len(self.registered)


@pytest.mark.usefixtures("no_schemas_override")
def test_register_all_registers_every_contract_as_avro() -> None:
    client = _Registrar()
    ids = register_all(client)
    contracts = load_contracts()
    assert list(ids) == [c.subject for c in contracts]
    assert sorted(ids.values()) == list(range(101, 101 + len(contracts)))
    for (subject, schema), contract in zip(client.registered, contracts, strict=True):
        assert subject == contract.subject
        assert schema.schema_type == "AVRO"
        assert json.loads(schema.schema_str) == contract.schema


def test_register_turns_409_into_incompatible_schema_error() -> None:
    contract = Contract(topic="t", schema={"type": "record", "name": "R", "namespace": "n", "fields": []})
    client = _Registrar(SchemaRegistryError(409, 409, "Schema being registered is incompatible"))
    with pytest.raises(IncompatibleSchemaError, match=re.escape("t-n.R")) as info:
        register(client, contract)
    assert "incompatible" in str(info.value)


def test_register_lets_other_registry_errors_through() -> None:
    contract = Contract(topic="t", schema={"type": "record", "name": "R", "namespace": "n", "fields": []})
    client = _Registrar(SchemaRegistryError(500, 50001, "boom"))
    with pytest.raises(SchemaRegistryError) as info:
        register(client, contract)
    assert not isinstance(info.value, IncompatibleSchemaError)
