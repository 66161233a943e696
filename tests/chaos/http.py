"""HTTP to fleet members that may be down right now: retried until they answer."""

from __future__ import annotations

import time
import urllib.error
from typing import Any

from tests.e2e.fleet import HttpError, http


def call(
    method: str,
    address: str,
    body: object | None = None,
    token: str | None = None,
    patience: float = 60,
    timeout: float = 15,
) -> Any:
    """``tests.e2e.fleet.http``, but a refused connection, a timeout or a 502/503 (a
    member restarting) is retried for ``patience`` seconds; any other error status
    raises :class:`HttpError` at once (the member was up and said no)."""
    deadline = time.monotonic() + patience
    while True:
        try:
            return http(method, address, body, token, timeout)
        except HttpError as exc:
            if exc.status not in (502, 503) or time.monotonic() >= deadline:
                raise
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            if time.monotonic() >= deadline:
                raise
        time.sleep(0.5)
