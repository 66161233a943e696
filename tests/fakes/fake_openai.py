"""A fake OpenAI-compatible model server for tests: real HTTP, scripted answers.

``FakeOpenAI`` serves ``POST /v1/chat/completions`` from a FastAPI app run by uvicorn on a
thread, on a free loopback port. Tests queue the answers the "model" gives, one per
request — good JSON, malformed JSON, a hallucinated field, a missing id — each with its
token usage, and read back every request the client sent (the body as JSON and the
Authorization header). An empty queue answers 503, so a test that asks more often than
it scripted fails loudly.

``ThreadedServer`` is the generic part (any ASGI app on a thread), reused by tests for
other fakes such as the sim.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response


class ThreadedServer:
    """An ASGI app served by uvicorn on a daemon thread, on a free 127.0.0.1 port."""

    def __init__(self, app: Any) -> None:
        self._app = app
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 10.0) -> ThreadedServer:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))  # the kernel picks the port: no race with other tests
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self._app, log_level="warning", lifespan="off", access_log=False)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name=f"fake-http-{self.port}", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"fake server on port {self.port} did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> ThreadedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass(frozen=True)
class Answer:
    """One scripted model answer: the message content and what it cost."""

    content: str | None
    prompt_tokens: int = 120
    completion_tokens: int = 40
    refusal: str | None = None
    finish_reason: str = "stop"
    status: int = 200  # anything else: an error response (the client raises)
    raw: bytes | None = None  # sent as the body instead of a completion (a garbled answer)
    media_type: str = "application/json"


def answer(value: Answer | str | dict[str, Any], **usage: int) -> Answer:
    """An Answer from a JSON-able dict (dumped), raw text (as is) or an Answer."""
    if isinstance(value, Answer):
        return value
    content = value if isinstance(value, str) else json.dumps(value)
    return Answer(content, **usage)


class FakeOpenAI:
    """The fake model server. Use as a context manager, or start()/stop()."""

    def __init__(self, model: str = "fake-model-1") -> None:
        self.model = model
        self._answers: deque[Answer] = deque()
        self._lock = threading.Lock()
        self.requests: list[dict[str, Any]] = []
        self.authorizations: list[str | None] = []
        self._count = 0
        self._server = ThreadedServer(self._app())

    # ------------------------------------------------------------ scripting

    def script(self, *answers: Answer | str | dict[str, Any]) -> FakeOpenAI:
        """Queue answers, given in order to the next requests."""
        with self._lock:
            self._answers.extend(answer(a) for a in answers)
        return self

    def reset(self) -> None:
        with self._lock:
            self._answers.clear()
            self.requests.clear()
            self.authorizations.clear()

    @property
    def remaining(self) -> int:
        return len(self._answers)

    @property
    def base_url(self) -> str:
        return f"{self._server.url}/v1"

    def messages(self, index: int = -1) -> list[dict[str, Any]]:
        """The messages of one recorded request (the last by default)."""
        return list(self.requests[index]["messages"])

    # ------------------------------------------------------------ lifecycle

    def start(self) -> FakeOpenAI:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()

    def __enter__(self) -> FakeOpenAI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---------------------------------------------------------------- serving

    def _next(self, body: dict[str, Any], authorization: str | None) -> tuple[int, Answer | None]:
        with self._lock:
            self.requests.append(body)
            self.authorizations.append(authorization)
            self._count += 1
            if not self._answers:
                return self._count, None
            return self._count, self._answers.popleft()

    def _app(self) -> FastAPI:
        app = FastAPI(title="fake-openai", docs_url=None, redoc_url=None)

        @app.post("/v1/chat/completions")
        async def completions(request: Request) -> Response:
            body = await request.json()
            number, scripted = self._next(body, request.headers.get("authorization"))
            if scripted is None:
                return _error(503, "fake-openai: no scripted answer left")
            if scripted.raw is not None:
                return Response(scripted.raw, status_code=scripted.status, media_type=scripted.media_type)
            if scripted.status != 200:  # the content, if any, is the error's message
                return _error(scripted.status, scripted.content or f"fake-openai: scripted status {scripted.status}")
            return JSONResponse(
                {
                    "id": f"chatcmpl-fake-{number}",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": body.get("model") or self.model,
                    "choices": [
                        {
                            "index": 0,
                            "message": {
                                "role": "assistant",
                                "content": scripted.content,
                                "refusal": scripted.refusal,
                            },
                            "finish_reason": scripted.finish_reason,
                            "logprobs": None,
                        }
                    ],
                    "usage": {
                        "prompt_tokens": scripted.prompt_tokens,
                        "completion_tokens": scripted.completion_tokens,
                        "total_tokens": scripted.prompt_tokens + scripted.completion_tokens,
                    },
                }
            )

        return app


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "fake_error", "code": None}}, status_code=status)


# ------------------------------------------------------- answers to script


def diagnosis_answer(
    incident_id: str,
    *,
    service: str = "checkout-api",
    dependency: str | None = "payments-api",
    confidence: float = 0.86,
    **overrides: Any,
) -> dict[str, Any]:
    """A well-formed dependency-failure diagnosis (override any field)."""
    return {
        "incidentId": incident_id,
        "service": service,
        "verdict": "dependency-failure",
        "suspectedDependency": dependency,
        "failureMode": "slow-responses",
        "causeCategory": None,
        "jobKind": None,
        "summary": f"{dependency} is 8x slower than normal and {service}'s pool waits on it.",
        "confidence": confidence,
        "evidence": [
            {
                "kind": "dependency-health",
                "source": f"sim: p95 of {service} -> {dependency}",
                "description": f"{dependency} answers in 280 ms against a normal 35 ms",
                "observedValue": "280 ms",
            }
        ],
        **overrides,
    }


def proposal_answer(
    incident_id: str,
    diagnosis_event_id: str,
    *,
    service: str = "checkout-api",
    environment: str = "production",
    replicas: int = 12,
    confidence: float = 0.8,
    **overrides: Any,
) -> dict[str, Any]:
    """A well-formed one-step scale plan (override any field)."""
    return {
        "incidentId": incident_id,
        "diagnosisEventId": diagnosis_event_id,
        "steps": [
            {
                "action": "scale",
                "service": service,
                "environment": environment,
                "replicas": replicas,
                "rolling": None,
                "toRevision": None,
                "dependency": None,
                "toTarget": None,
            }
        ],
        "summary": f"Scale {service} to {replicas} replicas to restore its pool capacity.",
        "confidence": confidence,
        "evidence": [],
        **overrides,
    }


MALFORMED = '{"incidentId": "incident-1", "verdict": "dependency-fail'  # cut off mid-string


def hallucinated(value: dict[str, Any], name: str = "rootCauseTicket", extra: Any = "OPS-1234") -> dict[str, Any]:
    """The answer with a field the schema does not have."""
    return {**value, name: extra}


def missing(value: dict[str, Any], name: str = "incidentId") -> dict[str, Any]:
    """The answer without one of its fields (an id by default)."""
    return {k: v for k, v in value.items() if k != name}
