"""The console's settings: where it listens, how it encrypts sessions, where the services are.

All ``FLOTILLA_*`` variables (or the stack env file), like every member of the fleet:
``FLOTILLA_HTTP_HOST`` / ``FLOTILLA_HTTP_PORT`` (default 18108),
``FLOTILLA_CONSOLE_SESSION_SECRET`` (random per process when unset: sessions then end
with the process, and more than one replica cannot share them), and the services'
``FLOTILLA_POLICY_URL``, ``FLOTILLA_AUDIT_URL``, ``FLOTILLA_DLQ_URL``,
``FLOTILLA_EXECUTOR_URL`` (see :class:`flotilla_ops.fleetapi.FleetEndpoints`).
"""

from __future__ import annotations

from typing import Any

from flotilla_ops.fleetapi import FleetEndpoints
from pydantic import SecretStr
from pydantic_settings import SettingsConfigDict

from flotilla.service import ServiceSettings
from flotilla.settings import default_env_file
from services.fleet import AUDIT, CONSOLE, DLQ_RECONCILER, EXECUTOR, POLICY, SIM, url


class ConsoleSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="FLOTILLA_", extra="ignore")

    service_name: str = CONSOLE.name
    http_port: int = CONSOLE.http_port

    # The secret the session cookie's encryption key is derived from; at least 32 characters when set.
    console_session_secret: SecretStr | None = None
    # How long a login lasts (absolute, not sliding).
    console_session_hours: float = 8.0
    # Mark the cookie Secure: set it when the console is served over HTTPS.
    console_cookie_secure: bool = False
    # Seconds to wait for a service before showing it as unreachable.
    console_upstream_timeout_seconds: float = 5.0

    policy_url: str = url(POLICY)
    audit_url: str = url(AUDIT)
    dlq_url: str = url(DLQ_RECONCILER)
    executor_url: str = url(EXECUTOR)
    sim_url: str = url(SIM)

    def endpoints(self) -> FleetEndpoints:
        return FleetEndpoints(
            policy_url=self.policy_url,
            audit_url=self.audit_url,
            dlq_url=self.dlq_url,
            executor_url=self.executor_url,
            sim_url=self.sim_url,
        )

    @classmethod
    def load(cls, **overrides: Any) -> ConsoleSettings:
        path = default_env_file()
        return cls(_env_file=path if path.exists() else None, **overrides)  # type: ignore[call-arg]
