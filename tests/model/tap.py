"""A recording tap in front of the real model server.

The fleet of this lane talks to the llama-cpp-python server through this tap, which
forwards every request as it is and keeps what went through (each request's body, the
status and body of the answer), so a test can compare the ``usage`` the server reported
with what the incident's budget counted. It answers nothing by itself: every answer is
the server's. A test may ask it to spoil the next answers the way a network or a proxy
does (an HTTP 429 or 503 in place of the server's answer, a body cut in half, an HTML
error page), which the real server never does on demand.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.parse
from collections import deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

Spoil = Literal["429", "503", "truncated", "not-json"]


@dataclass(frozen=True)
class Exchange:
    """One request through the tap and what came back."""

    request: dict[str, Any]
    status: int
    answer: dict[str, Any] | None  # the server's JSON answer (None: not JSON, or spoiled)
    spoiled: Spoil | None = None
    seconds: float = 0.0  # how long the server took
    delivered: bool = True  # False: the client had hung up (it gave up waiting), so never saw it

    @property
    def incident(self) -> str | None:
        """The incident a decision request is about (its facts name it)."""
        for message in self.request.get("messages", []):
            if message.get("role") == "user":
                try:
                    facts = json.loads(message.get("content") or "")
                except ValueError:
                    continue
                if isinstance(facts, dict) and "incidentId" in facts:
                    return str(facts["incidentId"])
        return None

    @property
    def agent(self) -> str:
        """Which agent asked: the system prompt says whose role the model plays."""
        system = str(self.request.get("messages", [{}])[0].get("content", ""))
        return "remediation" if "remediation agent" in system else "diagnostic"

    @property
    def tokens(self) -> int:
        usage = (self.answer or {}).get("usage") or {}
        return int(usage.get("prompt_tokens", 0)) + int(usage.get("completion_tokens", 0))


class ModelTap:
    """Forwards ``/v1/*`` to ``upstream`` (the model server's base URL, without /v1)."""

    def __init__(self, upstream: str, client_timeout: float | None = None) -> None:
        # How long the agents' client waits for an answer: one that comes later reaches no
        # one, so a spoil it would carry is kept for the next request instead.
        self.client_timeout = client_timeout
        parsed = urllib.parse.urlsplit(upstream.rstrip("/"))
        self.host, self.port, self.prefix = parsed.hostname or "127.0.0.1", parsed.port or 80, parsed.path
        self.exchanges: list[Exchange] = []
        self._spoils: deque[Spoil] = deque()
        # incidents the tap had heard of when the spoils were asked for: their late
        # requests (a retry, a second decision) must not take a spoil meant for the next one
        self._spared: set[str | None] = {None}
        self._pending: list[str | None] = []  # the incidents of requests being forwarded now
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, name="model-tap", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def spoil(self, *how: Spoil) -> None:
        """Spoil the next answers about an incident the tap has not seen yet, one per
        request, in order (a body is spoiled only on a 200: an error the server answered
        passes as it is). Requests that name no incident, or one seen before this call,
        pass untouched."""
        with self._lock:
            self._spoils.extend(how)
            self._spared = {None, *self._pending, *(e.incident for e in self.exchanges)}

    def in_flight(self, incident: str) -> bool:
        """Whether a request about ``incident`` waits for the server's answer right now."""
        with self._lock:
            return incident in self._pending

    def of(self, incident: str) -> list[Exchange]:
        with self._lock:
            return [e for e in self.exchanges if e.incident == incident]

    def __enter__(self) -> ModelTap:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _record(self, exchange: Exchange) -> None:
        with self._lock:
            self.exchanges.append(exchange)

    def _next_spoil(self, incident: str | None) -> Spoil | None:
        with self._lock:
            if not self._spoils or incident in self._spared:
                return None
            return self._spoils.popleft()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        tap = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                self._forward(None)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self._forward(self.rfile.read(length))

            def _forward(self, body: bytes | None) -> None:
                request = json.loads(body) if body else {}
                about = Exchange(request, 0, None).incident
                spoil = tap._next_spoil(about)
                if spoil in ("429", "503"):
                    status = int(spoil)
                    error = {"error": {"message": f"tap: {status}", "type": "tap", "code": None}}
                    tap._record(Exchange(request, status, None, spoil))
                    self._send(status, json.dumps(error).encode(), {"Retry-After": "1"})
                    return
                with tap._lock:
                    tap._pending.append(about)
                started = time.monotonic()
                # http.client, not urllib: urllib always says "Connection: close", and
                # llama-cpp-python's server may then take the request as already abandoned
                # ("Client closed request", HTTP 400) before it starts on it.
                upstream = http.client.HTTPConnection(tap.host, tap.port, timeout=600)
                try:
                    upstream.request(
                        self.command, tap.prefix + self.path, body=body, headers={"Content-Type": "application/json"}
                    )
                    response = upstream.getresponse()
                    status, raw = response.status, response.read()
                except OSError:  # the server is gone: so is the connection to the agent
                    tap._record(Exchange(request, 0, None))
                    self.close_connection = True
                    return
                finally:
                    upstream.close()
                    with tap._lock:
                        tap._pending.remove(about)
                try:
                    answer = json.loads(raw)
                except ValueError:
                    answer = None
                late = tap.client_timeout is not None and time.monotonic() - started >= tap.client_timeout
                if spoil in ("truncated", "not-json") and (status != 200 or late):
                    # spoil an answer, not the server's refusal (of a response format it
                    # does not speak, say), nor an answer the client stopped waiting for
                    # (it asks again, and that request must get the spoil): keep it for the next
                    with tap._lock:
                        tap._spoils.appendleft(spoil)
                    spoil = None
                if spoil == "truncated":
                    raw = raw[: len(raw) // 2]
                elif spoil == "not-json":
                    raw = b"<html><body>502 Bad Gateway</body></html>"
                took = time.monotonic() - started
                try:
                    self._send(status, raw, {})
                except OSError:  # BrokenPipe / reset: the client stopped waiting
                    self.close_connection = True
                    tap._record(Exchange(request, status, answer, spoil, took, delivered=False))
                    return
                tap._record(Exchange(request, status, answer, spoil, took))

            def _send(self, status: int, raw: bytes, headers: dict[str, str]) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args: Any) -> None:
                pass

        return Handler
