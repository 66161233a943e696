"""Connection settings for the stack, read from the environment.

The local stack writes them to one env file (``.stack/stack.env``); docker compose and
Kubernetes set the same ``FLOTILLA_*`` variables directly. Explicit environment
variables win over the file, so one process can point at another stack.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Self

from psycopg.conninfo import make_conninfo
from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from flotilla.bounds import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_RECORD_BYTES, KAFKA_MAX_REQUEST_BYTES
from flotilla.delivery import DEFAULT_DELIVERY, Delivery

# Where a Kafka client connects: a bare bootstrap address (local stack, tests) or the
# connection part of a librdkafka configuration (StackSettings.kafka_client()).
KafkaTarget = str | Mapping[str, Any]

# What a credential setting left unset means (FLOTILLA_PROFILE). `demo`: the public demo
# users and tokens stand in, with a warning (the local stack, compose's demo, the
# Kubernetes dev overlay). `production`, the default: the service refuses to start.
Profile = Literal["demo", "production"]


class MissingCredentials(ValueError):
    """A credential setting is unset or names nobody, and the profile is not ``demo``."""


def kafka_connection(target: KafkaTarget) -> dict[str, Any]:
    """The librdkafka settings that reach Kafka: bootstrap servers, plus security when set."""
    return {"bootstrap.servers": target} if isinstance(target, str) else dict(target)


def project_path(env_var: str, relative: str) -> Path:
    """A folder the project ships next to the code (``schemas/``, ``infra/policies/``):
    ``$<env_var>`` when set (the image sets it), else ``relative`` in the nearest folder
    at or above the working directory that holds it (a checkout). Found by where you
    run, never by where this file is installed; FileNotFoundError names the variable."""
    explicit = os.environ.get(env_var)
    if explicit:
        return Path(explicit)
    here = Path.cwd().resolve()
    for folder in (here, *here.parents):
        candidate = folder / relative
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"no {relative}/ at or above {here}; set {env_var} to where it is")


def default_env_file() -> Path:
    """``$FLOTILLA_ENV_FILE``, else the nearest ``.stack/stack.env`` at or above the cwd."""
    explicit = os.environ.get("FLOTILLA_ENV_FILE")
    if explicit:
        return Path(explicit)
    here = Path.cwd().resolve()
    for folder in (here, *here.parents):
        candidate = folder / ".stack" / "stack.env"
        if candidate.exists():
            return candidate
    return here / ".stack" / "stack.env"


class StackSettings(BaseSettings):
    """Where Kafka, the schema registry, Kafka Connect, PostgreSQL, Prometheus and Alertmanager are."""

    model_config = SettingsConfigDict(env_prefix="FLOTILLA_", extra="ignore")

    stack: str = "local"
    profile: Profile = "production"
    kafka_bootstrap: str = "127.0.0.1:19092"
    # A cluster with TLS and/or SASL (e.g. Strimzi with SCRAM): every Kafka client of the
    # fleet connects with these. The local stack and compose use PLAINTEXT.
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    kafka_sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    kafka_sasl_username: str | None = None
    kafka_sasl_password: str | None = None
    kafka_ssl_ca_location: str | None = None  # PEM file of the cluster's CA (else the system's)
    schema_registry_url: str = "http://127.0.0.1:18081/apis/ccompat/v7"
    # The registrar's credentials (user:password), for the paths that write to the registry
    # (flotilla.registry.registrar_client): the value, or a file holding it (the local stack
    # names its 0600 secret file here, never the value: its env file is world-readable).
    # Services that only serialize and deserialize read anonymously and need neither.
    schema_registry_auth: str | None = Field(None, repr=False)
    schema_registry_auth_file: Path | None = None
    connect_url: str = "http://127.0.0.1:18083"
    # How outbox rows reach their topics (flotilla.delivery.Delivery); the Connect worker's
    # exactly.once.source.support must agree (the local stack and compose derive it from this).
    outbox_delivery: Delivery = DEFAULT_DELIVERY
    # The stack's Prometheus (the estate's alerting rules) and Alertmanager (routes alerts to
    # the health agent): where tools and tests check them and query them.
    prometheus_url: str = "http://127.0.0.1:18120"
    alertmanager_url: str = "http://127.0.0.1:18121"
    pg_host: str = "127.0.0.1"
    pg_port: int = 55432
    pg_user: str = "flotilla"
    pg_password: str = "flotilla"
    pg_database: str = "flotilla"

    @field_validator("schema_registry_auth", "schema_registry_auth_file", mode="before")
    @classmethod
    def _blank_is_unset(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value

    @model_validator(mode="after")
    def _sasl_is_complete(self) -> StackSettings:
        if self.kafka_security_protocol.startswith("SASL_"):
            missing = [
                f"FLOTILLA_KAFKA_SASL_{name.upper()}"
                for name, value in (
                    ("mechanism", self.kafka_sasl_mechanism),
                    ("username", self.kafka_sasl_username),
                    ("password", self.kafka_sasl_password),
                )
                if not value
            ]
            if missing:
                raise ValueError(
                    f"FLOTILLA_KAFKA_SECURITY_PROTOCOL={self.kafka_security_protocol} needs {', '.join(missing)}"
                )
        return self

    def allow_demo_credentials(self, setting: str) -> None:
        """Return if the demo profile lets the public demo credentials stand in for ``setting``;
        else raise :class:`MissingCredentials` naming it (never the demo credentials)."""
        if self.profile != "demo":
            raise MissingCredentials(
                f"{setting} is not set: refusing to start without credentials (FLOTILLA_PROFILE={self.profile}). "
                f"Set {setting}; only FLOTILLA_PROFILE=demo falls back to the public demo credentials."
            )

    def registrar_auth(self) -> str | None:
        """The registrar's ``user:password``: FLOTILLA_SCHEMA_REGISTRY_AUTH, else the content of
        FLOTILLA_SCHEMA_REGISTRY_AUTH_FILE, else None (anonymous: reads only)."""
        if self.schema_registry_auth:
            return self.schema_registry_auth.strip()
        if self.schema_registry_auth_file:
            from flotilla.registry import read_credentials  # not at the top: registry needs no settings

            return read_credentials(self.schema_registry_auth_file)
        return None

    def kafka_client(self) -> dict[str, Any]:
        """The connection part of every Kafka client's configuration (see KafkaTarget)."""
        conf: dict[str, Any] = {"bootstrap.servers": self.kafka_bootstrap}
        if self.kafka_security_protocol != "PLAINTEXT":
            conf["security.protocol"] = self.kafka_security_protocol.lower()
        if self.kafka_security_protocol.startswith("SASL_"):
            conf["sasl.mechanism"] = self.kafka_sasl_mechanism
            conf["sasl.username"] = self.kafka_sasl_username
            conf["sasl.password"] = self.kafka_sasl_password
        if self.kafka_ssl_ca_location and self.kafka_security_protocol in ("SSL", "SASL_SSL"):
            conf["ssl.ca.location"] = self.kafka_ssl_ca_location
        return conf

    def pg_dsn(self, database: str | None = None) -> str:
        """A libpq connection string for one database of the stack's PostgreSQL. Built by
        psycopg, which quotes each value: a password (or any value) with spaces, quotes,
        backslashes or ``=`` is passed as it is, and cannot add a parameter of its own."""
        return make_conninfo(
            host=self.pg_host,
            port=self.pg_port,
            user=self.pg_user,
            password=self.pg_password,
            dbname=database or self.pg_database,
            connect_timeout=5,
            # Text as UTF-8, whatever the database's encoding: on a SQL_ASCII database psycopg
            # would otherwise return every text column as bytes (and a claim's event ids
            # would never equal the str ids they were claimed by).
            client_encoding="UTF8",
        )


