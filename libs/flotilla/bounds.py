"""How large what comes from outside may be: the bounds every intake of the fleet shares.

Nothing from outside (an HTTP body, an alert's labels, a name read from telemetry) may grow
a record past what Kafka takes: a record its producer refuses fails the member's outbox
connector on every restart (security review 3, H2). So each intake is bounded where the
input enters, and the outbox refuses what still comes out too large
(:class:`flotilla.outbox.RecordTooLargeError`), where the record is made.
"""

from __future__ import annotations

# Kafka's defaults: a producer's max.request.size (Connect's producer: the connectors set no
# override, and neither does the stack) and, about the same, the broker's message.max.bytes.
KAFKA_MAX_REQUEST_BYTES = 1024 * 1024

# What one outbox record (payload, key and headers) may weigh. A quarter below Kafka's
# limit: the record batch's own framing is small, but a dead letter carries the record
# again with error headers of its own and must still fit. The fleet's records are a few
# KiB (an incident's largest, a diagnosis with its evidence, stays far below this).
DEFAULT_MAX_RECORD_BYTES = 768 * 1024

# A request body on any HTTP API of the fleet: approvals, re-queues and the console's forms
# are small JSON documents or forms; a DLQ re-queue with a sanitized value carries one
# record (at most DEFAULT_MAX_RECORD_BYTES, as JSON a little more).
DEFAULT_MAX_BODY_BYTES = 1024 * 1024

# A Kubernetes object's name (a Deployment, a namespace is shorter still) is at most 253
# characters; so is every name the fleet copies into a record (services, environments).
NAME_MAX = 253


def name_problem(value: str) -> str | None:
    """Why ``value`` cannot be a name the fleet copies into a record, or None when it can:
    1 to NAME_MAX characters, none a control, format or line/paragraph separator
    (``str.isprintable``: a space is allowed, a newline or a zero-width joiner is not).
    The reason never repeats the value (it may be a megabyte)."""
    if not value:
        return "is empty"
    if len(value) > NAME_MAX:
        return f"is {len(value)} characters long, over the {NAME_MAX} a name may have"
    if not value.isprintable():
        return "has a control or separator character"
    return None


def shown(value: str, limit: int = 64) -> str:
    """``value`` quoted for a log line or an error message; a long one cut to its head,
    with how long it was."""
    return repr(value) if len(value) <= limit else f"{value[:limit]!r}… ({len(value)} characters)"
