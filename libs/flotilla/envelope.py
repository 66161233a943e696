"""CloudEvents envelope, Kafka protocol binding, binary mode.

The Avro value is the event data; the envelope travels as ``ce_*`` headers so that
routing, dedupe, loop budgets and tracing work without decoding the payload.
``ce_correlationid`` is the incident id, ``ce_causationid`` the id of the record that
caused this one, ``ce_hops`` the remaining hop budget and ``ce_traceparent`` a W3C
trace context.
"""

from __future__ import annotations

import re
import secrets
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from flotilla import tracing

SPEC_VERSION = "1.0"
CONTENT_TYPE = "application/avro"
DEFAULT_HOPS = 16


# What confluent-kafka hands out as a message's headers (a list of pairs, or a dict
# when produced from one), with str or bytes values.
RawHeaders = Sequence[tuple[str, str | bytes | None]] | Mapping[str, str | bytes | None] | None


def header_pairs(headers: RawHeaders) -> Iterator[tuple[str, bytes | None]]:
    """Headers as (name, bytes-or-None) pairs, whatever shape the client gave."""
    pairs = headers.items() if isinstance(headers, Mapping) else (headers or ())
    for key, value in pairs:
        yield key, value.encode() if isinstance(value, str) else value


# The CloudEvents attributes travel as headers with this prefix. Kafka lets a header name
# repeat, and clients disagree on which copy counts (the first, the last): a record with a
# repeated attribute has no one envelope, so every reader refuses it the same way
# (:func:`header_value`, :meth:`Envelope.from_headers`) instead of each picking a copy.
ATTRIBUTE_PREFIX = "ce_"


def repeated_attributes(headers: RawHeaders) -> list[str]:
    """The ``ce_*`` header names that occur more than once, in order of first repeat."""
    seen: set[str] = set()
    repeated: list[str] = []
    for name, _ in header_pairs(headers):
        if not name.startswith(ATTRIBUTE_PREFIX):
            continue
        if name in seen and name not in repeated:
            repeated.append(name)
        seen.add(name)
    return repeated


def header_value(headers: RawHeaders, name: str) -> bytes | None:
    """The value of header ``name``: None when absent, and for a CloudEvents attribute
    (``ce_*``) also when it repeats (no copy is believed); any other header's first value."""
    found: bytes | None = None
    count = 0
    for key, value in header_pairs(headers):
        if key != name:
            continue
        if not name.startswith(ATTRIBUTE_PREFIX):
            return value
        count += 1
        found = value
    return found if count == 1 else None


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def new_traceparent() -> str:
    """A fresh W3C traceparent: version 00, random trace and span ids, sampled."""
    return f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"


_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")


def child_traceparent(parent: str) -> str:
    """The same trace, parented by the span being recorded (the handler's, when tracing is
    on) or else by a new span id; a fresh trace when ``parent`` is not valid W3C."""
    match = _TRACEPARENT.fullmatch(parent)
    if not match or match.group(1) == "0" * 32:
        return new_traceparent()
    return tracing.current_traceparent(match.group(1)) or f"00-{match.group(1)}-{secrets.token_hex(8)}-{match.group(3)}"


@dataclass(frozen=True)
class Envelope:
    """The CloudEvents attributes of one record."""

    type: str
    source: str
    correlationid: str
    id: str = field(default_factory=lambda: str(uuid.uuid4()))
    time: str = field(default_factory=_now)
    causationid: str | None = None
    hops: int = DEFAULT_HOPS
    traceparent: str = field(default_factory=new_traceparent)
    specversion: str = SPEC_VERSION

    @property
    def trace_id(self) -> str | None:
        """The W3C trace id this record belongs to; None when its traceparent is not valid."""
        match = _TRACEPARENT.fullmatch(self.traceparent)
        return match.group(1) if match else None

    def caused(self, type: str, source: str, *, id: str | None = None) -> Envelope:
        """The envelope of a record this one caused: new id, causation = this id, same
        correlation, one hop fewer, a child span of this trace."""
        return Envelope(
            type=type,
            source=source,
            correlationid=self.correlationid,
            id=id or str(uuid.uuid4()),
            causationid=self.id,
            hops=self.hops - 1,
            traceparent=child_traceparent(self.traceparent),
        )

    def headers(self) -> list[tuple[str, bytes]]:
        """Kafka headers in binary mode (absent optional attributes are left out)."""
        pairs = {
            "ce_specversion": self.specversion,
            "ce_id": self.id,
            "ce_type": self.type,
            "ce_source": self.source,
            "ce_time": self.time,
            "ce_correlationid": self.correlationid,
            "ce_causationid": self.causationid,
            "ce_hops": str(self.hops),
            "ce_traceparent": self.traceparent,
            "content-type": CONTENT_TYPE,
        }
        return [(k, v.encode()) for k, v in pairs.items() if v is not None]

    @classmethod
    def from_headers(cls, headers: RawHeaders) -> Envelope:
        """Read the attributes back; raises ValueError naming a missing, bad or repeated header."""
        repeated = repeated_attributes(headers)
        if repeated:
            raise ValueError("repeated CloudEvents header(s): " + ", ".join(repeated))
        found: dict[str, str] = {}
        for key, raw in header_pairs(headers):
            if key.startswith("ce_") and raw is not None:
                found[key[3:]] = raw.decode("utf-8", errors="replace")
        missing = [k for k in ("id", "type", "source", "correlationid", "hops") if k not in found]
        if missing:
            raise ValueError("missing CloudEvents header(s): " + ", ".join(f"ce_{k}" for k in missing))
        try:
            hops = int(found["hops"])
        except ValueError:
            raise ValueError(f"ce_hops is not an integer: {found['hops']!r}") from None
        return cls(
            type=found["type"],
            source=found["source"],
            correlationid=found["correlationid"],
            id=found["id"],
            time=found.get("time", ""),
            causationid=found.get("causationid"),
            hops=hops,
            traceparent=found.get("traceparent", ""),
            specversion=found.get("specversion", SPEC_VERSION),
        )
