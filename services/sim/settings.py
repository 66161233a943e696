"""Where the sim listens and how long its actions take (``FLOTILLA_SIM_*``)."""

from __future__ import annotations

from typing import Any

from pydantic_settings import SettingsConfigDict

from flotilla.service import ServiceSettings
from flotilla.settings import default_env_file
from services.fleet import SIM


class SimSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="FLOTILLA_", extra="ignore")

    service_name: str = SIM.name
    sim_host: str = "127.0.0.1"
    sim_port: int = SIM.http_port
    sim_action_seconds: float = 0.2  # simulated time every action takes

    @classmethod
    def load(cls, **overrides: Any) -> SimSettings:
        path = default_env_file()
        return cls(_env_file=path if path.exists() else None, **overrides)  # type: ignore[call-arg]
