"""Avro in the Confluent wire format, validated at the perimeter.

A value on a Flotilla topic is ``0x00 | schema id (4 bytes, big-endian) | Avro binary``.
Writers serialize with *the repository's contract* for the record type (``schemas/``, the
schema the code was built against), never with whatever version the registry holds last:
the contract is looked up under ``<topic>-<record full name>`` *by its content* (the
Confluent API's "look up schema under subject", ``POST /subjects/{subject}``), and the id
the registry answers is used only if the schema it names is that contract (docs aside).
A registry that does not hold the contract fails the writer with an error naming the
subject; a newer version registered beside it is never used. Services never register.
Values are validated strictly against the contract, so a record that does not match is
refused where it is produced, with an error naming the field. Registry look-ups are cached
per subject and per schema id: the registry is consulted once per record type per
process, not per record.

Readers trust nothing in the frame. They decode with the schema the frame's id names (the
writer's schema), so records written with a newer compatible version still decode.
Whatever the bytes say — an id that names a JSON or Protobuf schema, an Avro primitive, a
schema registered under some other subject, a body that does not parse — decoding ends in
:class:`UndecodableRecordError` (the record is poison: dead-letter it and move on), never
in another exception type that would crash a consumer. The one exception is
:class:`RegistryUnavailableError`: the registry could not answer, which says nothing about
the record, so the caller waits and tries again.
"""

from __future__ import annotations

import io
import json
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError
from fastavro import parse_schema, schemaless_reader, schemaless_writer

from flotilla.contracts import Contract, load_contracts, subject_for
from flotilla.validation import RecordValidator

MAGIC_BYTE = 0
_HEADER = struct.Struct(">bI")
# Schema ids come from the bytes on a topic, i.e. from anyone who can produce there: the
# caches they key are bounded, so a stream of distinct ids cannot grow memory without end.
READER_CACHE_SIZE = 1024

K = TypeVar("K")
V = TypeVar("V")


class SerdeError(ValueError):
    """Base class: a value could not be turned into bytes or back."""


class RecordValidationError(SerdeError):
    """A value does not match its registered schema; ``problems`` name each field."""

    def __init__(self, subject: str, problems: list[str]) -> None:
        self.subject = subject
        self.problems = problems
        super().__init__(f"{subject}: record does not match its registered schema: " + "; ".join(problems))


class SchemaNotRegisteredError(SerdeError):
    """The registry does not hold the contract under the subject (services never register)."""


class UnknownContractError(SchemaNotRegisteredError):
    """No contract in ``schemas/`` defines the record type: there is nothing to write with."""


class UndecodableRecordError(SerdeError):
    """The bytes are not a Confluent-framed Avro value of a known schema."""


class UnknownSchemaIdError(UndecodableRecordError):
    """The frame names a schema id the registry does not know."""


class RegistryUnavailableError(Exception):
    """The registry did not answer (5xx, timeout, refused connection).

    Deliberately not a :class:`SerdeError`: it is not the record's fault, so the record
    must not be dead-lettered; the caller backs off and decodes it again.
    """


