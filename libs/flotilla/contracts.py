"""The Avro contracts in ``schemas/`` and their subjects in the registry.

``schemas/<topic>/<RecordName>.avsc`` holds the record types that may appear on a topic.
Several record types share a topic, so subjects follow the topic-record name strategy:
``<topic>-<record full name>``. Services never auto-register; ``register_all`` is run by
operators (``make schemas``) and by the test session, and the registry's compatibility
rule decides whether a change is allowed.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError


def schemas_dir() -> Path:
    """``$FLOTILLA_SCHEMAS_DIR``, else the repository's ``schemas/``."""
    explicit = os.environ.get("FLOTILLA_SCHEMAS_DIR")
    return Path(explicit) if explicit else Path(__file__).resolve().parents[2] / "schemas"


@dataclass(frozen=True)
class Contract:
    """One record type on one topic."""

    topic: str
    schema: dict[str, object]

    @property
    def full_name(self) -> str:
        ns = self.schema.get("namespace")
        return f"{ns}.{self.schema['name']}" if ns else str(self.schema["name"])

    @property
    def subject(self) -> str:
        return subject_for(self.topic, self.full_name)

    @property
    def schema_str(self) -> str:
        return json.dumps(self.schema, separators=(",", ":"), sort_keys=True)


def subject_for(topic: str, record_full_name: str) -> str:
    """The topic-record subject name; the one strategy every Flotilla client uses."""
    return f"{topic}-{record_full_name}"


def load_contracts(root: Path | None = None) -> list[Contract]:
    """Every ``schemas/<topic>/*.avsc``, sorted for reproducible registration order."""
    base = root or schemas_dir()
    contracts = []
    for path in sorted(base.glob("*/*.avsc")):
        try:
            schema = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON: {exc}") from exc
        contracts.append(Contract(topic=path.parent.name, schema=schema))
    return contracts


class IncompatibleSchemaError(RuntimeError):
    """The registry refused a schema change under its compatibility rule."""


def register(client: SchemaRegistryClient, contract: Contract) -> int:
    """Register one contract (idempotent: an identical schema keeps its id)."""
    try:
        return int(client.register_schema(contract.subject, Schema(contract.schema_str, "AVRO")))
    except SchemaRegistryError as exc:
        if exc.http_status_code == 409:
            raise IncompatibleSchemaError(
                f"{contract.subject}: the registry refused this schema as incompatible with the "
                f"registered versions under its compatibility rule: {exc.error_message}"
            ) from exc
        raise


def register_all(client: SchemaRegistryClient, root: Path | None = None) -> dict[str, int]:
    """Register every contract; returns subject → schema id."""
    return {c.subject: register(client, c) for c in load_contracts(root)}


def main() -> None:
    """``python -m flotilla.contracts``: register every contract, print subject → id."""
    from flotilla.serde import registry_client
    from flotilla.settings import load_settings

    settings = load_settings()
    client = registry_client(settings.schema_registry_url)
    try:
        ids = register_all(client)
    except IncompatibleSchemaError as exc:
        raise SystemExit(f"error: {exc}") from None
    for subject, schema_id in ids.items():
        print(f"{subject} -> id {schema_id}")


if __name__ == "__main__":
    main()
