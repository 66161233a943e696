"""Bearer-token authentication for operator actions.

Only SHA-256 digests of tokens are configured (``FLOTILLA_OPERATOR_TOKENS``), so the
configuration never holds a usable secret. A presented token is hashed and compared
with every configured digest in constant time. The operator's identity recorded with a
re-queue is the configured name, or ``operator-<first 12 hex of the digest>``: never a
name the caller asserts about itself.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Operator:
    name: str
    digest: str


class OperatorTokens:
    def __init__(self, entries: Iterable[str | Mapping[str, str]]) -> None:
        operators = []
        for entry in entries:
            if isinstance(entry, str):
                digest, name = entry.strip().lower(), ""
            else:
                digest, name = str(entry.get("sha256", "")).strip().lower(), str(entry.get("name", ""))
            if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
                raise ValueError("operator tokens must be lower-case hex SHA-256 digests (64 characters)")
            operators.append(Operator(name or f"operator-{digest[:12]}", digest))
        self._operators = tuple(operators)

    def authenticate(self, authorization: str | None) -> Operator | None:
        """The operator an ``Authorization: Bearer <token>`` header names, or None."""
        if not authorization:
            return None
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return None
        digest = hashlib.sha256(token.encode()).hexdigest()
        found = None
        for operator in self._operators:  # no early exit: the time does not say which matched
            if hmac.compare_digest(operator.digest, digest):
                found = operator
        return found
