"""Calls to a real server's HTTP API (/v1), with the standard library's http.client.

``api_url(proc)`` reads the API's address from the server's log line (``http api on
URL``, as the listening line gives the protocol's port); ``Api`` keeps one keep-alive
connection and answers ``Reply``s: the status, the headers and the JSON (or None).
"""

from __future__ import annotations

import http.client
import json
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

from serverproc import ServerProcess

API_LINE = re.compile(r"http api on (\S+)")


def api_url(proc: ServerProcess) -> str:
    """The API's base URL (``http://HOST:PORT/v1``), from the running process's log."""
    urls = [m.group(1) for line in proc.log if (m := API_LINE.search(line))]
    assert urls, "no 'http api on' line:\n" + proc.log_text()
    return urls[-1]


@dataclass
class Reply:
    status: int
    headers: dict[str, str]  # lower-cased names
    data: Any  # the JSON body, or None (no body, or not JSON)
    text: str


class Api:
    def __init__(self, base_url: str, token: str | None = None, timeout_s: float = 30.0) -> None:
        parts = urlsplit(base_url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.prefix = parts.path.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s
        self._conn: http.client.HTTPConnection | None = None

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
        token: str | None = None,
    ) -> Reply:
        """``method`` on ``prefix + path``; ``body`` is sent as JSON, ``raw`` as it is."""
        sent = dict(headers or {})
        given = token if token is not None else self.token
        if given is not None:
            sent.setdefault("Authorization", f"Bearer {given}")
        payload = raw
        if body is not None:
            payload = json.dumps(body).encode()
            sent.setdefault("Content-Type", "application/json")
        if self._conn is None:
            self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        try:
            self._conn.request(method, self.prefix + path, body=payload, headers=sent)
            response = self._conn.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException):
            self.close()
            raise
        if response.getheader("Connection", "").lower() == "close":
            self.close()
        text = data.decode(errors="replace")
        try:
            parsed = json.loads(data) if data else None
        except ValueError:
            parsed = None
        return Reply(
            response.status, {k.lower(): v for k, v in response.getheaders()}, parsed, text
        )

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def segment(text: str) -> str:
    """An id or topic as one path segment (a slash in it too)."""
    return quote(text, safe="")


def call_once(base_url: str, method: str, path: str, body: Any = None, **kw: Any) -> Reply:
    """One request on a connection of its own, closed after it."""
    calls = Api(base_url, kw.pop("token", None))
    try:
        return calls.request(method, path, body, **kw)
    finally:
        calls.close()
