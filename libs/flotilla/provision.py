"""Make a stack ready for a fleet, in one idempotent run.

    python -m flotilla.provision --outbox flotilla_health=incidents \\
                               --outbox flotilla_policy=incidents,commands ... --database flotilla_audit

1. registers every contract in ``schemas/`` with the registry (``flotilla.contracts``), as
   the registrar (``FLOTILLA_SCHEMA_REGISTRY_AUTH`` or ``..._AUTH_FILE``: the registry
   refuses anonymous writes);
2. for each ``--outbox DATABASE=TOPIC[,TOPIC]``: the database, its outbox table and a
   RUNNING Debezium outbox connector that publishes only to those topics — the service's
   ``emits``, so the connector is configured exactly as the service registers it
   (``flotilla.bootstrap.bootstrap_outbox``);
3. for each ``--database``: the database alone (a service that publishes nothing).

Services do steps 2 and 3 for themselves at start-up as well; running them first (the
``fleet-init`` job of docker compose) surfaces a broken registry, Connect worker or
database once, by name, instead of as eight services failing to become ready. Steps are
retried on connection errors until ``--timeout``; a contract the registry refuses as
incompatible fails at once. Settings are the usual ``FLOTILLA_*`` ones.
"""

from __future__ import annotations

import argparse
import functools
import logging
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from flotilla import bootstrap, contracts
from flotilla.registry import RegistrarRefused, registrar_client, write_refused
from flotilla.settings import StackSettings, load_settings

log = logging.getLogger("flotilla.provision")

T = TypeVar("T")


def _retrying(what: str, step: Callable[[], T], deadline: float, pause: float) -> T:
    while True:
        try:
            return step()
        except (contracts.IncompatibleSchemaError, RegistrarRefused):
            raise  # asking again will not change the registry's mind
        except Exception as exc:
            if time.monotonic() + pause > deadline:
                raise
            log.warning("%s failed (%s: %s); retrying in %.0fs", what, exc.__class__.__name__, exc, pause)
            time.sleep(pause)


def _register(settings: StackSettings, client: SchemaRegistryClient) -> dict[str, int]:
    try:
        return contracts.register_all(client)
    except SchemaRegistryError as exc:
        refused = write_refused(exc, settings)
        if refused is None:
            raise
        raise refused from None


def provision(
    settings: StackSettings,
    *,
    outbox: Mapping[str, Sequence[str]] | Sequence[str] = (),
    databases: Sequence[str] = (),
    schemas: bool = True,
    timeout: float = 180.0,
    pause: float = 2.0,
) -> None:
    """Contracts, then every outbox database with its connector, then plain databases."""
    deadline = time.monotonic() + timeout
    if schemas:
        client = registrar_client(settings)  # registering needs the registrar's credentials
        ids = _retrying("registering the contracts", functools.partial(_register, settings, client), deadline, pause)
        log.info("%d contracts registered", len(ids))
    declared = outbox if isinstance(outbox, Mapping) else {database: None for database in outbox}
    for database, topics in declared.items():
        left = max(1.0, deadline - time.monotonic())
        step = functools.partial(bootstrap.bootstrap_outbox, settings, database, topics=topics, timeout=left)
        name = _retrying(f"outbox of {database}", step, deadline, pause)
        log.info("%s: outbox table and connector %s running", database, name)
    for database in databases:
        ensure = functools.partial(bootstrap.ensure_database, settings, database)
        _retrying(f"database {database}", ensure, deadline, pause)
        log.info("%s: database ready", database)


def _outbox_arg(text: str) -> tuple[str, tuple[str, ...]]:
    database, sep, topics = text.partition("=")
    names = tuple(t.strip() for t in topics.split(",") if t.strip())
    if not database or not sep or not names:
        raise argparse.ArgumentTypeError(f"{text!r}: expected DATABASE=TOPIC[,TOPIC] (the topics it may publish to)")
    return database, names


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flotilla.provision", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--outbox",
        action="append",
        default=[],
        type=_outbox_arg,
        metavar="DATABASE=TOPIC[,TOPIC]",
        help="a publishing database and the only topics its connector may publish to",
    )
    parser.add_argument("--database", action="append", default=[], metavar="DATABASE", help="a database only")
    parser.add_argument("--no-schemas", action="store_true", help="do not register the contracts")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds to keep retrying (default 180)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        provision(
            load_settings(),
            outbox=dict(args.outbox),
            databases=args.database,
            schemas=not args.no_schemas,
            timeout=args.timeout,
        )
    except Exception as exc:
        log.error("not provisioned: %s: %s", exc.__class__.__name__, exc)
        return 1
    log.info("the stack is ready for the fleet")
    return 0


if __name__ == "__main__":
    sys.exit(main())
