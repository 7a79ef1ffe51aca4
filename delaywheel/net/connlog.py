"""What a connection logs: why the server closed it, and an internal error.

A refusal's line names the peer and the reason, never what the peer sent:
the reasons quote the input (``checks.show``, the codec's descriptions),
and whatever a peer sends (a task body, a token, garbage) must not reach
the log. The logger's name, ``delaywheel.connection``, is documented
(docs/operations.md): every part of a connection logs through this one.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from delaywheel_client.protocol import Encoder

log = logging.getLogger("delaywheel.connection")  # pinned: its name is documented

# A refusal's reason as logged: at most this long.
MAX_LOGGED_REASON_CHARS = 200


def log_refusal(transport: asyncio.BaseTransport | None, code: str, message: str) -> None:
    """The line for a connection the server closes: bad input or over a limit."""
    peer, reason = peer_name(transport), loggable(message)
    log.info(
        "closing connection from %s: %s: %s",
        *(peer, code, reason),
        extra={"peer": peer, "code": code, "reason": reason},
    )


def internal_error(encoder: Encoder, msgid: int, method: str, exc: Exception) -> bytes:
    """Log a request's unexpected failure; its ``internal`` error reply."""
    log.exception("internal error in %s", method, exc_info=exc)
    return encoder.error_response(msgid, "internal", f"internal error in {method}: {exc!r}")


def loggable(message: str) -> str:
    """A refusal's reason without what it quotes of the input (``checks.show``,
    the codec's descriptions: up to 40-80 characters of a str or bin the peer
    sent). The peer is told; the log is not, so whatever a peer sends (a task
    body, a token, garbage) never reaches it."""
    quotes = [i for i in (message.find("'"), message.find('"')) if i >= 0]
    if quotes:
        kept = message[: min(quotes)]
        kept = kept[:-1] if kept.endswith(" b") else kept  # a bin's repr: b'...'
        message = kept.rstrip() + " [input not logged]"
    if len(message) > MAX_LOGGED_REASON_CHARS:
        message = message[: MAX_LOGGED_REASON_CHARS - 3] + "..."
    return message


def peer_name(transport: asyncio.BaseTransport | None) -> str:
    """The peer's address as HOST:PORT ([HOST]:PORT for IPv6), or "unknown"."""
    name = None if transport is None else transport.get_extra_info("peername")
    if not isinstance(name, tuple) or len(name) < 2:
        return "unknown" if not name else str(name)  # a Unix socket's path
    host, port = name[0], name[1]
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
