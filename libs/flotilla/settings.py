"""Connection settings for the stack, read from the environment.

The local stack writes them to one env file (``.stack/stack.env``); docker compose and
Kubernetes set the same ``FLOTILLA_*`` variables directly. Explicit environment
variables win over the file, so one process can point at another stack.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic_settings import BaseSettings, SettingsConfigDict


def default_env_file() -> Path:
    """``$FLOTILLA_ENV_FILE``, else the nearest ``.stack/stack.env`` at or above the cwd."""
    explicit = os.environ.get("FLOTILLA_ENV_FILE")
    if explicit:
        return Path(explicit)
    here = Path.cwd().resolve()
    for folder in (here, *here.parents):
        candidate = folder / ".stack" / "stack.env"
        if candidate.exists():
            return candidate
    return here / ".stack" / "stack.env"


class StackSettings(BaseSettings):
    """Where Kafka, the schema registry, Kafka Connect and PostgreSQL are."""

    model_config = SettingsConfigDict(env_prefix="FLOTILLA_", extra="ignore")

    stack: str = "local"
    kafka_bootstrap: str = "127.0.0.1:19092"
    schema_registry_url: str = "http://127.0.0.1:18081/apis/ccompat/v7"
    connect_url: str = "http://127.0.0.1:18083"
    pg_host: str = "127.0.0.1"
    pg_port: int = 55432
    pg_user: str = "flotilla"
    pg_password: str = "flotilla"
    pg_database: str = "flotilla"

    def pg_dsn(self, database: str | None = None) -> str:
        """A libpq connection string for one database of the stack's PostgreSQL."""
        db = database or self.pg_database
        return (
            f"host={self.pg_host} port={self.pg_port} user={self.pg_user} "
            f"password={self.pg_password} dbname={db} connect_timeout=5"
        )


def load_settings(env_file: Path | None = None) -> StackSettings:
    """Settings from the environment, falling back to the stack's env file."""
    path = env_file or default_env_file()
    return StackSettings(_env_file=path if path.exists() else None)  # type: ignore[call-arg]
