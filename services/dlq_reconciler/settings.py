"""The DLQ reconciler's settings (``FLOTILLA_*`` variables over the stack env file)."""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any

from pydantic import Field, field_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from flotilla import ServiceSettings
from flotilla.fleet import DLQ_RECONCILER
from services.dlq_reconciler.auth import OperatorTokens

# The demo's operator token. Its digest stands in for an unset FLOTILLA_OPERATOR_TOKENS in
# the demo profile only (FLOTILLA_PROFILE=demo, with a warning at start-up); any other
# profile refuses to start without the setting.
DEMO_OPERATOR_TOKEN = "operator-token"
DEMO_OPERATOR_DIGEST = hashlib.sha256(DEMO_OPERATOR_TOKEN.encode()).hexdigest()

OperatorEntries = list[str | dict[str, str]]


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
    # Unset or empty (compose and Kubernetes pass an empty value for "not configured"): see
    # operators().
    operator_tokens: Annotated[OperatorEntries | None, NoDecode] = None
    requeue_timeout_seconds: float = 10.0
    # The policy service's public keys (as the executor has them): a command is re-queued
    # only with its signature intact, so a re-queue can never mint authority. Empty: no
    # command can be re-queued at all.
    authorization_public_keys: list[str] = Field(default_factory=list)

    @property
    def origin_topics(self) -> tuple[str, ...]:
        """The topics whose dead letters this reconciler reads (``x.dlq`` holds letters of ``x``)."""
        return tuple(t.removesuffix(".dlq") for t in self.dlq_topics)

    @field_validator("operator_tokens", mode="before")
    @classmethod
    def _blank_is_unset(cls, value: Any) -> Any:
        """An environment value is JSON; an empty one means not configured."""
        if not isinstance(value, str):
            return value
        if not value.strip():
            return None
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"FLOTILLA_OPERATOR_TOKENS is not valid JSON: {exc.msg}") from None

    def operators(self) -> tuple[OperatorTokens, bool]:
        """Who may re-queue, and whether that is the demo operator.

        Unset: the demo operator token in the demo profile, else
        :class:`~flotilla.settings.MissingCredentials`. A list that names nobody (``[]``) is
        refused in every profile: a reconciler nobody may operate is a configuration mistake.
        """
        if self.operator_tokens is None:
            self.allow_demo_credentials("FLOTILLA_OPERATOR_TOKENS")
            return OperatorTokens([DEMO_OPERATOR_DIGEST]), True
        if not self.operator_tokens:
            raise ValueError("FLOTILLA_OPERATOR_TOKENS names no operator: configure at least one token digest")
        tokens = OperatorTokens(self.operator_tokens)
        demo = any(isinstance(t, str) and t.strip().lower() == DEMO_OPERATOR_DIGEST for t in self.operator_tokens)
        return tokens, demo