def load_settings(env_file: Path | None = None) -> StackSettings:
    """Settings from the environment, falling back to the stack's env file."""
    path = env_file or default_env_file()
    return StackSettings(_env_file=path if path.exists() else None)  # type: ignore[call-arg]


class ServiceSettings(StackSettings):
    """Stack settings plus what one service needs; all from ``FLOTILLA_*`` variables."""

    model_config = SettingsConfigDict(env_prefix="FLOTILLA_", extra="ignore")

    service_name: str = "flotilla-service"
    service_database: str = "flotilla"
    http_host: str = "127.0.0.1"
    http_port: int = 0  # 0: no HTTP server
    log_level: str = "INFO"
    # Retention (flotilla.retention): outbox rows are the service's own record of what it
    # sent, kept this long; dedupe claims outlast the consumed topics' retention by the
    # margin; the pruning task runs this often.
    outbox_retention_hours: float = Field(24.0, gt=0)
    dedupe_margin_hours: float = Field(24.0, gt=0)
    retention_interval_seconds: float = Field(300.0, gt=0)
    # How often a publishing service looks at its outbox connector and restarts what
    # FAILED (Connect never does): rows wait in the outbox at most about this long after
    # a database restart has failed the connector's task.
    connector_check_seconds: float = Field(10.0, gt=0)
    # How long a starting service waits for PostgreSQL and Kafka Connect to answer before
    # it gives up (exit 1). Waiting in the process, not crash-looping: a supervisor's or
    # Kubernetes' restart back-off would keep it down long after they are back.
    startup_patience_seconds: float = Field(300.0, ge=0)
    # flotilla.provenance: this member's own key, which signs every record it emits, and
    # each producer's public keys (by member name, several while one rotates), which every
    # record it consumes is checked against. A member refuses to start without them.
    signing_key_file: Path | None = None  # FLOTILLA_SIGNING_KEY_FILE
    producer_keys: dict[str, list[str]] = Field(default_factory=dict)  # FLOTILLA_PRODUCER_KEYS (JSON)
    # Bounds on what enters from outside (flotilla.bounds). A request body of any HTTP API
    # is refused (413) over this, before it is read or its sender authenticated.
    http_max_body_bytes: int = Field(DEFAULT_MAX_BODY_BYTES, gt=0)
    # An outbox record (payload, key and headers) over this is refused where it is made
    # (flotilla.outbox.RecordTooLargeError): its transaction never commits. Below Kafka's
    # producer limit (1 MiB, which the connectors do not raise), with 1 KiB for framing.
    outbox_max_record_bytes: int = Field(DEFAULT_MAX_RECORD_BYTES, gt=0, le=KAFKA_MAX_REQUEST_BYTES - 1024)

    @classmethod
    def load(cls, **overrides: Any) -> Self:
        """The settings of this class from FLOTILLA_* variables over the stack's env file:
        the one loader every service uses (subclasses inherit it)."""
        path = default_env_file()
        return cls(_env_file=path if path.exists() else None, **overrides)  # type: ignore[call-arg]
