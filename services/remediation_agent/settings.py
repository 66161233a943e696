"""The remediation agent's settings (``FLOTILLA_*``; see also AgentSettings)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from flotilla.authority import Signer, required_signer
from services import fleet
from services.reasoner.settings import AgentSettings


class RemediationSettings(AgentSettings):
    model_config = SettingsConfigDict(env_prefix="FLOTILLA_", extra="ignore")

    service_name: str = fleet.REMEDIATION.name
    service_database: str = fleet.REMEDIATION.database or "flotilla_remediation"
    http_port: int = fleet.REMEDIATION.http_port

    # A proposed command expires this long after it was issued; the executor refuses it then.
    command_ttl_seconds: int = Field(900, gt=0)
    # The Ed25519 key this agent signs its proposals with: the policy service decides only
    # on proposals a trusted agent signed (a file or mounted Secret, never the repository).
    proposal_signing_key_file: Path | None = None

    def proposal_signer(self) -> Signer:
        return required_signer(
            self.proposal_signing_key_file,
            setting="FLOTILLA_PROPOSAL_SIGNING_KEY_FILE",
            why="the policy service decides only on proposals a remediation agent signed",
        )
