"""The remediation agent's settings (``FLOTILLA_*``; see also AgentSettings)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from services import fleet
from services.reasoner.settings import AgentSettings


class RemediationSettings(AgentSettings):
    model_config = SettingsConfigDict(env_prefix="FLOTILLA_", extra="ignore")

    service_name: str = fleet.REMEDIATION.name
    service_database: str = fleet.REMEDIATION.database or "flotilla_remediation"
    http_port: int = fleet.REMEDIATION.http_port

    # A proposed command expires this long after it was issued; the executor refuses it then.
    command_ttl_seconds: int = Field(900, gt=0)
