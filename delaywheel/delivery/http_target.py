"""An HTTP target as a client sends it, checked at ``add``.

``check_target`` turns a client's ``{"type": "http", ...}`` map into the one
the task keeps, every field present, or refuses it with ``bad_request``
naming the field. The destination must pass ``AllowList.check_url``. No
aiohttp here: the engine and the CLI import this, and the sender
(``http.py``) only the server that sends.
"""

from __future__ import annotations

import re
from typing import Any

from yarl import URL

from delaywheel.checks import bad, known_fields, number, show
from delaywheel.delivery.allow import AllowList

FIELDS = frozenset({"type", "url", "method", "headers", "timeout"})
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
DEFAULT_METHOD = "POST"
DEFAULT_TIMEOUT_S = 10.0
MIN_TIMEOUT_S, MAX_TIMEOUT_S = 0.1, 300.0
MAX_URL_CHARS = 2048  # what browsers and most servers take without trouble
# Common servers (nginx, Apache) refuse a header line over 8 KiB; 50 headers
# is far more than a callback needs, so more is a mistake.
MAX_HEADERS = 50
MAX_HEADER_VALUE_CHARS = 8192

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # RFC 9110 token
CONTROL_CHARS = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # CTLs but HTAB: never in a field value
_URL_BAD_CHARS = re.compile(r"[\x00-\x20\x7f]")  # a URL never holds spaces or CTLs
# The server sets these (framing, the connection) or they change how the
# request is made; a task cannot.
_RESERVED = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "te",
     "trailer", "upgrade", "proxy-connection", "expect"}
)  # fmt: skip
_OURS = "delaywheel-"


def check_target(value: Any, allow: AllowList) -> dict[str, Any]:
    """The HTTP target as the task keeps it; ``bad_request`` naming the field."""
    fields = known_fields("target", value, FIELDS)
    if fields.get("type") != "http":
        raise bad(f"target.type must be 'http', got {show(fields.get('type'))}")
    method = fields.get("method", DEFAULT_METHOD)
    if type(method) is not str or method.upper() not in METHODS:
        raise bad(f"target.method must be one of {', '.join(METHODS)}, got {show(method)}")
    timeout_s = fields.get("timeout", DEFAULT_TIMEOUT_S)
    return {
        "type": "http",
        "url": _check_url(fields.get("url"), allow),
        "method": method.upper(),
        "headers": _check_headers(fields.get("headers", {})),
        "timeout": number("target.timeout", timeout_s, low=MIN_TIMEOUT_S, high=MAX_TIMEOUT_S),
    }


def _check_url(value: Any, allow: AllowList) -> str:
    if value is None:
        raise bad("target has no url")
    if type(value) is not str or not value:
        raise bad(f"target.url must be an http or https URL (str), got {show(value)}")
    if len(value) > MAX_URL_CHARS:
        raise bad(f"target.url is {len(value)} characters, over {MAX_URL_CHARS}: {show(value)}")
    if _URL_BAD_CHARS.search(value):
        raise bad(f"target.url has a space or control character: {show(value)}")
    try:
        url = URL(value)
        port = url.explicit_port  # yarl checks the range only when asked
    except ValueError as exc:
        raise bad(f"target.url {show(value)} is not a URL: {exc}") from None
    if url.scheme not in ("http", "https"):
        raise bad(f"target.url must be http or https, got {show(value)}")
    if url.raw_user is not None or url.raw_password is not None:
        # Credentials in a URL end up in logs; headers (Authorization) are the place.
        raise bad(f"target.url holds credentials; send them in headers: {show(shown_url(url))}")
    if port == 0:
        raise bad(f"target.url has port 0: {show(value)}")
    try:
        allow.check_url(url)
    except ValueError as exc:
        raise bad(f"target.url {show(shown_url(url))}: {exc}") from None
    return value


def _check_headers(value: Any) -> dict[str, str]:
    if type(value) is not dict:
        raise bad(f"target.headers must be a map of str to str, got {show(value)}")
    if len(value) > MAX_HEADERS:
        raise bad(f"target.headers has {len(value)} headers, over {MAX_HEADERS}")
    seen: set[str] = set()
    for name, text in value.items():
        if type(name) is not str or not _TOKEN.fullmatch(name):
            raise bad(f"target.headers name {show(name)} is not an HTTP token")
        lowered = name.lower()
        if lowered in _RESERVED or lowered.startswith(_OURS):
            raise bad(f"target.headers cannot set {show(name)}: the server sets it")
        if lowered in seen:
            raise bad(f"target.headers has {show(name)} twice (names are case-insensitive)")
        seen.add(lowered)
        too_long = type(text) is str and len(text) > MAX_HEADER_VALUE_CHARS
        if type(text) is not str or CONTROL_CHARS.search(text) or too_long:
            raise bad(
                f"target.headers {name} must be a str of at most {MAX_HEADER_VALUE_CHARS} "
                f"characters without CR, LF or other control characters, got {show(text)}"
            )
    return dict(value)


def shown_url(url: URL) -> str:
    """The URL for a message: no query string, fragment or credentials."""
    bare = url.with_query(None).with_fragment(None)
    return str(bare.with_user(None) if bare.raw_user or bare.raw_password else bare)