class _Lru(Generic[K, V]):
    """A small thread-safe LRU map (readers are shared by a service's threads)."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._items: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: K, value: V) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self._capacity:
                self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


@dataclass(frozen=True)
class _Writer:
    schema_id: int
    parsed: Any
    full_name: str
    validator: RecordValidator


@dataclass(frozen=True)
class Decoded:
    """A deserialized value and what it was written with."""

    schema_id: int
    record_name: str
    value: dict[str, Any]


class AvroSerde:
    """Serialize and deserialize through one registry client, with caches.

    ``contracts`` are the schemas writers write with, one per record full name; by default
    every contract in ``schemas/`` (``load_contracts``), read when the first writer is
    needed, so a process that only reads never needs the folder.
    """

    def __init__(
        self,
        client: SchemaRegistryClient,
        *,
        reader_cache_size: int = READER_CACHE_SIZE,
        contracts: Iterable[Contract] | None = None,
    ) -> None:
        self._client = client
        self._contracts = None if contracts is None else _by_full_name(contracts)
        self._contracts_lock = threading.Lock()
        self._writers: dict[str, _Writer] = {}  # keyed by our own subjects: bounded by the catalogue
        self._readers: _Lru[int, tuple[Any, str] | UndecodableRecordError] = _Lru(reader_cache_size)
        self._bound: _Lru[tuple[int, str], bool] = _Lru(reader_cache_size)

    @property
    def client(self) -> SchemaRegistryClient:
        return self._client

    def contract(self, record_full_name: str) -> Contract:
        """The repository's contract for a record type; UnknownContractError if there is none."""
        with self._contracts_lock:
            if self._contracts is None:
                self._contracts = _by_full_name(load_contracts())
            contracts = self._contracts
        found = contracts.get(record_full_name)
        if found is None:
            raise UnknownContractError(
                f"no contract in schemas/ defines {record_full_name}: a writer only writes the "
                "record types of the repository's catalogue"
            )
        return found

    def writer(self, topic: str, record_full_name: str) -> _Writer:
        """The contract for ``record_full_name`` and the id the registry holds it under for
        ``topic``'s subject (looked up by content, never "latest"); cached per subject."""
        subject = subject_for(topic, record_full_name)
        cached = self._writers.get(subject)
        if cached is not None:
            return cached
        contract = self.contract(record_full_name)
        schema_id = self._registered_id(subject, contract)
        parsed = parse_schema(contract.schema)
        writer = _Writer(schema_id, parsed, record_full_name, RecordValidator(cast(dict[str, Any], parsed)))
        self._writers[subject] = writer
        if self._readers.get(writer.schema_id) is None:
            self._readers.put(writer.schema_id, (writer.parsed, record_full_name))
        self._bound.put((writer.schema_id, subject), True)
        return writer

    def _registered_id(self, subject: str, contract: Contract) -> int:
        """The id of ``contract`` under ``subject``, found by content.

        First the exact text ``register`` sends (what the registry matches by default), then
        the registry's normalised comparison (``normalize=true``; Apicurio compares its
        canonical form, which leaves out docs), for a contract registered from other text.
        Whatever id comes back is checked against the contract before it is used: the
        schema it names must be the contract, docs aside, or nothing is written.
        """
        schema = Schema(contract.schema_str, "AVRO")
        found = None
        missing: SchemaRegistryError | None = None
        for normalize in (False, True):
            try:
                found = self._client.lookup_schema(subject, schema, normalize_schemas=normalize)
                break
            except SchemaRegistryError as exc:
                if exc.http_status_code != 404:
                    raise
                missing = exc
                if exc.error_code == 40401:  # no such subject: no comparison will find anything
                    break
        if found is None or found.schema_id is None:
            if missing is not None and missing.error_code == 40401:
                what = "no schema is registered under it"
            else:
                what = "none of the versions registered under it is the repository's contract"
            raise SchemaNotRegisteredError(
                f"{subject}: {what}, and writers write only with the contract in schemas/ (never with "
                "another version); register the contracts (make schemas) — services never register"
            ) from missing
        schema_id = int(found.schema_id)
        try:
            registered = self._client.get_schema(schema_id)
        except SchemaRegistryError as exc:
            if exc.http_status_code != 404:
                raise
            raise SchemaNotRegisteredError(
                f"{subject}: the registry answered schema id {schema_id} for the repository's contract, "
                "then did not know that id"
            ) from exc
        if not _same_contract(registered.schema_str, contract.schema):
            raise SchemaNotRegisteredError(
                f"{subject}: the registry answered schema id {schema_id} for the repository's contract, "
                "but that id names a different schema; refusing to write with it"
            )
        return schema_id

    def validate(self, topic: str, record_full_name: str, value: dict[str, Any]) -> _Writer:
        """Raise RecordValidationError naming every field that breaks the schema."""
        writer = self.writer(topic, record_full_name)
        problems = writer.validator.problems(value)
        if problems:
            raise RecordValidationError(subject_for(topic, record_full_name), problems)
        return writer

    def serialize(self, topic: str, record_full_name: str, value: dict[str, Any]) -> bytes:
        """Validate, then frame and encode against the registered schema."""
        writer = self.validate(topic, record_full_name, value)
        buf = io.BytesIO()
        buf.write(_HEADER.pack(MAGIC_BYTE, writer.schema_id))
        schemaless_writer(buf, writer.parsed, value)
        return buf.getvalue()

    def _ask(self, call: Callable[[], V], what: str) -> V:
        """A registry call; any failure that is not an answer about the id is 'unavailable'."""
        try:
            return call()
        except SchemaRegistryError as exc:
            status = exc.http_status_code or 0
            if status == 404:
                raise
            if 400 <= status < 500:
                # The registry answered: it will not describe this id (bad request, bad
                # reference...). That is about the record, not about the registry.
                raise UndecodableRecordError(f"the registry refused {what}: {exc}") from exc
            raise RegistryUnavailableError(f"the registry failed on {what}: {exc}") from exc
        except Exception as exc:  # transport errors, timeouts, a non-JSON answer
            raise RegistryUnavailableError(f"the registry did not answer {what}: {exc!r}") from exc

    def _reader(self, schema_id: int) -> tuple[Any, str]:
        cached = self._readers.get(schema_id)
        if isinstance(cached, UndecodableRecordError):
            raise cached
        if cached is not None:
            return cached
        try:
            schema = self._ask(lambda: self._client.get_schema(schema_id), f"schema id {schema_id}")
        except SchemaRegistryError as exc:  # only a 404 gets here
            raise UnknownSchemaIdError(f"schema id {schema_id} is not known to the registry") from exc
        try:
            reader = _record_reader(schema_id, schema.schema_type, schema.schema_str)
        except UndecodableRecordError as exc:
            # What an id names never changes: remember the verdict, ask the registry once.
            self._readers.put(schema_id, exc)
            raise
        self._readers.put(schema_id, reader)
        return reader

    def _check_subject(self, schema_id: int, topic: str, record_name: str) -> None:
        """The id must be registered under ``<topic>-<record>``: a schema of the same name
        registered under another subject never passed our compatibility rule."""
        subject = subject_for(topic, record_name)
        if self._bound.get((schema_id, subject)):
            return
        versions = self._ask(lambda: self._client.get_schema_versions(schema_id), f"subjects of schema id {schema_id}")
        if not any(getattr(v, "subject", None) == subject for v in versions):
            raise UndecodableRecordError(
                f"schema id {schema_id} ({record_name}) is not registered under subject {subject}"
            )
        self._bound.put((schema_id, subject), True)

    def deserialize(self, data: bytes | None, *, topic: str | None = None) -> Decoded:
        """Decode a framed value; raises UndecodableRecordError for anything that is not a
        record of a registered Avro record schema (bound to ``topic``'s subject when given),
        RegistryUnavailableError when the registry cannot be asked."""
        if data is None or len(data) < _HEADER.size:
            raise UndecodableRecordError("value is empty or shorter than the 5-byte Confluent frame")
        magic, schema_id = _HEADER.unpack_from(data)
        if magic != MAGIC_BYTE:
            raise UndecodableRecordError(f"unknown magic byte {magic}: not a Confluent-framed Avro value")
        parsed, full_name = self._reader(schema_id)
        if topic is not None:
            self._check_subject(schema_id, topic, full_name)
        try:
            value = schemaless_reader(io.BytesIO(data[_HEADER.size :]), parsed, None)
        except Exception as exc:  # fastavro raises several types on truncated/garbled input
            raise UndecodableRecordError(
                f"bytes do not decode with schema id {schema_id} ({full_name}): {exc.__class__.__name__}: {exc}"
            ) from exc
        if not isinstance(value, dict):
            raise UndecodableRecordError(f"schema id {schema_id} does not describe a record")
        return Decoded(schema_id=schema_id, record_name=full_name, value=value)


