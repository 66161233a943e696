"""Reading untrusted YAML into typed values, with every problem named by its path.

A fixture with a typo must fail loudly and say where (``expected.actions.acceptable[2]:
unknown key 'replica'``), never be half-read: each reader records what is wrong and
returns None, so one pass over a file reports all its problems at once.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any


class Problems:
    """What is wrong with one document, by path."""

    def __init__(self) -> None:
        self.found: list[str] = []

    def add(self, path: str, message: str) -> None:
        self.found.append(f"{path}: {message}")

    def __bool__(self) -> bool:
        return bool(self.found)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def mapping(
    value: Any, path: str, problems: Problems, *, required: Iterable[str] = (), optional: Iterable[str] = ()
) -> dict[str, Any] | None:
    """``value`` as a mapping with exactly the known keys (all ``required`` ones present)."""
    if not isinstance(value, dict):
        problems.add(path, f"expected a mapping, got {_shown(value)}")
        return None
    needed, allowed = set(required), set(required) | set(optional)
    for key in value:
        if key not in allowed:
            problems.add(path, f"unknown key {key!r} (known: {', '.join(sorted(allowed))})")
    for key in sorted(needed - set(value)):
        problems.add(path, f"required key {key!r} is missing")
    return value


def items(value: Any, path: str, problems: Problems, *, allow_empty: bool = True) -> list[Any]:
    """``value`` as a list (null: empty)."""
    if value is None:
        value = []
    if not isinstance(value, list):
        problems.add(path, f"expected a list, got {_shown(value)}")
        return []
    if not value and not allow_empty:
        problems.add(path, "must not be empty")
    return value


def text(value: Any, path: str, problems: Problems, *, nullable: bool = False) -> str | None:
    if value is None and nullable:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int | float) or not str(value).strip():
        problems.add(path, f"expected a non-empty string, got {_shown(value)}")
        return None
    return str(value)  # YAML reads r42 as a string but 42 as a number: both are names


def number(value: Any, path: str, problems: Problems, *, positive: bool = False) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        problems.add(path, f"expected a number, got {_shown(value)}")
        return None
    if positive and value <= 0:
        problems.add(path, f"must be above 0, got {value}")
        return None
    return float(value)


def integer(value: Any, path: str, problems: Problems, *, nullable: bool = False) -> int | None:
    if value is None and nullable:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        problems.add(path, f"expected a whole number{' or null' if nullable else ''}, got {_shown(value)}")
        return None
    return value


def flag(value: Any, path: str, problems: Problems) -> bool | None:
    if not isinstance(value, bool):
        problems.add(path, f"expected true or false, got {_shown(value)}")
        return None
    return value


def moment(value: Any, path: str, problems: Problems) -> datetime | None:
    """An ISO-8601 time (YAML may already have read it as one); without a zone it is UTC."""
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if not isinstance(value, datetime):
        problems.add(path, f"expected an ISO-8601 time such as 2026-03-02T10:00:00Z, got {_shown(value)}")
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def choice(value: Any, path: str, problems: Problems, allowed: Iterable[str]) -> str | None:
    options = list(allowed)
    if value not in options:
        problems.add(path, f"{_shown(value)} is not one of {', '.join(options)}")
        return None
    return str(value)


def keyed(value: Any, path: str, problems: Problems) -> dict[str, Any]:
    """A mapping whose keys are names (services, dependencies); null is empty."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        problems.add(path, f"expected a mapping, got {_shown(value)}")
        return {}
    return {str(k): v for k, v in value.items()}
