"""Memory as Kubernetes writes it: quantities (``512Mi``, ``1.5Gi``, ``1e9``) and bytes.

The commands carry bytes (``RaiseMemoryLimit``); the API server takes and answers quantities.
"""

from __future__ import annotations

import re
from decimal import ROUND_CEILING, Decimal, InvalidOperation

__all__ = ["MAX_BYTES", "format_bytes", "parse_bytes"]

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL: dict[str, Decimal] = {
    "m": Decimal("0.001"),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
}
# The exponent first: "1E3" is a thousand, "1E" an exa.
_QUANTITY = re.compile(
    r"^(?P<number>\+?(?:\d+(?:\.\d*)?|\.\d+))(?P<suffix>[eE][+-]?\d{1,3}|Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$"
)
MAX_BYTES = 2**63 - 1  # the API server's int64


def parse_bytes(text: str) -> int:
    """The bytes a memory quantity (``"512Mi"``, ``"1.5Gi"``, ``"1e9"``) stands for;
    ValueError when it is not a non-negative quantity. A fraction of a byte is rounded
    up, as the API server's ``Quantity.Value()`` does: a limit is never read as lower."""
    found = _QUANTITY.match(text.strip()) if isinstance(text, str) else None
    if found is None:
        raise ValueError(f"{text!r} is not a Kubernetes quantity")
    try:
        number = Decimal(found["number"])
    except InvalidOperation:
        raise ValueError(f"{text!r} is not a Kubernetes quantity") from None
    suffix = found["suffix"] or ""
    if suffix in _BINARY:
        value = number * _BINARY[suffix]
    elif suffix in _DECIMAL:
        value = number * _DECIMAL[suffix]
    elif suffix:
        value = number.scaleb(int(suffix[1:]))
    else:
        value = number
    whole = int(value.to_integral_value(rounding=ROUND_CEILING))
    if whole > MAX_BYTES:
        raise ValueError(f"{text!r} is out of range")
    return whole


def format_bytes(count: int) -> str:
    """The shortest exact quantity for ``count`` bytes: ``"512Mi"``, ``"1G"``, ``"1000"``;
    a binary suffix on a tie (memory is sized in them)."""
    if count < 0:
        raise ValueError(f"a byte count is not negative: {count}")
    units = [*_BINARY.items(), *((s, int(u)) for s, u in _DECIMAL.items() if s != "m")]
    exact = [f"{count // unit}{suffix}" for suffix, unit in units if count and count % unit == 0]
    return min(exact, key=len, default=str(count))
