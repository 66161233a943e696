"""How each kind of OpenAI-compatible server wants to be asked for a JSON answer.

"OpenAI-compatible" servers agree on the chat-completions request but not on
``response_format``, the part that constrains an answer to a schema:

- ``json_schema``: ``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}``.
  OpenAI, vLLM, llama.cpp's own ``llama-server`` (recent builds), LM Studio. Older
  llama-server builds refuse it with 400/500 "response_format type must be one of ...".
- ``json_object_schema``: ``{"type": "json_object", "schema": {...}}``. llama-cpp-python's
  server (0.3.x), which refuses ``json_schema`` with an HTTP 500 and turns this form's schema
  into a grammar, so the answer still follows the schema.
- ``json_object``: ``{"type": "json_object"}`` alone, with the schema in the prompt: any
  server with a JSON mode and no schema support. Nothing but the validation holds the model
  to the schema then.

Ollama's OpenAI endpoint accepts every form without refusing (it ignores what it does not
know), so ``auto`` settles on ``json_schema`` there. Whatever the dialect, every answer is
validated before it is believed (:mod:`flotilla_reasoning.decision`).
"""

from __future__ import annotations

from typing import Any, Literal

import openai

Dialect = Literal["json_schema", "json_object_schema", "json_object"]
DialectChoice = Literal["auto", "json_schema", "json_object_schema", "json_object"]

# ``auto`` tries these in order until the server accepts one: the most constraining first.
AUTO_ORDER: tuple[Dialect, ...] = ("json_schema", "json_object_schema", "json_object")

# The statuses servers answer an unsupported response_format with: OpenAI-style validation
# (400), FastAPI/pydantic validation (422), and llama-cpp-python, whose request validation
# error surfaces as an internal error (500) that quotes the validation message.
REFUSAL_STATUSES = frozenset({400, 422, 500})
# What a refusal of the format names: the field, or the form it refused. An error that
# names neither (a transient 500, an overloaded server, a proxy's page) is not one.
REFUSAL_WORDS = ("response_format", "json_schema")


def response_format(dialect: Dialect, name: str, schema: dict[str, Any]) -> dict[str, Any]:
    """The ``response_format`` of a request for an answer matching ``schema``."""
    if dialect == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}
    if dialect == "json_object_schema":
        return {"type": "json_object", "schema": enums_alone(schema)}
    return {"type": "json_object"}


def enums_alone(schema: Any) -> Any:
    """``schema`` with ``type`` dropped wherever ``enum`` is given. Strict structured output
    wants both on a nullable enum (``"type": ["string", "null"]``), but llama.cpp's
    schema-to-grammar converter reads ``type`` first and then lets any string through;
    the enum alone (its values include null) is held to exactly those values."""
    if isinstance(schema, dict):
        out = {key: enums_alone(value) for key, value in schema.items()}
        if "enum" in out:
            out.pop("type", None)
        return out
    if isinstance(schema, list):
        return [enums_alone(item) for item in schema]
    return schema


def format_refused(error: openai.APIStatusError) -> bool:
    """Whether ``error`` says the server does not take the request's response format (so
    the next dialect is worth a try): a 400, 422 or 500 whose message names
    ``response_format`` or ``json_schema``. A 500 that names neither is the server failing,
    not refusing: taken for a refusal before the first answer, it would settle ``auto`` for
    good on a weaker form (down to ``json_object``, the schema only in the prompt)."""
    if error.status_code not in REFUSAL_STATUSES:
        return False
    text = f"{error.message} {error.body}".lower()
    return any(word in text for word in REFUSAL_WORDS)
