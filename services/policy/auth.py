"""Who is calling the approval API: bearer tokens mapped to people and their roles.

Tokens come from settings (``FLOTILLA_POLICY_USERS``, JSON) or a file
(``FLOTILLA_POLICY_USERS_FILE``), shaped ``{"<token>": {"user": "alice", "roles":
["approver"]}}``. A key written ``sha256:<hex>`` is already a digest, so a deployment can
keep raw tokens out of its configuration altogether. In memory only SHA-256 digests are
kept; a presented token is hashed and compared against *every* entry with
``hmac.compare_digest``, so neither the comparison nor the loop ends early on a match.

Without configuration, and only in the demo profile (``FLOTILLA_PROFILE=demo``: the local
stack, compose's demo, the Kubernetes dev overlay), the demo users apply: ``alice-token``
(alice, approver) and ``bob-token`` (bob, viewer); the service logs a warning when it runs
with them. In any other profile it refuses to start (see ``PolicySettings.token_store``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEMO_USERS: dict[str, dict[str, Any]] = {
    "alice-token": {"user": "alice", "roles": ["approver"]},
    "bob-token": {"user": "bob", "roles": ["viewer"]},
}

_HASHED = re.compile(r"sha256:([0-9a-f]{64})")


@dataclass(frozen=True)
class Person:
    """An authenticated caller."""

    name: str
    roles: frozenset[str]

    def holds(self, role: str) -> bool:
        return role in self.roles


class UsersConfigError(ValueError):
    """The users configuration is malformed."""


def token_digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


class TokenStore:
    """Token digests -> people. Never holds a raw token."""

    def __init__(self, users: Mapping[str, Any]) -> None:
        if not isinstance(users, Mapping):
            raise UsersConfigError("users must be a JSON object of token -> {user, roles}")
        entries: list[tuple[bytes, Person]] = []
        seen: set[bytes] = set()
        for key, spec in users.items():
            if not isinstance(key, str) or not key:
                raise UsersConfigError("every token must be a non-empty string")
            hashed = _HASHED.fullmatch(key)
            digest = bytes.fromhex(hashed.group(1)) if hashed else token_digest(key)
            if digest in seen:
                raise UsersConfigError("the same token is configured twice")
            seen.add(digest)
            entries.append((digest, _person(spec)))
        self._entries = tuple(entries)

    @classmethod
    def from_json(cls, text: str) -> TokenStore:
        try:
            return cls(json.loads(text))
        except json.JSONDecodeError as exc:
            raise UsersConfigError(f"users configuration is not valid JSON: {exc.msg}") from None

    @classmethod
    def from_file(cls, path: Path) -> TokenStore:
        return cls.from_json(path.read_text())

    def __len__(self) -> int:
        return len(self._entries)

    def authenticate(self, token: str | None) -> Person | None:
        """The person a token belongs to, or None. Constant time in which entry matched."""
        if not token:
            return None
        presented = token_digest(token)
        found: Person | None = None
        for digest, person in self._entries:
            if hmac.compare_digest(digest, presented):
                found = person
        return found

    def authenticate_header(self, authorization: str | None) -> Person | None:
        return self.authenticate(bearer_token(authorization))


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, else None."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def _person(spec: Any) -> Person:
    if not isinstance(spec, Mapping):
        raise UsersConfigError("each token maps to an object {user, roles}")
    name = spec.get("user")
    roles = spec.get("roles", [])
    if not isinstance(name, str) or not name.strip():
        raise UsersConfigError("each user needs a non-empty name")
    if not isinstance(roles, list) or not all(isinstance(r, str) and r for r in roles):
        raise UsersConfigError(f"roles of {name} must be a list of non-empty strings")
    return Person(name=name.strip(), roles=frozenset(roles))
