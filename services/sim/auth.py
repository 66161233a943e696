"""Who may act on the sim: the executor, by a token the two share.

The sim is the fleet's simulated production, so its action API (``POST /actions/{action}``,
and ``GET /actions/{key}``, which reads the ledger of what was done) is for the
executor alone: every call carries ``Authorization: Bearer <token>`` with the token both
are configured with (``FLOTILLA_SIM_ACTION_TOKEN``). Only a SHA-256 digest of it is
kept, and a presented token is hashed and compared with ``hmac.compare_digest``, so
neither the time taken nor an early exit tells how much of a guess was right, nor how
long the token is.
"""

from __future__ import annotations

import hashlib
import hmac

MIN_LENGTH = 16  # characters; the local fleet generates 43 (32 random bytes, URL-safe base64)


def check_action_token(token: str) -> str:
    """``token`` if it can be the action token; ValueError saying why not."""
    if len(token) < MIN_LENGTH:
        raise ValueError(f"the sim's action token must be at least {MIN_LENGTH} characters, got {len(token)}")
    if token != token.strip() or any(c.isspace() for c in token):
        raise ValueError("the sim's action token must not contain whitespace (it travels in an Authorization header)")
    return token


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


class ActionToken:
    """The configured token, as a digest; answers whether a presented one is it."""

    def __init__(self, token: str) -> None:
        self._digest = _digest(check_action_token(token))

    def admits(self, presented: str | None) -> bool:
        return presented is not None and hmac.compare_digest(_digest(presented), self._digest)

    def __repr__(self) -> str:
        return "ActionToken(<secret>)"
