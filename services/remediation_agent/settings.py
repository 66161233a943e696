"""The remediation agent's settings (``FLOTILLA_*``; see also AgentSettings)."""

from __future__ import annotations

from pathlib import Path

from flotilla_reasoning.settings import AgentSettings
from pydantic import Field
from pydantic_settings import SettingsConfigDict

from flotilla import fleet
from flotilla.authority import Signer, required_signer


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
    # Planning runs outside the consumer's transaction (flotilla.deferred), on this many
    # threads: one slow model answer delays only its own incident.
    propose_workers: int = Field(4, ge=1, le=32)
    # A worker owns a diagnosis this long past its last heartbeat (it renews every third of
    # it while the reasoner runs, however slow): a killed worker's plan is taken up again
    # after at most this long.
    propose_lease_seconds: float = Field(30.0, gt=0)
    propose_retry_seconds: float = Field(2.0, gt=0)  # after evidence or a model server that did not answer
    # Still no plan this long after the diagnosis: escalate to a person.
    propose_deadline_seconds: float = Field(600.0, gt=0)

    def proposal_signer(self) -> Signer:
        return required_signer(
            self.proposal_signing_key_file,
            setting="FLOTILLA_PROPOSAL_SIGNING_KEY_FILE",
            why="the policy service decides only on proposals a remediation agent signed",
        )
