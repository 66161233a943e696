"""The console's settings: where it listens, how long and how many sessions it keeps, where
the services are.

All ``FLOTILLA_*`` variables (or the stack env file), like every member of the fleet:
``FLOTILLA_HTTP_HOST`` / ``FLOTILLA_HTTP_PORT`` (default 18108), the session limits
(``FLOTILLA_CONSOLE_SESSION_HOURS``, ``FLOTILLA_CONSOLE_MAX_SESSIONS``,
``FLOTILLA_CONSOLE_MAX_ANONYMOUS_SESSIONS``), and the services' ``FLOTILLA_POLICY_URL``,
``FLOTILLA_AUDIT_URL``, ``FLOTILLA_DLQ_URL``, ``FLOTILLA_EXECUTOR_URL`` (see
:class:`flotilla_ops.fleetapi.FleetEndpoints`). Sessions live in the process
(:mod:`services.console.session`), so there is no session secret to set.
"""

from __future__ import annotations

from flotilla_ops.fleetapi import FleetEndpoints
from pydantic import Field
from pydantic_settings import SettingsConfigDict

from flotilla import ServiceSettings
from flotilla.fleet import AUDIT, CONSOLE, DLQ_RECONCILER, EXECUTOR, POLICY, SIM, url


class ConsoleSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="FLOTILLA_", extra="ignore")

    service_name: str = CONSOLE.name
    http_port: int = CONSOLE.http_port

    # How long a login lasts (absolute, not sliding).
    console_session_hours: float = Field(default=8.0, gt=0)
    # How many sessions the process keeps: signed-in people, and anonymous visitors (every
    # visitor has one, for the login form's CSRF token). When a table is full the least
    # recently used session in it ends; anonymous visitors never push out a signed-in person.
    console_max_sessions: int = Field(default=1000, ge=1)
    console_max_anonymous_sessions: int = Field(default=10000, ge=1)
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
