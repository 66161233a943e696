"""Flotilla: the shared runtime of the agent fleet.

A service imports the runtime from here (``from flotilla import ServiceSpec,
HandlerContext, ...``) and, for what it says to other services, from the contract
modules: ``records`` (the typed records, generated from ``schemas/``), ``commands``,
``digest``, ``authority``, ``keys``, ``deadletter`` (the DLQ's headers), ``rawrecords``,
``fleet``, ``metrics`` and ``tracing``. The other modules are the runtime's machinery;
``make lint`` (import-linter) keeps services out of them. One job per module:

- ``settings``: where the stack is, and a service's settings;  ``contracts``: the Avro catalogue
- ``serde`` + ``validation`` + ``registry``: Confluent-framed Avro, validated at the perimeter
- ``records`` + ``typedrecord``: one class per record;  ``escalations``: handing an incident to people
- ``envelope``: CloudEvents headers and caused records
- ``outbox`` + ``connectors`` + ``bootstrap``: publishing through Debezium
- ``consumer`` + ``handling`` + ``dedupe`` + ``deadletter``: the idempotent consumer loop
- ``rawloop`` + ``rawrecords``: consuming and showing records undecoded (audit, DLQ)
- ``workflow``: the incident state machine and budgets;  ``digest``: approval digests
- ``deferred`` + ``heartbeat``: slow calls outside the consumer's transaction, under a lease kept alive
- ``tracing``: OpenTelemetry spans
- ``runner``: declaring (``ServiceSpec``) and running (``run_service``, ``run_app``) a service
- ``fleet``: who is who;  ``metrics`` + ``http``: the operational surface
- ``provision``: ``python -m flotilla.provision``, a stack made ready for a fleet in one run
"""

from flotilla.bootstrap import bootstrap_outbox, ensure_database
from flotilla.consumer import ConsumerLoop, LoopConfig, migrate
from flotilla.contracts import Contract, IncompatibleSchemaError, load_contracts, register_all, subject_for
from flotilla.deadletter import DeadLetter, Reason, dlq_topic
from flotilla.deferred import MIGRATION as DEFERRED_WORK_MIGRATION
from flotilla.deferred import Finish, Work, Worker, defer
from flotilla.digest import command_digest
from flotilla.envelope import DEFAULT_HOPS, Envelope, child_traceparent, new_traceparent
from flotilla.escalations import escalation
from flotilla.handling import BusinessRuleViolation, Handler, HandlerContext, Incoming, RecordRefused, Report
from flotilla.heartbeat import Heartbeat
from flotilla.http import allow_body, create_app, limit_bodies
from flotilla.outbox import Outbox, RecordTooLargeError
from flotilla.rawloop import AfterCommit, RawLoop
from flotilla.registry import registry_client
from flotilla.runner import Periodic, ServiceContext, ServiceSpec, fact_provenance, run_app, run_service, start
from flotilla.serde import (
    AvroSerde,
    RecordValidationError,
    RegistryUnavailableError,
    SchemaNotRegisteredError,
    SerdeError,
    UndecodableRecordError,
    UnknownSchemaIdError,
)
from flotilla.settings import (
    KafkaTarget,
    ServiceSettings,
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
    accepting,
    accepts,
    transition,
)

__all__ = [
    "DEFAULT_HOPS",
    "DEFERRED_WORK_MIGRATION",
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
    "Heartbeat",
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
    "RecordTooLargeError",
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
    "accepting",
    "accepts",
    "allow_body",
    "bootstrap_outbox",
    "child_traceparent",
    "command_digest",
    "create_app",
    "default_env_file",
    "defer",
    "dlq_topic",
    "ensure_database",
    "escalation",
    "fact_provenance",
    "kafka_connection",
    "limit_bodies",
    "load_contracts",
    "load_settings",
    "migrate",
    "new_traceparent",
    "project_path",
    "register_all",
    "registry_client",
    "run_app",
    "run_service",
    "start",
    "subject_for",
    "transition",
]
