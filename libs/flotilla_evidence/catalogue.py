"""The estate catalogue: what a team declares about its services, validated on load.

Telemetry says what calls what and how fast; it cannot say which standby a service may
fail over to, which Deployment runs it, or what latency is too slow. A catalogue is a
YAML file (``FLOTILLA_ESTATE_CATALOGUE_FILE``)::

    services:
      - name: checkout-api
        environment: production          # default: FLOTILLA_ESTATE_DEFAULT_ENVIRONMENT
        deployment: checkout-api         # the Kubernetes Deployment (default: the name)
        namespace: shop                  # default: the environment's namespace
        depends_on: [payments-api, inventory-db]
        latency_threshold_ms: 500        # a p95 above this is an incident
      - name: payments-api
        failover_to: payments-api-secondary   # the standby its callers may switch to
      - name: payments-api-secondary

A mistake is an error at start-up, naming the file, the service and the key: an unknown
key (a typo would otherwise be silently ignored), a dependency or failover target that
names no service of the same environment, a cycle, a service declared twice, a
threshold that is not a positive number.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

TOP_LEVEL_KEYS = frozenset({"services"})
SERVICE_KEYS = frozenset(
    {"name", "environment", "deployment", "namespace", "depends_on", "latency_threshold_ms", "failover_to"}
)


class CatalogueError(ValueError):
    """The catalogue cannot be used as written; the message says where and why."""


@dataclass(frozen=True)
class Declared:
    """One service as the catalogue declares it."""

    name: str
    environment: str
    deployment: str
    namespace: str | None = None
    depends_on: tuple[str, ...] = ()
    latency_threshold_ms: float | None = None
    failover_to: str | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.environment, self.name)


@dataclass(frozen=True)
class Catalogue:
    """Declared services by ``(environment, name)``; empty when there is no catalogue."""

    services: Mapping[tuple[str, str], Declared] = field(default_factory=dict)
    origin: str = "no catalogue"

    def get(self, environment: str, name: str) -> Declared | None:
        return self.services.get((environment, name))

    def in_environment(self, environment: str) -> dict[str, Declared]:
        return {d.name: d for (env, _), d in self.services.items() if env == environment}

    def __len__(self) -> int:
        return len(self.services)


def load_catalogue(path: Path | None, *, default_environment: str) -> Catalogue:
    """The catalogue at ``path`` (None or an empty path: no catalogue)."""
    if path is None or not str(path).strip():
        return Catalogue()
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise CatalogueError(f"estate catalogue {path}: cannot read it: {exc}") from exc
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CatalogueError(f"estate catalogue {path}: not YAML: {exc}") from exc
    return parse_catalogue(document, origin=str(path), default_environment=default_environment)


def parse_catalogue(document: Any, *, origin: str, default_environment: str) -> Catalogue:
    def fail(message: str) -> CatalogueError:
        return CatalogueError(f"estate catalogue {origin}: {message}")

    if document is None:
        return Catalogue(origin=origin)
    if not isinstance(document, dict):
        raise fail(f"expected a mapping with a 'services' list, got {type(document).__name__}")
    unknown = sorted(set(document) - TOP_LEVEL_KEYS)
    if unknown:
        raise fail(f"unknown key(s) {', '.join(map(str, unknown))} (known: {', '.join(sorted(TOP_LEVEL_KEYS))})")
    entries = document.get("services") or []
    if not isinstance(entries, list):
        raise fail("'services' must be a list")
    declared: dict[tuple[str, str], Declared] = {}
    for i, entry in enumerate(entries):
        service = _service(entry, f"services[{i}]", default_environment, fail)
        if service.key in declared:
            raise fail(f"{service.environment}/{service.name} is declared twice")
        declared[service.key] = service
    _check_references(declared, fail)
    _check_acyclic(declared, fail)
    return Catalogue(declared, origin=origin)


def _service(entry: Any, where: str, default_environment: str, fail: Any) -> Declared:
    if not isinstance(entry, dict):
        raise fail(f"{where} must be a mapping, got {type(entry).__name__}")
    name = entry.get("name")
    if not isinstance(name, str) or not name.strip():
        raise fail(f"{where} has no name")
    where = f"{where} ({name})"
    unknown = sorted(set(map(str, entry)) - SERVICE_KEYS)
    if unknown:
        raise fail(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(SERVICE_KEYS))})")

    def text(key: str, default: str | None) -> str | None:
        value = entry.get(key, default)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise fail(f"{where}: {key} must be a non-empty string")
        return value

    depends_on = entry.get("depends_on") or []
    if not isinstance(depends_on, list) or not all(isinstance(d, str) and d.strip() for d in depends_on):
        raise fail(f"{where}: depends_on must be a list of service names")
    if len(set(depends_on)) != len(depends_on):
        raise fail(f"{where}: depends_on names a service twice")
    threshold = entry.get("latency_threshold_ms")
    if threshold is not None and (
        isinstance(threshold, bool)
        or not isinstance(threshold, int | float)
        or not math.isfinite(threshold)
        or threshold <= 0
    ):
        raise fail(f"{where}: latency_threshold_ms must be a positive number of milliseconds, got {threshold!r}")
    environment = text("environment", default_environment)
    assert environment is not None
    return Declared(
        name=name,
        environment=environment,
        deployment=text("deployment", name) or name,
        namespace=text("namespace", None),
        depends_on=tuple(depends_on),
        latency_threshold_ms=None if threshold is None else float(threshold),
        failover_to=text("failover_to", None),
    )


def _check_references(declared: Mapping[tuple[str, str], Declared], fail: Any) -> None:
    for service in declared.values():
        for dependency in service.depends_on:
            if (service.environment, dependency) not in declared:
                raise fail(
                    f"{service.environment}/{service.name} depends on {dependency}, "
                    f"which names no service in {service.environment}"
                )
        if service.failover_to is not None:
            if service.failover_to == service.name:
                raise fail(f"{service.environment}/{service.name} fails over to itself")
            if (service.environment, service.failover_to) not in declared:
                raise fail(
                    f"{service.environment}/{service.name} fails over to {service.failover_to}, "
                    f"which names no service in {service.environment}"
                )


def _callees(service: Declared, declared: Mapping[tuple[str, str], Declared]) -> Iterable[str]:
    """Whom ``service`` may call: each dependency and the standby it may fail over to."""
    for dependency in service.depends_on:
        yield dependency
        standby = declared[(service.environment, dependency)].failover_to
        if standby is not None:
            yield standby


def _check_acyclic(declared: Mapping[tuple[str, str], Declared], fail: Any) -> None:
    done: set[tuple[str, str]] = set()

    def visit(key: tuple[str, str], path: tuple[str, ...]) -> None:
        if key[1] in path:
            cycle = " -> ".join((*path[path.index(key[1]) :], key[1]))
            raise fail(f"dependency cycle in {key[0]}: {cycle}")
        if key in done:
            return
        for callee in _callees(declared[key], declared):
            visit((key[0], callee), (*path, key[1]))
        done.add(key)

    for key in declared:
        visit(key, ())
