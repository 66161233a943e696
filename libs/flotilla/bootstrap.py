"""Make a service database ready to publish: database, outbox table, connector.

Every step is idempotent, so services run it at start-up and operators can run it
again at any time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool

from flotilla import connectors, outbox
from flotilla.settings import ServiceSettings, StackSettings


def ensure_database(settings: StackSettings, database: str) -> None:
    """Create ``database`` on the stack's PostgreSQL if it does not exist."""
    with psycopg.connect(settings.pg_dsn("postgres"), autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone()
        if not exists:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))


def bootstrap_outbox(
    settings: StackSettings, database: str, *, topics: Sequence[str] | None = None, timeout: float = 90
) -> str:
    """Database + outbox table + a RUNNING Debezium outbox connector that publishes only to
    ``topics`` (None: to any); returns its name."""
    ensure_database(settings, database)
    with psycopg.connect(settings.pg_dsn(database)) as conn:
        outbox.migrate(conn)
    name = connectors.connector_name(database)
    config = connectors.outbox_connector_config(database, topics=topics, delivery=settings.outbox_delivery)
    connectors.register_connector(settings.connect_url, name, config)
    connectors.wait_running(settings.connect_url, name, timeout=timeout)
    return name


def drop_outbox(settings: StackSettings, database: str) -> None:
    """Remove a database's connector, replication slot and the database itself."""
    connectors.delete_connector(settings.connect_url, connectors.connector_name(database))
    slot = connectors.outbox_connector_config(database)["slot.name"]
    with psycopg.connect(settings.pg_dsn("postgres"), autocommit=True) as conn:
        # The slot stays active until Connect has stopped the task; retry briefly.
        for _ in range(50):
            row = conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
            if row is None:
                break
            if not row[0]:
                conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
                break
            conn.execute("SELECT pg_sleep(0.2)")
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database)))


def open_pool(settings: ServiceSettings, *, max_size: int = 4) -> ConnectionPool[Any]:
    """A connection pool on the service's own database, in autocommit mode: every
    transaction is an explicit ``conn.transaction()`` block."""
    return ConnectionPool(
        settings.pg_dsn(settings.service_database),
        min_size=1,
        max_size=max_size,
        kwargs={"autocommit": True},
        open=True,
        name=settings.service_name,
    )
