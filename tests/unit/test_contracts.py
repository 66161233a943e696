"""The Avro contracts in schemas/ and their registry subjects."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.schema_registry import Schema
from confluent_kafka.schema_registry.error import SchemaRegistryError
from fastavro import parse_schema

from flotilla import contracts as contracts_module
from flotilla.contracts import (
    Contract,
    IncompatibleSchemaError,
    check_all,
    check_compatible,
    load_contracts,
    register,
    register_all,
    schemas_dir,
    subject_for,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
ALL_FILES = sorted((REPO_ROOT / "schemas").glob("*/*.avsc"))
# Folders starting with "_" hold shared named types, not topics.
SCHEMA_FILES = [p for p in ALL_FILES if not p.parent.name.startswith("_")]
TYPE_FILES = [p for p in ALL_FILES if p.parent.name.startswith("_")]
NAMED = ("record", "enum", "fixed")


def _full(schema: dict[str, Any], namespace: str | None = None) -> str:
    name = str(schema["name"])
    ns = schema.get("namespace", namespace)
    return name if "." in name or not ns else f"{ns}.{name}"


def _collapse(schema: Any, shared: set[str], namespace: str | None = None, top: bool = True) -> Any:
    """Undo the inlining: every shared named type defined below the top becomes its full name."""
    if isinstance(schema, list):
        return [_collapse(s, shared, namespace, top=False) for s in schema]
    if not isinstance(schema, dict):
        return schema
    if schema.get("type") in NAMED:
        full = _full(schema, namespace)
        if not top and full in shared:
            return full
        inner = full.rpartition(".")[0] or None
        if "fields" in schema:
            return {
                **schema,
                "fields": [{**f, "type": _collapse(f["type"], shared, inner, False)} for f in schema["fields"]],
            }
        return schema
    if schema.get("type") == "array":
        return {**schema, "items": _collapse(schema["items"], shared, namespace, False)}
    if schema.get("type") == "map":
        return {**schema, "values": _collapse(schema["values"], shared, namespace, False)}
    return schema


def test_there_are_contracts() -> None:
    assert SCHEMA_FILES, "no schemas/<topic>/*.avsc found"


@pytest.mark.parametrize("path", SCHEMA_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_contract_is_a_documented_namespaced_record(path: Path) -> None:
    schema = json.loads(path.read_text())
    (contract,) = [c for c in load_contracts(REPO_ROOT / "schemas") if c.schema["name"] == schema["name"]]
    parse_schema(contract.schema)  # self-contained once expanded; raises on anything fastavro would not accept
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
    shared = {_full(json.loads(p.read_text())) for p in ALL_FILES}
    for contract, path in zip(contracts, SCHEMA_FILES, strict=True):
        schema = json.loads(path.read_text())
        assert contract.topic == path.parent.name
        # the file, with each referenced shared type inlined where it first occurs
        assert _collapse(contract.schema, shared) == schema
        assert contract.full_name == f"{schema['namespace']}.{schema['name']}"
        assert contract.subject == f"{path.parent.name}-{schema['namespace']}.{schema['name']}"


@pytest.mark.usefixtures("no_schemas_override")
def test_the_latency_contract_subject() -> None:
    subjects = {c.subject for c in load_contracts()}
    assert "incidents-dev.flotilla.incidents.ServiceLatencyIncreased" in subjects


@pytest.mark.usefixtures("no_schemas_override")
def test_a_contract_without_references_is_loaded_exactly_as_written() -> None:
    # ServiceLatencyIncreased is registered already: its schema text must not change.
    path = REPO_ROOT / "schemas" / "incidents" / "ServiceLatencyIncreased.avsc"
    (contract,) = [c for c in load_contracts() if c.schema["name"] == "ServiceLatencyIncreased"]
    assert contract.schema == json.loads(path.read_text())


@pytest.mark.usefixtures("no_schemas_override")
def test_shared_type_folders_are_not_topics() -> None:
    assert TYPE_FILES, "schemas/_types/ holds the shared named types"
    assert {c.topic for c in load_contracts()} == {p.parent.name for p in SCHEMA_FILES}
    assert not any(c.topic.startswith("_") for c in load_contracts())


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


# ------------------------------------------------------------------ references

REF = {
    "type": "record",
    "name": "Ref",
    "namespace": "dev.t.shared",
    "doc": "shared",
    "fields": [{"name": "name", "type": "string"}],
}


def _record(name: str, namespace: str, *fields: tuple[str, Any]) -> str:
    return json.dumps(
        {"type": "record", "name": name, "namespace": namespace, "fields": [{"name": n, "type": t} for n, t in fields]}
    )


def _only(root: Path, name: str) -> dict[str, Any]:
    (contract,) = [c for c in load_contracts(root) if c.schema["name"] == name]
    return contract.schema


def test_a_reference_is_inlined_at_its_first_occurrence_only(tmp_path: Path) -> None:
    _write(tmp_path, "_types/dev.t.shared.Ref.avsc", json.dumps(REF))
    _write(
        tmp_path,
        "topic/Uses.avsc",
        _record(
            "Uses",
            "dev.t.facts",
            ("first", "dev.t.shared.Ref"),
            ("second", ["null", "dev.t.shared.Ref"]),
            ("many", {"type": "array", "items": "dev.t.shared.Ref"}),
        ),
    )
    schema = _only(tmp_path, "Uses")
    first, second, many = (f["type"] for f in schema["fields"])  # type: ignore[union-attr]
    assert first == REF
    assert second == ["null", "dev.t.shared.Ref"]
    assert many == {"type": "array", "items": "dev.t.shared.Ref"}
    parsed = parse_schema(schema)  # self-contained: no named_schemas needed
    assert "dev.t.shared.Ref" in parsed["__named_schemas"]


def test_definitions_may_refer_to_other_definitions(tmp_path: Path) -> None:
    _write(tmp_path, "_types/dev.t.shared.Ref.avsc", json.dumps(REF))
    _write(tmp_path, "_types/dev.t.shared.Outer.avsc", _record("Outer", "dev.t.shared", ("ref", "dev.t.shared.Ref")))
    _write(
        tmp_path,
        "topic/Uses.avsc",
        _record("Uses", "dev.t.facts", ("outer", "dev.t.shared.Outer"), ("ref", "dev.t.shared.Ref")),
    )
    schema = _only(tmp_path, "Uses")
    outer, ref = (f["type"] for f in schema["fields"])  # type: ignore[union-attr]
    assert outer["fields"][0]["type"] == REF  # first occurrence is inside Outer
    assert ref == "dev.t.shared.Ref"
    parse_schema(schema)


def test_a_bare_name_resolves_in_the_enclosing_namespace(tmp_path: Path) -> None:
    _write(tmp_path, "_types/dev.t.shared.Ref.avsc", json.dumps(REF))
    _write(tmp_path, "topic/Uses.avsc", _record("Uses", "dev.t.shared", ("ref", "Ref"), ("again", "Ref")))
    schema = _only(tmp_path, "Uses")
    assert [f["type"] for f in schema["fields"]] == [REF, "Ref"]  # type: ignore[union-attr]
    parse_schema(schema)


def test_a_contract_may_refer_to_another_topics_contract(tmp_path: Path) -> None:
    _write(tmp_path, "commands/Scale.avsc", _record("Scale", "dev.t.commands", ("replicas", "int")))
    _write(tmp_path, "commands/Restart.avsc", _record("Restart", "dev.t.commands", ("rolling", "boolean")))
    steps = {"type": "array", "items": ["dev.t.commands.Scale", "dev.t.commands.Restart"]}
    _write(tmp_path, "incidents/Proposed.avsc", _record("Proposed", "dev.t.decisions", ("steps", steps)))
    contracts = load_contracts(tmp_path)
    assert [c.subject for c in contracts] == [
        "commands-dev.t.commands.Restart",
        "commands-dev.t.commands.Scale",
        "incidents-dev.t.decisions.Proposed",
    ]
    items = contracts[2].schema["fields"][0]["type"]["items"]  # type: ignore[index]
    assert [i["name"] for i in items] == ["Scale", "Restart"]
    assert contracts[1].schema == json.loads(_record("Scale", "dev.t.commands", ("replicas", "int")))
    parse_schema(contracts[2].schema)


def test_each_contract_gets_its_own_copy_and_files_stay_untouched(tmp_path: Path) -> None:
    _write(tmp_path, "_types/dev.t.shared.Ref.avsc", json.dumps(REF))
    _write(tmp_path, "topic/A.avsc", _record("A", "dev.t", ("ref", "dev.t.shared.Ref")))
    _write(tmp_path, "topic/B.avsc", _record("B", "dev.t", ("ref", "dev.t.shared.Ref")))
    a, b = load_contracts(tmp_path)
    assert a.schema["fields"][0]["type"] == b.schema["fields"][0]["type"] == REF  # type: ignore[index]
    a.schema["fields"][0]["type"]["doc"] = "changed"  # type: ignore[index]
    assert b.schema["fields"][0]["type"]["doc"] == "shared"  # type: ignore[index]
    assert json.loads((tmp_path / "topic" / "A.avsc").read_text())["fields"][0]["type"] == "dev.t.shared.Ref"


def test_recursive_and_mutually_recursive_types_load(tmp_path: Path) -> None:
    node = _record("Node", "dev.t.shared", ("next", ["null", "dev.t.shared.Node"]), ("leaf", "dev.t.shared.Leaf"))
    leaf = _record("Leaf", "dev.t.shared", ("back", ["null", "dev.t.shared.Node"]))
    _write(tmp_path, "_types/dev.t.shared.Node.avsc", node)
    _write(tmp_path, "_types/dev.t.shared.Leaf.avsc", leaf)
    _write(tmp_path, "topic/Tree.avsc", _record("Tree", "dev.t", ("root", "dev.t.shared.Node")))
    parse_schema(_only(tmp_path, "Tree"))


def test_an_unknown_reference_names_the_file_and_the_type(tmp_path: Path) -> None:
    bad = _write(tmp_path, "topic/Uses.avsc", _record("Uses", "dev.t", ("ref", ["null", "dev.t.shared.Missing"])))
    with pytest.raises(ValueError, match=re.escape("'dev.t.shared.Missing'")) as info:
        load_contracts(tmp_path)
    assert str(bad) in str(info.value)


def test_a_bare_unknown_reference_is_reported_by_its_full_name(tmp_path: Path) -> None:
    _write(tmp_path, "topic/Uses.avsc", _record("Uses", "dev.t", ("ref", "Missing")))
    with pytest.raises(ValueError, match=re.escape("unknown type 'dev.t.Missing' (referenced as 'Missing')")):
        load_contracts(tmp_path)


def test_a_type_defined_differently_in_two_files_is_ambiguous(tmp_path: Path) -> None:
    one = _write(tmp_path, "_types/dev.t.shared.Ref.avsc", json.dumps(REF))
    two = _write(tmp_path, "_more/dev.t.shared.Ref.avsc", json.dumps({**REF, "doc": "other"}))
    _write(tmp_path, "topic/Uses.avsc", _record("Uses", "dev.t", ("ref", "dev.t.shared.Ref")))
    with pytest.raises(ValueError, match="defined differently") as info:
        load_contracts(tmp_path)
    assert str(one) in str(info.value) and str(two) in str(info.value)


def test_a_broken_shared_type_file_is_named(tmp_path: Path) -> None:
    bad = _write(tmp_path, "_types/dev.t.Broken.avsc", "{")
    with pytest.raises(ValueError, match="not valid JSON") as info:
        load_contracts(tmp_path)
    assert str(bad) in str(info.value)


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


# ------------------------------------------------------------------ compatibility check


class _Latest:
    def __init__(self, text: str) -> None:
        self.schema = Schema(text, "AVRO")


class _Checker:
    """A registry that answers compatibility questions (and must not be asked to register)."""

    def __init__(self, verdict: bool | SchemaRegistryError, latest: dict[str, Any] | None = None) -> None:
        self.verdict = verdict
        self.latest = latest
        self.asked: list[str] = []

    def test_compatibility(self, subject: str, schema: Schema) -> bool:
        self.asked.append(subject)
        if isinstance(self.verdict, SchemaRegistryError):
            raise self.verdict
        return self.verdict

    def get_latest_version(self, subject: str) -> _Latest:
        if self.latest is None:
            raise SchemaRegistryError(404, 40401, "Subject not found")
        return _Latest(json.dumps(self.latest))

    def register_schema(self, subject: str, schema: Schema) -> int:
        raise AssertionError("a check must not register anything")


V1: dict[str, Any] = {"type": "record", "name": "R", "namespace": "n", "fields": [{"name": "a", "type": "string"}]}


def test_check_compatible_passes_a_compatible_schema() -> None:
    client = _Checker(True)
    check_compatible(client, Contract("t", V1))  # type: ignore[arg-type]
    assert client.asked == ["t-n.R"]


def test_check_compatible_explains_a_refusal_naming_subject_and_field() -> None:
    required = {
        **V1,
        "fields": [*V1["fields"], {"name": "b", "type": "int"}, {"name": "c", "type": "int", "default": 0}],
    }
    with pytest.raises(IncompatibleSchemaError) as info:
        check_compatible(_Checker(False, V1), Contract("t", required))  # type: ignore[arg-type]
    message = str(info.value)
    assert message.startswith("t-n.R: the registry's compatibility rule refuses this schema")
    assert "adds field 'b' without a default" in message
    assert "'c'" not in message


def test_check_compatible_names_a_changed_type() -> None:
    changed = {**V1, "fields": [{"name": "a", "type": "int"}]}
    with pytest.raises(IncompatibleSchemaError, match="changes the type of field 'a'"):
        check_compatible(_Checker(False, V1), Contract("t", changed))  # type: ignore[arg-type]


def test_check_compatible_still_refuses_when_it_cannot_explain() -> None:
    with pytest.raises(
        IncompatibleSchemaError, match=r"^t-n\.R: .*refuses this schema against the registered versions$"
    ):
        check_compatible(_Checker(False, None), Contract("t", V1))  # type: ignore[arg-type]


def test_check_compatible_accepts_anything_for_a_new_subject() -> None:
    check_compatible(_Checker(SchemaRegistryError(404, 40401, "Subject not found")), Contract("t", V1))  # type: ignore[arg-type]


def test_check_compatible_lets_other_registry_errors_through() -> None:
    with pytest.raises(SchemaRegistryError):
        check_compatible(_Checker(SchemaRegistryError(500, 50001, "boom")), Contract("t", V1))  # type: ignore[arg-type]


def test_check_all_lists_every_refused_subject(tmp_path: Path) -> None:
    _write(tmp_path, "alpha/A.avsc", json.dumps({"type": "record", "name": "A", "namespace": "n", "fields": []}))
    _write(tmp_path, "beta/B.avsc", json.dumps({"type": "record", "name": "B", "namespace": "n", "fields": []}))
    refused = check_all(_Checker(False), tmp_path)  # type: ignore[arg-type]
    assert [r.split(":")[0] for r in refused] == ["alpha-n.A", "beta-n.B"]
    assert check_all(_Checker(True), tmp_path) == []  # type: ignore[arg-type]


@pytest.fixture
def fake_registry(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[list[Any]]:
    """``main`` with its registry client replaced: append the client to use."""
    import flotilla.serde
    import flotilla.settings

    clients: list[Any] = []
    _write(tmp_path, "alpha/A.avsc", json.dumps({"type": "record", "name": "A", "namespace": "n", "fields": []}))
    monkeypatch.setenv("FLOTILLA_SCHEMAS_DIR", str(tmp_path))
    monkeypatch.setattr(flotilla.settings, "load_settings", lambda *a, **k: flotilla.settings.StackSettings())
    monkeypatch.setattr(flotilla.contracts, "registry_client", lambda url: clients[0])
    monkeypatch.setattr(flotilla.contracts, "registrar_client", lambda settings: clients[0])
    yield clients


def test_main_registers_and_prints_ids(fake_registry: list[Any], capsys: pytest.CaptureFixture[str]) -> None:
    fake_registry.append(_Registrar())
    contracts_module.main([])
    assert capsys.readouterr().out == "alpha-n.A -> id 101\n"
    contracts_module.main(["--quiet"])  # what make schemas (and so make demo) prints
    assert capsys.readouterr().out == "[schemas] 1 contracts registered (python -m flotilla.schemas lists them)\n"


def test_main_says_what_to_set_when_the_registry_refuses_the_write(
    fake_registry: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from flotilla.settings import StackSettings

    class _Refusing:
        def register_schema(self, subject: str, schema: Schema) -> int:
            raise SchemaRegistryError(401, 0, "User is not authenticated.")

    for name in ("FLOTILLA_SCHEMA_REGISTRY_AUTH", "FLOTILLA_SCHEMA_REGISTRY_AUTH_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(contracts_module, "load_settings", lambda: StackSettings(_env_file=None))
    fake_registry.append(_Refusing())
    with pytest.raises(SystemExit, match=r"refuses anonymous writes .*set FLOTILLA_SCHEMA_REGISTRY_AUTH"):
        contracts_module.main([])


def test_main_check_registers_nothing(fake_registry: list[Any], capsys: pytest.CaptureFixture[str]) -> None:
    fake_registry.append(_Checker(True))
    contracts_module.main(["--check"])
    assert capsys.readouterr().out == "every contract is compatible with the registry\n"
    fake_registry[0] = _Checker(False)
    with pytest.raises(SystemExit, match=re.escape("error: alpha-n.A: the registry's compatibility rule refuses")):
        contracts_module.main(["--check"])
