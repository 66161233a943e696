"""The DLQ reconciler's settings (``FLOTILLA_*`` variables over the stack env file)."""

from __future__ import annotations

import hashlib
from typing import Any

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from flotilla.service import ServiceSettings
from flotilla.settings import default_env_file
from services.fleet import DLQ_RECONCILER

# The demo's operator token. Its digest is the default of FLOTILLA_OPERATOR_TOKENS so the
# local demo works out of the box; any real deployment sets the variable (a warning is
# logged at start-up while the default is in use).
DEMO_OPERATOR_TOKEN = "operator-token"
DEMO_OPERATOR_DIGEST = hashlib.sha256(DEMO_OPERATOR_TOKEN.encode()).hexdigest()


def _demo_tokens() -> list[str | dict[str, str]]:
    return [DEMO_OPERATOR_DIGEST]


class DlqSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="FLOTILLA_", extra="ignore")

    service_name: str = DLQ_RECONCILER.name
    service_database: str = DLQ_RECONCILER.database or "flotilla_dlq"
    http_port: int = DLQ_RECONCILER.http_port

    # Dead-letter topics to reconcile, and where DeadLetterQuarantined facts go.
    dlq_topics: tuple[str, ...] = ("incidents.dlq", "commands.dlq")
    incidents_topic: str = "incidents"
    # JSON list of lower-case hex SHA-256 digests of bearer tokens allowed to re-queue.
    # An entry may also be {"name": "alice", "sha256": "<hex>"} to name the operator.
    operator_tokens: list[str | dict[str, str]] = Field(default_factory=_demo_tokens)
    requeue_timeout_seconds: float = 10.0
    # The policy service's public keys (as the executor has them): a command is re-queued
    # only with its signature intact, so a re-queue can never mint authority. Empty: no
    # command can be re-queued at all.
    authorization_public_keys: list[str] = Field(default_factory=list)


def load_settings(**overrides: Any) -> DlqSettings:
    path = default_env_file()
    return DlqSettings(_env_file=path if path.exists() else None, **overrides)  # type: ignore[call-arg]
