"""The health agent's settings (``FLOTILLA_*`` variables over the stack env file)."""

from __future__ import annotations

from pydantic_settings import SettingsConfigDict

from flotilla import ServiceSettings
from flotilla.fleet import HEALTH, SIM, url


class HealthSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="FLOTILLA_", extra="ignore")

    service_name: str = HEALTH.name
    service_database: str = HEALTH.database or "flotilla_health"
    http_port: int = HEALTH.http_port

    sim_url: str = url(SIM)  # FLOTILLA_SIM_URL: where /metrics is scraped
    health_scrape_seconds: float = 1.0  # FLOTILLA_HEALTH_SCRAPE_SECONDS
    health_scrape_timeout_seconds: float = 2.0
    health_breach_scrapes: int = 3  # K: consecutive breaching scrapes that open an incident
    health_clear_scrapes: int = 3  # M: consecutive healthy scrapes that end a breach
    health_verify_seconds: float = 5.0  # FLOTILLA_HEALTH_VERIFY_SECONDS: verification window
    health_default_environment: str = "production"  # for metrics without an environment label
    incidents_topic: str = "incidents"
