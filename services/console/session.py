"""The console's session: a small encrypted cookie, no server-side store.

The cookie is a Fernet token (AES-128-CBC, then HMAC-SHA256 over the whole token) of the
JSON payload, unpadded base64url. The Fernet key is derived from the session secret with
HKDF-SHA256 (the raw secret is never a key). The payload carries the CSRF token, the
expiry, one-shot flash messages and, once logged in, the bearer token the console
presents to the services on the person's behalf. It is encrypted as well as
authenticated, so whoever sees the cookie (a log, a proxy, a screenshot of the browser's
tools) cannot read the token; it is also sent HttpOnly, SameSite=Strict (and Secure
behind HTTPS). Whoever holds the cookie can still replay it until the session expires.

A cookie that does not decrypt (another secret, any change, an old signed-only cookie)
or whose embedded expiry has passed is no session at all: the visitor is anonymous.

Every visitor gets a session (anonymous until login) so that the login form itself
carries a CSRF token. Logging in starts a new session (new CSRF token): a session id
planted before login is worthless after it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from flotilla_ops.fleetapi import person_label

COOKIE_NAME = "flotilla_console"
# HKDF's context: a key for this purpose only, whatever else the secret is used for.
_KEY_INFO = b"flotilla-console-session.v2 fernet key"
_MAX_COOKIE = 4096  # browsers keep no more; a longer value is not one of ours


@dataclass
class Session:
    csrf: str
    expires: float
    token: str | None = None
    flashes: list[tuple[str, str]] = field(default_factory=list)  # (level, message)
    user: str | None = None  # who the policy service said the token belongs to, at login
    roles: tuple[str, ...] = ()
    modified: bool = False

    @classmethod
    def fresh(
        cls, lifetime_s: float, token: str | None = None, user: str | None = None, roles: tuple[str, ...] = ()
    ) -> Session:
        return cls(
            csrf=secrets.token_urlsafe(32),
            expires=time.time() + lifetime_s,
            token=token,
            user=user,
            roles=roles,
            modified=True,
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
        self.modified = True

    def take_flashes(self) -> list[tuple[str, str]]:
        taken, self.flashes = self.flashes, []
        if taken:
            self.modified = True
        return taken

    def csrf_ok(self, presented: str | None) -> bool:
        return bool(presented) and hmac.compare_digest(self.csrf.encode(), (presented or "").encode())

    def payload(self) -> dict[str, Any]:
        return {
            "csrf": self.csrf,
            "exp": self.expires,
            "tok": self.token,
            "usr": self.user,
            "rl": list(self.roles),
            "fl": [list(f) for f in self.flashes],
        }


def _fernet_key(secret: bytes) -> bytes:
    """The Fernet key (base64url of 32 bytes: 16 to sign, 16 to encrypt) derived from ``secret``."""
    derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_KEY_INFO).derive(secret)
    return base64.urlsafe_b64encode(derived)


class SessionCodec:
    """Encrypts and checks session cookies with a key derived from one secret."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) < 32:
            raise ValueError("the session secret must be at least 32 bytes")
        self._fernet = Fernet(_fernet_key(secret))

    def dumps(self, session: Session) -> str:
        plain = json.dumps(session.payload(), separators=(",", ":")).encode()
        # Fernet tokens are base64url; the padding is dropped so the cookie value needs no quoting.
        return self._fernet.encrypt(plain).rstrip(b"=").decode("ascii")

    def loads(self, cookie: str | None, *, now: float | None = None) -> Session | None:
        """The session in a cookie, or None when it is missing, forged, foreign, malformed or expired."""
        if not cookie or len(cookie) > _MAX_COOKIE:
            return None
        try:
            token = cookie.encode("ascii")
            plain = self._fernet.decrypt(token + b"=" * (-len(token) % 4))
            data = json.loads(plain)
            session = Session(
                csrf=str(data["csrf"]),
                expires=float(data["exp"]),
                token=None if data.get("tok") is None else str(data["tok"]),
                flashes=[(str(level), str(text)) for level, text in data.get("fl", [])],
                user=None if data.get("usr") is None else str(data["usr"]),
                roles=tuple(str(role) for role in data.get("rl", [])),
            )
        except (InvalidToken, ValueError, KeyError, TypeError):  # ValueError: bad JSON, non-ASCII too
            return None
        # The expiry is inside the encrypted payload, so it cannot be extended by the holder.
        if session.expires <= (time.time() if now is None else now):
            return None
        return session
