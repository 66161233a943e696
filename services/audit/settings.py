"""The audit service's settings (``FLOTILLA_*`` variables over the stack env file)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic_settings import SettingsConfigDict

from flotilla.service import ServiceSettings
from flotilla.settings import default_env_file
from services.fleet import AUDIT

ALL_TOPICS = ("incidents", "commands", "incidents.dlq", "commands.dlq")


def _default_key_file() -> Path:
    """Beside the stack's env file (``.stack/``), which is not committed."""
    return default_env_file().parent / "audit" / "signing-key.pem"


class AuditSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="FLOTILLA_", extra="ignore")

    service_name: str = AUDIT.name
    service_database: str = AUDIT.database or "flotilla_audit"
    http_port: int = AUDIT.http_port

    audit_topics: tuple[str, ...] = ALL_TOPICS
    audit_signing_key_file: Path | None = None  # FLOTILLA_AUDIT_SIGNING_KEY_FILE

    @property
    def signing_key_path(self) -> Path:
        return self.audit_signing_key_file or _default_key_file()


def load_settings(**overrides: Any) -> AuditSettings:
    path = default_env_file()
    return AuditSettings(_env_file=path if path.exists() else None, **overrides)  # type: ignore[call-arg]
