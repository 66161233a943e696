"""Bearer tokens configured by their digests: the fleet's one scheme for callers that
are named by a token (DLQ operators, Alertmanager delivering alerts).

Only SHA-256 digests are configured (a JSON list of lower-case hex digests, or
``{"name", "sha256"}`` entries), so the configuration never holds a usable secret. A
presented token is hashed and compared with every configured digest in constant time.
The caller's identity is the configured name, or ``<kind>-<first 12 hex of the digest>``:
never a name the caller asserts about itself.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# The demo's alert-sender token (docker compose's demo profile): its digest stands in for
# an unset FLOTILLA_ALERT_TOKENS in the demo profile only, like the demo operator token.
DEMO_ALERT_TOKEN = "alertmanager-demo-token"
DEMO_ALERT_TOKEN_DIGEST = hashlib.sha256(DEMO_ALERT_TOKEN.encode()).hexdigest()


@dataclass(frozen=True)
class Bearer:
    """Who a token belongs to."""

    name: str
    digest: str


def token_digest(token: str) -> str:
    """What a configuration holds for ``token``."""
    return hashlib.sha256(token.encode()).hexdigest()


class BearerTokens:
    def __init__(self, entries: Iterable[str | Mapping[str, str]], *, kind: str = "operator") -> None:
        holders = []
        for entry in entries:
            if isinstance(entry, str):
                digest, name = entry.strip().lower(), ""
            else:
                digest, name = str(entry.get("sha256", "")).strip().lower(), str(entry.get("name", ""))
            if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
                raise ValueError(f"{kind} tokens must be lower-case hex SHA-256 digests (64 characters)")
            holders.append(Bearer(name or f"{kind.replace(' ', '-')}-{digest[:12]}", digest))
        self._holders = tuple(holders)

    def __len__(self) -> int:
        return len(self._holders)

    def authenticate(self, authorization: str | None) -> Bearer | None:
        """Whom an ``Authorization: Bearer <token>`` header names, or None."""
        if not authorization:
            return None
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return None
        digest = token_digest(token)
        found = None
        for holder in self._holders:  # no early exit: the time does not say which matched
            if hmac.compare_digest(holder.digest, digest):
                found = holder
        return found
