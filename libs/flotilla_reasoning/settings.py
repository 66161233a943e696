"""Settings every agent that reasons shares: which reasoner, the model server, and
(through :class:`~flotilla_evidence.settings.EvidenceSettings`) where the evidence comes from.

All come from ``FLOTILLA_*`` variables (or the stack env file), like the stack's own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from flotilla_evidence.settings import EvidenceSettings
from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from flotilla_reasoning.dialects import DialectChoice

Strategy = Literal["scale", "failover", "failover-then-scale"]


class AgentSettings(EvidenceSettings):
    model_config = SettingsConfigDict(env_prefix="FLOTILLA_", extra="ignore")

    # Who this instance is in records that name their author (startedBy); the service
    # name when unset.
    instance_id: str | None = None

    # FLOTILLA_REASONER: rules (deterministic, offline; the default) or llm.
    reasoner: Literal["rules", "llm"] = "rules"

    # The LLM reasoner: any OpenAI-compatible chat-completions server.
    # No defaults: choosing the llm reasoner means naming the server and the model.
    llm_base_url: str | None = None  # e.g. http://127.0.0.1:11434/v1, https://api.openai.com/v1
    llm_model: str | None = None
    llm_api_key: SecretStr = SecretStr("not-needed")
    # Or a file holding the key (read when FLOTILLA_LLM_API_KEY is not set): the local
    # stack's model server names its 0600 secret here, never the value, which would end up
    # in supervisord's config and the environment of every member.
    llm_api_key_file: Path | None = None
    llm_timeout_seconds: float = 60.0
    llm_max_retries: int = 2  # transport retries inside the client (not answer retries)
    llm_temperature: float = 0.0
    # How to ask this server for a schema-shaped answer (flotilla_reasoning.dialects): auto
    # finds out on the first call; name one to skip the probing or to pin a server's form.
    llm_response_format: DialectChoice = "auto"
    # The longest answer asked for (the request's max_tokens): a decision is a few hundred
    # tokens, and a model that rambles should stop, not spend the incident's budget.
    llm_max_tokens: int = Field(1024, gt=0)

    # The rules reasoner's thresholds and its remediation strategy.
    rules_suspect_ratio: float = Field(2.0, gt=1.0)  # dependency p95 / its normal to suspect it
    rules_dependency_normal_ms: float = Field(100.0, gt=0)  # normal p95 of a dependency with no threshold
    rules_target_utilization: float = Field(0.75, gt=0, le=1)  # worker-pool utilization a scale-out aims for
    remediation_strategy: Strategy = "scale"
    max_replicas: int = Field(20, ge=1)  # never propose more (policy denies more than 20)

    @field_validator("llm_api_key_file", mode="before")
    @classmethod
    def _blank_is_unset(cls, value: object) -> object:
        return None if isinstance(value, str) and not value.strip() else value

    @model_validator(mode="after")
    def _key_from_file(self) -> AgentSettings:
        if self.llm_api_key_file is not None and "llm_api_key" not in self.model_fields_set:
            key = self.llm_api_key_file.read_text().strip()
            if not key:
                raise ValueError(f"FLOTILLA_LLM_API_KEY_FILE {self.llm_api_key_file} is empty")
            self.llm_api_key = SecretStr(key)
        return self
