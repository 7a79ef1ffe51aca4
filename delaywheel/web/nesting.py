"""Bodies as the dashboard shows them: any depth the protocol accepts, collapsed past a depth.

The protocol accepts a body nested 1,024 levels deep (MessagePack's own
limit), deeper than ``json.dumps`` can encode on CPython's default recursion
limit: such a task made its page, every ``/tasks`` page listing it and
``/api/tasks`` answer 500. So a body is copied, down to ``MAX_SHOWN_DEPTH``
levels, before it is encoded; a container deeper than that is replaced by
``COLLAPSED``. The copy also turns what JSON cannot carry into what it can: a
bin nested in the body into ``{"bytes_hex": ...}``, an ext type into its
``repr``. The copy recurses at most ``MAX_SHOWN_DEPTH`` frames.
"""

from __future__ import annotations

from typing import Any

# Deep enough for any body a person reads; shallow enough for json.dumps and
# for the recursion here, far below the interpreter's limit of 1,000 frames.
MAX_SHOWN_DEPTH = 64
COLLAPSED = "[nested deeper than 64 levels: not shown]"
_SCALARS = (str, int, float, bool, type(None))


def shown(body: Any, depth: int = 0) -> Any:
    """``body`` as JSON can encode it, containers past ``MAX_SHOWN_DEPTH`` collapsed."""
    if isinstance(body, _SCALARS):
        return body
    if isinstance(body, (list, tuple)):
        if depth >= MAX_SHOWN_DEPTH:
            return COLLAPSED
        return [shown(item, depth + 1) for item in body]
    if isinstance(body, dict):
        if depth >= MAX_SHOWN_DEPTH:
            return COLLAPSED
        return {_key(key): shown(value, depth + 1) for key, value in body.items()}
    if isinstance(body, (bytes, bytearray)):
        return {"bytes_hex": bytes(body).hex()}
    return repr(body)  # an ext type, a timestamp


def _key(key: Any) -> Any:
    """A map key JSON can carry (it turns numbers and booleans into strings itself)."""
    return key if isinstance(key, _SCALARS) else repr(key)
