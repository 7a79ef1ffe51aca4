"""Checks of untrusted values that every layer makes, and the error they raise.

Each failure is a ``RequestError`` (``bad_request``) whose message names the
field and shows the offending value, bounded. The engine's request checks
(``delaywheel.engine.validate``), the delivery targets and the network layer
all use these, so they sit below all three.
"""

from __future__ import annotations

import math
from typing import Any

from delaywheel.errors import RequestError


def bad(message: str) -> RequestError:
    return RequestError("bad_request", message)


def show(value: Any) -> str:
    """A value for an error message, bounded so a huge input stays readable."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def number(field: str, value: Any, *, low: float = 0.0, high: float = math.inf) -> float:
    if type(value) not in (int, float) or not math.isfinite(value) or not low <= value <= high:
        span = f">= {low:g}" if high == math.inf else f"from {low:g} to {high:g}"
        raise bad(f"{field} must be a number {span}, got {show(value)}")
    return float(value)


def known_fields(what: str, value: Any, allowed: frozenset[str]) -> dict[str, Any]:
    if type(value) is not dict:
        raise bad(f"{what} must be a map, got {show(value)}")
    if not allowed.issuperset(value):
        unknown = [key for key in value if key not in allowed]
        names = ", ".join(sorted(allowed))
        raise bad(f"{what} has unknown field {show(unknown[0])}; allowed: {names}")
    return value
