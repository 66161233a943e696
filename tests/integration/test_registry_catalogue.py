"""The whole contract catalogue in the real registry.

Every contract is registered under its topic-record subject, self-contained; for every
subject the registry's BACKWARD rule refuses a change old records could not be read
with and accepts one they can; registering is idempotent. The sweep only *asks* the
registry (``test_compatibility``), so the real subjects gain no versions; the one real
refusal is provoked on a throwaway subject that is deleted afterwards.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from fastavro import parse_schema

from flotilla.contracts import (
    Contract,
    IncompatibleSchemaError,
    check_compatible,
    load_contracts,
    register,
    register_all,
)
from flotilla.serde import AvroSerde

from ..unit.test_catalogue import comparable, sample_value

REPO_ROOT = Path(__file__).resolve().parents[2]
CONTRACTS = load_contracts()

pytestmark = pytest.mark.timeout(180)

by_contract = pytest.mark.parametrize("contract", CONTRACTS, ids=lambda c: c.subject)


def _with_field(contract: Contract, field: dict[str, Any], topic: str | None = None) -> Contract:
    fields = [*contract.schema["fields"], field]  # type: ignore[misc]
    return Contract(topic or contract.topic, {**contract.schema, "fields": fields})


def _retyped_first_field(contract: Contract) -> Contract:
    first, *rest = contract.schema["fields"]  # type: ignore[misc]
    return Contract(contract.topic, {**contract.schema, "fields": [{**first, "type": "boolean"}, *rest]})


REQUIRED = {"name": "probeRequired", "type": "int", "doc": "A field old records have no value for."}
OPTIONAL = {"name": "probeOptional", "type": ["null", "string"], "default": None, "doc": "Absent in old records."}


def _without_docs(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: _without_docs(v) for k, v in schema.items() if k != "doc"}
    if isinstance(schema, list):
        return [_without_docs(v) for v in schema]
    return schema


def _avro(contract: Contract) -> Schema:
    return Schema(contract.schema_str, "AVRO")


def test_every_contract_is_registered_under_topic_record_subject_as_written(registry: SchemaRegistryClient) -> None:
    subjects = set(registry.get_subjects())
    missing = [c.subject for c in CONTRACTS if c.subject not in subjects]
    assert not missing, f"not registered: {missing}"
    for contract in CONTRACTS:
        assert contract.subject == f"{contract.topic}-{contract.full_name}"
        text = registry.get_latest_version(contract.subject).schema.schema_str or "{}"
        # The registry keeps its own normal form (shorter names, no redundant
        # namespaces); parsed, it is the schema we registered, and it stands on its own:
        # a consumer needs nothing but this text. Docs are left out of the comparison:
        # Apicurio matches a registration by content without docs, so a doc-only edit
        # to a registered contract keeps the registered text and id (no new version).
        registered = parse_schema(json.loads(text))
        assert _without_docs(registered) == _without_docs(parse_schema(contract.schema)), contract.subject


@by_contract
def test_a_sample_of_every_contract_round_trips_through_the_registered_schema(
    serde: AvroSerde, contract: Contract
) -> None:
    # The producers' path: strict validation and encoding against the schema as the
    # registry keeps it, then decoding by the schema id in the frame.
    value = sample_value(contract)
    decoded = serde.deserialize(serde.serialize(contract.topic, contract.full_name, value))
    assert decoded.record_name == contract.full_name
    assert decoded.schema_id == serde.client.get_latest_version(contract.subject).schema_id
    assert comparable(decoded.value) == value


@by_contract
def test_registry_refuses_backward_incompatible_changes_and_accepts_compatible_ones(
    registry: SchemaRegistryClient, contract: Contract
) -> None:
    versions = registry.get_versions(contract.subject)

    required = _with_field(contract, REQUIRED)
    assert registry.test_compatibility(contract.subject, _avro(required)) is False
    with pytest.raises(IncompatibleSchemaError) as refused:
        check_compatible(registry, required)
    assert str(refused.value).startswith(f"{contract.subject}: the registry's compatibility rule refuses")
    # exactly the one change: the registry's rewritten text is not mistaken for changes
    assert str(refused.value).endswith(
        ": it adds field 'probeRequired' without a default: records written earlier have no value for it"
    )

    retyped = _retyped_first_field(contract)
    assert registry.test_compatibility(contract.subject, _avro(retyped)) is False
    first = contract.schema["fields"][0]["name"]  # type: ignore[index]
    with pytest.raises(IncompatibleSchemaError) as retyped_refused:
        check_compatible(registry, retyped)
    assert str(retyped_refused.value).endswith(f": it changes the type of field '{first}'")

    optional = _with_field(contract, OPTIONAL)
    assert registry.test_compatibility(contract.subject, _avro(optional)) is True
    check_compatible(registry, optional)
    check_compatible(registry, contract)  # and the catalogue as it stands

    assert registry.get_versions(contract.subject) == versions, "a compatibility check registered something"


@pytest.fixture()
def throwaway_topic(registry: SchemaRegistryClient) -> Iterator[str]:
    """A topic name whose subjects are deleted again after the test."""
    topic = f"it-catalogue-{uuid.uuid4().hex[:8]}"
    yield topic
    for subject in registry.get_subjects():
        if subject.startswith(f"{topic}-"):
            registry.delete_subject(subject)
            registry.delete_subject(subject, permanent=True)


def test_registering_an_incompatible_change_is_refused_naming_the_subject(
    registry: SchemaRegistryClient, throwaway_topic: str
) -> None:
    # The largest contract: a plan of commands with the shared types inlined.
    (proposal,) = [c for c in CONTRACTS if c.full_name == "dev.flotilla.decisions.RecoveryProposed"]
    original = Contract(throwaway_topic, proposal.schema)
    first_id = register(registry, original)

    breaking = _with_field(original, REQUIRED)
    with pytest.raises(IncompatibleSchemaError, match=rf"^{re.escape(original.subject)}: .*incompatible"):
        register(registry, breaking)
    assert registry.get_versions(original.subject) == [1]

    assert register(registry, _with_field(original, OPTIONAL)) != first_id
    assert registry.get_versions(original.subject) == [1, 2]


def test_register_all_is_idempotent(registry: SchemaRegistryClient) -> None:
    versions = {c.subject: registry.get_versions(c.subject) for c in CONTRACTS}
    first = register_all(registry)
    second = register_all(registry)
    assert first == second
    assert set(first) == {c.subject for c in CONTRACTS}
    for subject, schema_id in first.items():
        assert registry.get_latest_version(subject).schema_id == schema_id
    assert {c.subject: registry.get_versions(c.subject) for c in CONTRACTS} == versions


def test_the_cli_registers_and_checks_the_catalogue(registry: SchemaRegistryClient) -> None:
    """What ``make schemas`` runs, and its ``--check`` gate."""
    command = [sys.executable, "-m", "flotilla.schemas"]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    printed = dict(line.split(" -> id ") for line in done.stdout.splitlines())
    assert {s: int(i) for s, i in printed.items()} == register_all(registry)

    checked = subprocess.run([*command, "--check"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout == "every contract is compatible with the registry\n"
