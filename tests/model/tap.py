"""A recording tap in front of the real model server.

The fleet of this lane talks to the llama-cpp-python server through this tap, which
forwards every request as it is (the agents' API key included) and keeps what went
through (each request's body, the status and body of the answer), so a test can compare
the ``usage`` the server reported with what the incident's budget counted.

Two things it answers by itself, never the server:

- A *spoiled* answer a test asks for (:meth:`ModelTap.spoil`): an HTTP 429 or 503, a chat
  completion cut in half, an HTML error page, the way a network or a proxy spoils one.
  Those tests are about what the fleet does with a spoiled answer, which the real server
  never gives on demand; the server is not asked at all, so they cost no model time.
- A request about an incident of an earlier test (:meth:`ModelTap.isolate`,
  :meth:`ModelTap.serve_only`): a 503, so an incident left over from one test escalates
  at once instead of holding the single-slot server while the next test waits for it.
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
    answer: dict[str, Any] | None  # the server's JSON answer (None: not JSON, spoiled, or never asked)
    spoiled: Spoil | None = None
    seconds: float = 0.0  # how long the server took
    delivered: bool = True  # False: the client had hung up (it gave up waiting), so never saw it
    stale: bool = False  # about an earlier test's incident: answered 503 by the tap, never forwarded

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
    def forwarded(self) -> bool:
        """Whether the real server was asked."""
        return self.spoiled is None and not self.stale

    @property
    def usage(self) -> tuple[int, int]:
        """(prompt, completion) tokens the server reported."""
        usage = (self.answer or {}).get("usage") or {}
        return int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))

    @property
    def tokens(self) -> int:
        return sum(self.usage)


def spoiled_body(spoil: Spoil, request: dict[str, Any]) -> tuple[int, bytes, dict[str, str]]:
    """The status, body and headers of a spoiled answer to ``request``."""
    if spoil in ("429", "503"):
        error = {"error": {"message": f"tap: {spoil}", "type": "tap", "code": None}}
        return int(spoil), json.dumps(error).encode(), {"Retry-After": "1"}
    if spoil == "not-json":
        return 200, b"<html><body>502 Bad Gateway</body></html>", {}
    # A chat completion shaped like llama-cpp-python's, cut off half way through.
    completion = {
        "id": "chatcmpl-tap",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": request.get("model", ""),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": json.dumps({"incidentId": "", "verdict": ""})},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }
    raw = json.dumps(completion).encode()
    return 200, raw[: len(raw) // 2], {}


class ModelTap:
    """Forwards ``/v1/*`` to ``upstream`` (the model server's base URL, without /v1)."""

    def __init__(self, upstream: str, upstream_timeout: float) -> None:
        # How long the tap waits for the server: about the agents' own wait, so a thread of
        # a request the agent gave up on does not linger (isolate() restarts the server
        # under any request still forwarded).
        self.upstream_timeout = upstream_timeout
        parsed = urllib.parse.urlsplit(upstream.rstrip("/"))
        self.host, self.port, self.prefix = parsed.hostname or "127.0.0.1", parsed.port or 80, parsed.path
        self.exchanges: list[Exchange] = []
        self._spoils: deque[Spoil] = deque()
        # incidents the tap had heard of when the spoils were asked for: their late
        # requests (a retry, a second decision) must not take a spoil meant for the next one
        self._spared: set[str | None] = {None}
        self._pending: list[str | None] = []  # the incidents of requests being forwarded now
        self._stale: set[str] = set()  # earlier tests' incidents
        self._only: str | None = None  # the running test's incident, once it is known
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, name="model-tap", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def spoil(self, *how: Spoil) -> None:
        """Answer the next requests about an incident the tap has not seen yet with these
        spoiled answers, one per request, in order, without asking the server. Requests
        that name no incident, or one seen before this call, pass untouched."""
        with self._lock:
            self._spoils.extend(how)
            self._spared = {None, *self._pending, *(e.incident for e in self.exchanges)}

    def isolate(self, *incidents: str) -> None:
        """A test begins: every incident seen so far (and ``incidents``, the ones the last
        test's watch saw) belongs to an earlier test, and its requests are answered 503 by
        the tap from now on. Spoils not taken are dropped."""
        with self._lock:
            self._stale.update(i for i in (*incidents, *self._pending, *(e.incident for e in self.exchanges)) if i)
            self._only = None
            self._spoils.clear()

    def serve_only(self, incident: str) -> None:
        """The running test's incident is known: requests about any other are answered 503."""
        with self._lock:
            self._only = incident

    def forwarded_now(self) -> int:
        """How many requests wait for the server's answer right now."""
        with self._lock:
            return len(self._pending)

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

    def _is_stale(self, incident: str | None) -> bool:
        with self._lock:
            if incident is None:
                return False
            return incident in self._stale or (self._only is not None and incident != self._only)

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
                if tap._is_stale(about):
                    error = {"error": {"message": "tap: an incident of an earlier test", "type": "tap", "code": None}}
                    tap._record(Exchange(request, 503, None, stale=True))
                    self._answer(503, json.dumps(error).encode(), {})
                    return
                spoil = tap._next_spoil(about)
                if spoil is not None:
                    status, raw, headers = spoiled_body(spoil, request)
                    tap._record(Exchange(request, status, None, spoil, delivered=self._answer(status, raw, headers)))
                    return
                with tap._lock:
                    tap._pending.append(about)
                started = time.monotonic()
                headers = {"Content-Type": "application/json"}
                if self.headers.get("Authorization"):  # the agents' key: the server refuses a request without it
                    headers["Authorization"] = self.headers["Authorization"]
                # http.client, not urllib: urllib always says "Connection: close", and
                # llama-cpp-python's server may then take the request as already abandoned
                # ("Client closed request", HTTP 400) before it starts on it.
                upstream = http.client.HTTPConnection(tap.host, tap.port, timeout=tap.upstream_timeout)
                try:
                    upstream.request(self.command, tap.prefix + self.path, body=body, headers=headers)
                    response = upstream.getresponse()
                    status, raw = response.status, response.read()
                except OSError:  # the server is gone (or too slow): so is the connection to the agent
                    tap._record(Exchange(request, 0, None, seconds=time.monotonic() - started, delivered=False))
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
                took = time.monotonic() - started
                tap._record(Exchange(request, status, answer, None, took, delivered=self._answer(status, raw, {})))

            def _answer(self, status: int, raw: bytes, headers: dict[str, str]) -> bool:
                """Send the answer; False when the client had stopped waiting for it."""
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(raw)))
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(raw)
                except OSError:  # BrokenPipe / reset: the client stopped waiting
                    self.close_connection = True
                    return False
                return True

            def log_message(self, *args: Any) -> None:
                pass

        return Handler
