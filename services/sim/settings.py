"""Where the sim listens, how long its actions take and who may act (``FLOTILLA_SIM_*``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from flotilla import ServiceSettings
from flotilla.fleet import SIM
from services.sim.auth import check_action_token


class SimSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="FLOTILLA_", extra="ignore")

    service_name: str = SIM.name
    sim_host: str = "127.0.0.1"
    sim_port: int = SIM.http_port
    sim_action_seconds: float = 0.2  # simulated time every action takes
    # 0: the demo's topology; N (even, up to 2,000): a generated estate (SimModel.generated)
    sim_services: int = Field(0, ge=0, le=2000)
    # Of a generated estate, the share of pairs in production (where a person approves);
    # the storm benchmark sets 0: every incident on the auto-authorized path.
    sim_production_share: float = Field(0.25, ge=0, le=1)
    # Where the action ledger is kept across restarts (services/sim/ledger.py); None: in
    # memory, forgotten on restart. The chaos soak sets it: it SIGKILLs the sim.
    sim_ledger_file: Path | None = None
    # The bearer token the action API requires (the executor's setting of the same name).
    # No default: the sim does not start without one (services/sim/__main__.py).
    sim_action_token: SecretStr | None = None
    # Or a file holding it (docker compose: keys-init generates one into a volume only the
    # sim and the executor mount). One or the other, not both.
    sim_action_token_file: Path | None = None

    @field_validator("sim_services")
    @classmethod
    def _even_estate(cls, value: int) -> int:
        if value % 2:
            raise ValueError(f"a generated estate has an even number of services (pairs), not {value}")
        return value

    @field_validator("sim_action_token")
    @classmethod
    def _usable_token(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            check_action_token(value.get_secret_value())
        return value

    @model_validator(mode="after")
    def _one_token_source(self) -> SimSettings:
        if self.sim_action_token is not None and self.sim_action_token_file is not None:
            raise ValueError("set FLOTILLA_SIM_ACTION_TOKEN or FLOTILLA_SIM_ACTION_TOKEN_FILE, not both")
        return self

    def action_token(self) -> str | None:
        """The action token: FLOTILLA_SIM_ACTION_TOKEN, else the content of
        FLOTILLA_SIM_ACTION_TOKEN_FILE (read now and checked like the variable; ValueError
        saying what is wrong), else None."""
        if self.sim_action_token is not None:
            return self.sim_action_token.get_secret_value()
        if self.sim_action_token_file is None:
            return None
        try:
            return check_action_token(self.sim_action_token_file.read_text().strip())
        except OSError as exc:
            raise ValueError(f"FLOTILLA_SIM_ACTION_TOKEN_FILE {self.sim_action_token_file}: {exc.strerror}") from None
        except ValueError as exc:
            raise ValueError(f"FLOTILLA_SIM_ACTION_TOKEN_FILE {self.sim_action_token_file}: {exc}") from None