def _by_full_name(contracts: Iterable[Contract]) -> dict[str, Contract]:
    """Contracts by record full name; one name may not stand for two different schemas."""
    found: dict[str, Contract] = {}
    for contract in contracts:
        known = found.get(contract.full_name)
        if known is not None and known.schema_str != contract.schema_str:
            raise ValueError(
                f"{contract.full_name} is defined differently on topics {known.topic} and {contract.topic}"
            )
        found.setdefault(contract.full_name, contract)
    return found


def _without_docs(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_docs(v) for k, v in value.items() if k not in ("doc", "__named_schemas")}
    if isinstance(value, list):
        return [_without_docs(v) for v in value]
    return value


def _same_contract(registered_text: str | None, contract: dict[str, Any]) -> bool:
    """Whether the registry's text is the contract: equal once both are parsed (every name in
    full, so the registry's own rewriting of names does not matter) and docs are dropped.
    Field order, types, logical types, defaults and aliases must all be the same."""
    if not registered_text:
        return False
    try:
        registered = parse_schema(json.loads(registered_text))
    except Exception:  # not JSON, not Avro: certainly not our contract
        return False
    return bool(_without_docs(registered) == _without_docs(parse_schema(contract)))


def _record_reader(schema_id: int, schema_type: str | None, schema_str: str | None) -> tuple[Any, str]:
    """The parsed reader schema and full name of an Avro *record* schema; anything else
    (JSON Schema, Protobuf, an Avro primitive, array, enum, union, text that does not
    parse) raises UndecodableRecordError."""
    kind = (schema_type or "AVRO").upper()
    if kind != "AVRO":
        raise UndecodableRecordError(f"schema id {schema_id} is a {kind} schema, not Avro")
    if not schema_str:
        raise UndecodableRecordError(f"schema id {schema_id} has no schema text in the registry")
    try:
        schema_dict = json.loads(schema_str)
    except ValueError as exc:
        raise UndecodableRecordError(f"schema id {schema_id} is not valid Avro JSON: {exc}") from exc
    if not isinstance(schema_dict, dict) or schema_dict.get("type") not in ("record", "error"):
        shown = schema_dict.get("type") if isinstance(schema_dict, dict) else schema_dict
        raise UndecodableRecordError(f"schema id {schema_id} is not an Avro record schema (type {shown!r:.60})")
    name = schema_dict.get("name")
    namespace = schema_dict.get("namespace")
    if not isinstance(name, str) or (namespace is not None and not isinstance(namespace, str)):
        raise UndecodableRecordError(f"schema id {schema_id} names no record")
    try:
        parsed = parse_schema(schema_dict)
    except Exception as exc:  # fastavro: SchemaParseException, UnknownType, ValueError, ...
        raise UndecodableRecordError(
            f"schema id {schema_id} does not parse as Avro: {exc.__class__.__name__}: {exc}"
        ) from exc
    full = name if "." in name or not namespace else f"{namespace}.{name}"
    return parsed, full
