"""Every HTTP API of the fleet bounds request bodies before anything reads them
(flotilla.http.BodyLimit; security review 3, L5): a declared Content-Length over the limit
is answered 413 before the app runs (authentication included), a chunked body is cut at
the limit as it streams. On a real uvicorn server, and on the sim's and console's apps."""

# No `from __future__ import annotations`: FastAPI reads the route signatures at run time.

import contextlib
import json
import socket
import time
from collections.abc import Iterator
from typing import Annotated, Any

import httpx
import pytest
from fastapi import Depends, FastAPI, Header, HTTPException, Request
from fastapi.testclient import TestClient
from flotilla_ops.fleetapi import FleetApi
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from flotilla import allow_body, create_app
from flotilla.bounds import DEFAULT_MAX_BODY_BYTES
from flotilla.http import serve_http
from flotilla.settings import ServiceSettings
from services.console.app import create_console_app
from services.console.settings import ConsoleSettings
from services.sim.app import create_sim_app

LIMIT = 1024


class Doc(BaseModel):
    text: str


class Seen:
    def __init__(self) -> None:
        self.authenticated = 0
        self.handled = 0


def app_with_routes(seen: Seen, limit: int = LIMIT) -> FastAPI:
    app = create_app("test", lambda: True, max_body_bytes=limit)

    def who(authorization: Annotated[str | None, Header()] = None) -> str:
        seen.authenticated += 1
        if authorization != "Bearer ok":
            raise HTTPException(401, "no")
        return "ok"

    @app.post("/docs")
    def post(doc: Doc, user: Annotated[str, Depends(who)]) -> dict[str, int]:
        seen.handled += 1
        return {"length": len(doc.text)}

    @app.post("/raw")
    async def raw(request: Request) -> dict[str, int]:
        data = await request.body()  # a cut body raises here: the route never gets past it
        seen.handled += 1
        return {"length": len(data)}

    @app.post("/nobody")
    def nobody() -> dict[str, str]:  # reads no body: must not run for a declared oversize
        seen.handled += 1
        return {"done": "yes"}

    allow_body(app, "/big", 4 * limit)

    @app.post("/big")
    async def big(request: Request) -> dict[str, int]:
        seen.handled += 1
        return {"length": len(await request.body())}

    return app


def body_of(n: int) -> bytes:
    """A JSON document of exactly ``n`` bytes (n >= 12)."""
    return json.dumps({"text": "x" * (n - 12)}).encode()


def chunks(data: bytes, size: int = 100) -> Iterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


@settings(max_examples=40, deadline=None)
@given(st.integers(min_value=12, max_value=3 * LIMIT), st.booleans())
def test_a_body_is_taken_exactly_when_it_fits(n: int, chunked: bool) -> None:
    seen = Seen()
    with TestClient(app_with_routes(seen)) as client:
        content: Any = chunks(body_of(n)) if chunked else body_of(n)
        answer = client.post(
            "/docs", content=content, headers={"Authorization": "Bearer ok", "Content-Type": "application/json"}
        )
    if n <= LIMIT:
        assert answer.status_code == 200 and answer.json() == {"length": n - 12}
    else:
        assert answer.status_code == 413, answer.text
        assert f"limit of {LIMIT} bytes" in answer.json()["detail"]
        assert seen.handled == 0


def test_an_oversized_declared_body_is_refused_before_authentication_or_any_route() -> None:
    seen = Seen()
    with TestClient(app_with_routes(seen)) as client:
        for path in ("/docs", "/raw", "/nobody"):
            answer = client.post(path, content=body_of(LIMIT + 1))  # no token either
            assert answer.status_code == 413 and answer.headers["content-type"] == "application/json"
            assert answer.json() == {
                "detail": f"request refused: a body of {LIMIT + 1} bytes is over this endpoint's limit of {LIMIT} bytes"
            }
        assert (seen.authenticated, seen.handled) == (0, 0)
        # the operational surface is bounded too, and works as before
        assert client.post("/healthz", content=b"x" * (LIMIT + 1)).status_code == 413
        assert client.get("/healthz").json()["status"] == "ok"
        # under the limit without a token: authentication decides
        assert client.post("/docs", content=body_of(20)).status_code == 401


def test_a_path_given_its_own_limit_takes_more_and_no_more() -> None:
    seen = Seen()
    with TestClient(app_with_routes(seen)) as client:
        assert client.post("/big", content=b"x" * (4 * LIMIT)).json() == {"length": 4 * LIMIT}
        assert client.post("/big", content=chunks(b"x" * (4 * LIMIT + 1))).status_code == 413
        assert client.post("/raw", content=b"x" * (2 * LIMIT)).status_code == 413


def test_the_default_limit_and_its_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ServiceSettings().http_max_body_bytes == DEFAULT_MAX_BODY_BYTES == 1024 * 1024
    monkeypatch.setenv("FLOTILLA_HTTP_MAX_BODY_BYTES", "4096")
    assert ServiceSettings().http_max_body_bytes == 4096
    with TestClient(create_app("test", lambda: True)) as client:
        assert client.post("/healthz", content=b"x" * (DEFAULT_MAX_BODY_BYTES + 1)).status_code == 413


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def exchange(port: int, request: bytes, host: str = "127.0.0.1") -> tuple[int, dict[str, Any]]:
    """Send ``request`` on a fresh connection; the status and JSON body of the answer (read
    until the server closes: a refusal closes the connection)."""
    with socket.create_connection((host, port), timeout=10) as conn:
        # refused before all of it was sent: the answer is still there to read
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            conn.sendall(request)
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def test_a_real_server_refuses_a_declared_or_a_streamed_oversize_and_reads_no_more() -> None:
    seen = Seen()
    port = free_port()
    server = serve_http(app_with_routes(seen), "127.0.0.1", port)
    try:
        deadline = time.monotonic() + 10
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        # a declared 100 MB body: answered at once, without one byte of it being sent
        status, body = exchange(
            port,
            b"POST /docs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000000\r\n\r\n",
        )
        assert status == 413 and "100000000 bytes" in body["detail"]
        # chunked, no length declared: cut once it passes the limit
        chunk = b"x" * 600
        stream = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(4)) + b"0\r\n\r\n"
        status, body = exchange(
            port,
            b"POST /raw HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n" + stream,
        )
        assert status == 413 and f"limit of {LIMIT} bytes" in body["detail"]
        # and what fits is served
        small = body_of(100)
        status, body = exchange(
            port,
            b"POST /raw HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(small), small),
        )
        assert (status, body) == (200, {"length": 100})
        assert seen.handled == 1
    finally:
        server.should_exit = True


def test_the_sim_and_the_console_bound_their_bodies_too() -> None:
    sim = create_sim_app(action_token="a-token-of-sixteen-chars", max_body_bytes=LIMIT)
    with TestClient(sim) as client:
        assert client.post("/faults", content=b"{" + b" " * LIMIT + b"}").status_code == 413
        assert client.post("/faults", content=chunks(b" " * (LIMIT + 1))).status_code == 413
        assert client.get("/healthz").status_code == 200
    settings = ConsoleSettings(http_max_body_bytes=LIMIT, policy_url="http://policy.test")
    api = FleetApi(settings.endpoints(), transport=httpx.MockTransport(lambda r: httpx.Response(503)))
    with TestClient(create_console_app(settings, api), follow_redirects=False) as client:
        answer = client.post("/login", content=b"token=" + b"x" * LIMIT)
        assert answer.status_code == 413 and "limit of 1024 bytes" in answer.json()["detail"]
    api.close()
