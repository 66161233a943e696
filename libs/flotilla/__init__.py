"""Flotilla: the shared runtime of the agent fleet.

Everything a service needs is importable from here; submodules starting with ``_`` and
names not listed in ``__all__`` are internal. One job per module:

- ``settings``: where the stack is;  ``contracts``: the Avro catalogue and its subjects
- ``serde`` + ``validation``: Confluent-framed Avro, validated at the perimeter
- ``envelope``: CloudEvents headers and caused records
- ``outbox`` + ``connectors`` + ``bootstrap``: publishing through Debezium
- ``consumer`` + ``handling`` + ``dedupe`` + ``deadletter``: the idempotent consumer loop
- ``rawloop`` + ``rawrecords``: consuming and showing records undecoded (audit, DLQ)
- ``workflow``: the incident state machine and budgets;  ``digest``: approval digests
- ``deferred``: slow calls outside the consumer's transaction;  ``tracing``: OpenTelemetry spans
- ``runner``: declaring (``ServiceSpec``) and running (``run_service``) a service;  ``fleet``: who is who
- ``metrics`` + ``service``: the operational surface
"""

from flotilla.bootstrap import bootstrap_outbox, ensure_database
from flotilla.consumer import ConsumerLoop, LoopConfig, migrate
from flotilla.contracts import Contract, IncompatibleSchemaError, load_contracts, register_all, subject_for
from flotilla.deadletter import DeadLetter, Reason, dlq_topic
from flotilla.deferred import MIGRATION as DEFERRED_WORK_MIGRATION
from flotilla.deferred import Finish, Work, Worker, defer
from flotilla.digest import command_digest
from flotilla.envelope import DEFAULT_HOPS, Envelope, child_traceparent, new_traceparent
from flotilla.escalations import ON_CALL, escalation
from flotilla.handling import BusinessRuleViolation, Handler, HandlerContext, Incoming, RecordRefused, Report
from flotilla.outbox import Outbox
from flotilla.rawloop import AfterCommit, RawLoop
from flotilla.registry import registry_client
from flotilla.runner import Periodic, ServiceContext, ServiceSpec, run_app, run_service, start
from flotilla.serde import (
    AvroSerde,
    RecordValidationError,
    RegistryUnavailableError,
    SchemaNotRegisteredError,
    SerdeError,
    UndecodableRecordError,
    UnknownSchemaIdError,
)
from flotilla.service import ServiceSettings, create_app, open_pool
from flotilla.settings import (
    KafkaTarget,
    StackSettings,
    default_env_file,
    kafka_connection,
    load_settings,
    project_path,
)
from flotilla.typedrecord import Record
from flotilla.workflow import (
    BudgetKind,
    Budgets,
    IncidentState,
    StaleTransition,
    Status,
    WorkflowStore,
    accepts,
    transition,
)

__all__ = [
    "DEFAULT_HOPS",
    "DEFERRED_WORK_MIGRATION",
    "ON_CALL",
    "AfterCommit",
    "AvroSerde",
    "BudgetKind",
    "Budgets",
    "BusinessRuleViolation",
    "ConsumerLoop",
    "Contract",
    "DeadLetter",
    "Envelope",
    "Finish",
    "Handler",
    "HandlerContext",
    "IncidentState",
    "Incoming",
    "IncompatibleSchemaError",
    "KafkaTarget",
    "LoopConfig",
    "Outbox",
    "Periodic",
    "RawLoop",
    "Reason",
    "Record",
    "RecordRefused",
    "RecordValidationError",
    "RegistryUnavailableError",
    "Report",
    "SchemaNotRegisteredError",
    "SerdeError",
    "ServiceContext",
    "ServiceSettings",
    "ServiceSpec",
    "StackSettings",
    "StaleTransition",
    "Status",
    "UndecodableRecordError",
    "UnknownSchemaIdError",
    "Work",
    "Worker",
    "WorkflowStore",
    "accepts",
    "bootstrap_outbox",
    "child_traceparent",
    "command_digest",
    "create_app",
    "default_env_file",
    "defer",
    "dlq_topic",
    "ensure_database",
    "escalation",
    "kafka_connection",
    "load_contracts",
    "load_settings",
    "migrate",
    "new_traceparent",
    "open_pool",
    "project_path",
    "register_all",
    "registry_client",
    "run_app",
    "run_service",
    "start",
    "subject_for",
    "transition",
]
