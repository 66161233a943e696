"""The console's session: a small signed cookie, no server-side store.

The cookie holds ``base64url(JSON payload) "." base64url(HMAC-SHA256(secret, label |
payload))``. The payload carries the CSRF token, the expiry, one-shot flash messages
and, once logged in, the bearer token the console presents to the services on the
person's behalf. It is signed, not encrypted: it is sent HttpOnly, SameSite=Strict
(and Secure behind HTTPS), so page scripts and other sites never see it, but whoever
holds the cookie holds the token until the session expires.

Every visitor gets a session (anonymous until login) so that the login form itself
carries a CSRF token. Logging in starts a new session (new CSRF token): a session id
planted before login is worthless after it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

COOKIE_NAME = "flotilla_console"
_LABEL = b"flotilla-console-session.v1."


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass
class Session:
    csrf: str
    expires: float
    token: str | None = None
    flashes: list[tuple[str, str]] = field(default_factory=list)  # (level, message)
    modified: bool = False

    @classmethod
    def fresh(cls, lifetime_s: float, token: str | None = None) -> Session:
        return cls(csrf=secrets.token_urlsafe(32), expires=time.time() + lifetime_s, token=token, modified=True)

    @property
    def logged_in(self) -> bool:
        return self.token is not None

    @property
    def key_id(self) -> str:
        """A short fingerprint of the token, to show which key is in use (never the token)."""
        if self.token is None:
            return "-"
        return hashlib.sha256(self.token.encode()).hexdigest()[:8]

    def flash(self, level: str, message: str) -> None:
        self.flashes.append((level, message))
        self.modified = True

    def take_flashes(self) -> list[tuple[str, str]]:
        taken, self.flashes = self.flashes, []
        if taken:
            self.modified = True
        return taken

    def csrf_ok(self, presented: str | None) -> bool:
        return bool(presented) and hmac.compare_digest(self.csrf.encode(), (presented or "").encode())

    def payload(self) -> dict[str, Any]:
        return {"csrf": self.csrf, "exp": self.expires, "tok": self.token, "fl": [list(f) for f in self.flashes]}


class SessionCodec:
    """Signs and checks session cookies with one secret."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) < 32:
            raise ValueError("the session secret must be at least 32 bytes")
        self._key = secret

    def _mac(self, body: str) -> bytes:
        return hmac.new(self._key, _LABEL + body.encode("ascii"), hashlib.sha256).digest()

    def dumps(self, session: Session) -> str:
        body = _b64(json.dumps(session.payload(), separators=(",", ":")).encode())
        return f"{body}.{_b64(self._mac(body))}"

    def loads(self, cookie: str | None, *, now: float | None = None) -> Session | None:
        """The session in a cookie, or None when it is missing, forged, malformed or expired."""
        if not cookie or cookie.count(".") != 1:
            return None
        body, mac = cookie.split(".")
        try:
            if not hmac.compare_digest(self._mac(body), _unb64(mac)):
                return None
            data = json.loads(_unb64(body))
            session = Session(
                csrf=str(data["csrf"]),
                expires=float(data["exp"]),
                token=None if data.get("tok") is None else str(data["tok"]),
                flashes=[(str(level), str(text)) for level, text in data.get("fl", [])],
            )
        except (ValueError, KeyError, TypeError, binascii.Error, UnicodeError):
            return None
        if session.expires <= (time.time() if now is None else now):
            return None
        return session
