"""The console's sessions: kept in the console process; the browser holds only a random id.

The cookie is ``flotilla_console=<id>``, 32 random bytes in base64url and nothing else: no
token, no name, nothing to decrypt or forge. The session itself (the CSRF token, the
bearer token the console presents to the services on the person's behalf, who the policy
service said that is, one-shot flash messages and the absolute expiry) lives in a
:class:`SessionStore` in this process, keyed by the SHA-256 of the id, so the table holds
no usable cookie. Signing out deletes the session: a cookie copied before is worthless
after. An id the store does not know (signed out, expired, evicted, from before a restart
or another replica, made up) is no session at all: the visitor is anonymous.

Every visitor gets a session (anonymous until login) so that the login form carries a
CSRF token. Anyone can make anonymous sessions, so they are kept apart from signed-in
ones: each kind has its own table of fixed capacity that drops expired sessions and then
the least recently used. A flood of visitors can only push out other anonymous sessions,
never a signed-in person's; a signed-in session takes a token the policy service accepts.

Logging in starts a new session (new id, new CSRF token) and discards the anonymous one:
an id planted before login is worthless after it. The expiry is fixed at login (absolute:
using the console does not extend it). Sessions end with the process, and replicas do not
share them (docs/operations/console.md: one replica, or sticky sessions).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from cachetools import TLRUCache
from flotilla_ops.fleetapi import person_label

COOKIE_NAME = "flotilla_console"
# What secrets.token_urlsafe(32) makes: anything else is not one of our ids (and is not hashed).
_SESSION_ID = re.compile(r"[A-Za-z0-9_-]{43}")


@dataclass
class Session:
    csrf: str
    expires: float  # epoch seconds
    token: str | None = None
    flashes: list[tuple[str, str]] = field(default_factory=list)  # (level, message)
    user: str | None = None  # who the policy service said the token belongs to, at login
    roles: tuple[str, ...] = ()

    @classmethod
    def fresh(
        cls,
        lifetime_s: float,
        token: str | None = None,
        user: str | None = None,
        roles: tuple[str, ...] = (),
        *,
        now: float | None = None,
    ) -> Session:
        return cls(
            csrf=secrets.token_urlsafe(32),
            expires=(time.time() if now is None else now) + lifetime_s,
            token=token,
            user=user,
            roles=roles,
        )

    @property
    def logged_in(self) -> bool:
        return self.token is not None

    @property
    def key_id(self) -> str:
        """A short fingerprint of the token, to show which key is in use (never the token)."""
        if self.token is None:
            return "-"
        return hashlib.sha256(self.token.encode()).hexdigest()[:8]

    @property
    def who(self) -> str:
        """The signed-in person as shown in the header: name and roles, else the key's fingerprint."""
        if self.user is None:
            return f"key {self.key_id}"
        return person_label(self.user, self.roles)

    def holds(self, role: str) -> bool:
        """Whether the person held ``role`` at login (the policy service decides; this only warns)."""
        return role in self.roles

    def flash(self, level: str, message: str) -> None:
        self.flashes.append((level, message))

    def take_flashes(self) -> list[tuple[str, str]]:
        taken, self.flashes = self.flashes, []
        return taken

    def csrf_ok(self, presented: str | None) -> bool:
        return bool(presented) and hmac.compare_digest(self.csrf.encode(), (presented or "").encode())


def _key(session_id: str) -> bytes:
    return hashlib.sha256(session_id.encode("ascii")).digest()


def _expiry(_key: bytes, session: Session, _now: float) -> float:
    return session.expires


class SessionStore:
    """The console's sessions by id: bounded, expiring, safe to share between threads."""

    def __init__(self, *, capacity: int, anonymous_capacity: int, clock: Callable[[], float] = time.time) -> None:
        if capacity < 1 or anonymous_capacity < 1:
            raise ValueError("session capacities must be at least 1")
        self._clock = clock
        self._lock = threading.Lock()
        # Least recently used first out, once expired sessions are dropped (TLRU).
        self._signed_in: TLRUCache[bytes, Session] = TLRUCache(capacity, ttu=_expiry, timer=clock)
        self._anonymous: TLRUCache[bytes, Session] = TLRUCache(anonymous_capacity, ttu=_expiry, timer=clock)

    def open(self, session: Session) -> str:
        """Keep ``session`` under a new random id and return the id (the cookie's value)."""
        session_id = secrets.token_urlsafe(32)
        table = self._signed_in if session.logged_in else self._anonymous
        with self._lock:
            table[_key(session_id)] = session
        return session_id

    def get(self, session_id: str | None) -> Session | None:
        """The live session of ``session_id``, or None (missing, malformed, unknown, closed, expired)."""
        if not session_id or not _SESSION_ID.fullmatch(session_id):
            return None
        key = _key(session_id)
        with self._lock:
            for table in (self._signed_in, self._anonymous):
                found = table.get(key)
                if found is not None and found.expires > self._clock():
                    return found
        return None

    def close(self, session_id: str | None) -> None:
        """End the session of ``session_id``, whichever kind it is (a no-op for an unknown id)."""
        if not session_id or not _SESSION_ID.fullmatch(session_id):
            return
        key = _key(session_id)
        with self._lock:
            self._signed_in.pop(key, None)
            self._anonymous.pop(key, None)

    def counts(self) -> tuple[int, int]:
        """How many live sessions are kept: (signed in, anonymous)."""
        with self._lock:
            self._signed_in.expire()
            self._anonymous.expire()
            return len(self._signed_in), len(self._anonymous)
