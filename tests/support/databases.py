"""A consumer's database for the integration tests: created if missing, runtime tables migrated."""

from __future__ import annotations

import psycopg

from flotilla import StackSettings, ensure_database, migrate


def migrated_database(stack: StackSettings, name: str) -> str:
    """``name``, existing and holding the consumer loop's tables (dedupe, workflow, DLQ)."""
    ensure_database(stack, name)
    with psycopg.connect(stack.pg_dsn(name), autocommit=True) as conn:
        migrate(conn)
    return name
