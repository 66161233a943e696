"""Reading the services' databases while PostgreSQL may be restarting."""

from __future__ import annotations

import time
from typing import Any

import psycopg


def rows(
    dsn: str, sql: str, params: tuple[Any, ...] | dict[str, Any] = (), patience: float = 90
) -> list[tuple[Any, ...]]:
    """All rows of one query; a connection lost to a restart is retried for ``patience`` s."""
    deadline = time.monotonic() + patience
    while True:
        try:
            with psycopg.connect(dsn, connect_timeout=5) as conn:
                return conn.execute(sql, params).fetchall()  # type: ignore[arg-type]
        except psycopg.OperationalError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.5)
