"""The HTTP sender (the target map is checked at ``add`` by ``http_target``).

``HttpSender`` makes the requests. How it works, and what it assumes:

- One ``aiohttp.ClientSession`` for every delivery, created at the first
  send (it must be made inside the running loop), so connections to a
  receiver are reused. A semaphore bounds the requests in flight to
  ``concurrency``; deliveries over it wait for a slot, and a target's
  ``timeout`` (aiohttp's total timeout: connect, send, answer) starts only
  once it has one, since the wait is our backlog, not the receiver's.
- The destination is checked again at every attempt. For a host name, the
  session's resolver (``_resolver.CheckedResolver``) drops every address the
  allow list refuses, so the connection is only ever made to a checked
  address, whatever DNS says this time (DNS rebinding). aiohttp calls no
  resolver for an IP-literal host, so ``send`` checks the URL itself first
  (``check_url`` decides an IP literal fully). The list may have changed
  since ``add``: the server may have restarted with other settings.
- No proxy from the environment (``trust_env=False``): the connection would
  go to the proxy and the address check would mean nothing. No cookies kept
  (``DummyCookieJar``): one receiver's cookies must not reach another.
- Redirects are not followed: a 3xx is a failed attempt like any non-2xx
  (following one would also be a way around the allow list).
- The body goes out with every method but GET: a GET with content has no
  defined meaning (RFC 9110, 9.3.1) and some servers and proxies refuse it.
  A GET carries no Content-Type, and its signature covers the empty body.
  A task's own ``Content-Type`` header wins over the body's default one;
  a schedule's occurrence gets ``Idempotency-Key`` = its id over a
  template's own (docs/delivery.md lists every header the server sets).
- The status decides the attempt. The answer's body is then read up to
  ``DRAIN_BYTES`` (or the task's ``result_bytes``, if more), so that the
  connection goes back to the pool; a longer, failing or stalling one only
  costs its connection. Its first ``result_bytes`` are the task's result
  (``{"status", "body"}``: text when UTF-8, else bytes) when the task is kept
  once done; otherwise the body is discarded.
- ``send`` raises ``DeliveryFailed`` for every failure, with a message that
  shows the URL without its query string (which may hold a token).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time
from typing import Any

import aiohttp
from multidict import CIMultiDict
from yarl import URL

from delaywheel import __version__
from delaywheel.delivery import body
from delaywheel.delivery._resolver import CheckedResolver, DestinationRefused
from delaywheel.delivery.allow import AllowList
from delaywheel.delivery.base import (
    Answer,
    Delivery,
    DeliveryFailed,
    header_value,
    occurrence_headers,
)
from delaywheel.delivery.http_target import shown_url

DEFAULT_CONCURRENCY = 64
DRAIN_BYTES = 64 * 1024  # read to reuse the connection; past this, closing it is cheaper


def signature(secret: bytes, payload: bytes, t_s: int) -> str:
    """``Delaywheel-Signature``: HMAC-SHA256 over ``"<t>."`` and the raw body."""
    mac = hmac.new(secret, f"{t_s}.".encode() + payload, hashlib.sha256).hexdigest()
    return f"t={t_s},v1={mac}"


class HttpSender:
    """Delivers to HTTP targets (``base.Sender``)."""

    def __init__(
        self,
        allow: AllowList,
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        signing_secret: str | bytes | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self._allow = allow
        self._concurrency = concurrency
        if isinstance(signing_secret, str):
            signing_secret = signing_secret.encode()
        self._secret = signing_secret
        self._slots = asyncio.Semaphore(concurrency)
        self._waiting = 0
        self._in_flight = 0
        self._session: aiohttp.ClientSession | None = None
        self._resolver: CheckedResolver | None = None
        self._closed = False

    def state(self) -> dict[str, Any]:
        return {
            "in_flight": self._in_flight,
            "waiting": self._waiting,
            "concurrency": self._concurrency,
        }

    async def close(self) -> None:
        self._closed = True
        session, self._session = self._session, None
        if session is not None:
            await session.close()
        if self._resolver is not None:
            await self._resolver.close()  # the connector closes only a resolver it made

    async def send(self, delivery: Delivery) -> Answer:
        url, method, headers, payload = self._request(delivery)
        self._waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self._waiting -= 1
        self._in_flight += 1
        try:
            now_s = time.time()  # once it has a slot: when it goes
            if delivery.occurrence is not None:
                headers.update(occurrence_headers(delivery.occurrence, now_s))
            if self._secret is not None:
                signed = signature(self._secret, payload or b"", int(now_s))
                headers["Delaywheel-Signature"] = signed
            timeout_s = float(delivery.target["timeout"])
            return await self._attempt(
                method, url, headers, payload, timeout_s, delivery.result_bytes
            )
        finally:
            self._in_flight -= 1
            self._slots.release()

    def _request(self, delivery: Delivery) -> tuple[URL, str, CIMultiDict[str], bytes | None]:
        target = delivery.target
        try:
            url = URL(target["url"])
        except ValueError as exc:
            raise DeliveryFailed(f"the target's url is not a URL: {exc}") from None
        try:
            # An IP literal never reaches the resolver: this is its check at the attempt.
            self._allow.check_url(url)
        except ValueError as exc:
            raise DeliveryFailed(f"refused {shown_url(url)}: {exc}") from None
        try:
            payload, content_type = body.encode(delivery.body_packed)
        except (TypeError, ValueError) as exc:  # checked at add: a record from elsewhere
            raise DeliveryFailed(f"the body cannot be sent: {exc}") from None
        method: str = target["method"]
        headers: CIMultiDict[str] = CIMultiDict(target["headers"])
        if method == "GET":
            payload = b""
        else:
            headers.setdefault("Content-Type", content_type)
        # Percent-encoded where a header would change them (delivery/base.py).
        headers["Delaywheel-Id"] = header_value(delivery.task_id)
        headers["Delaywheel-Topic"] = header_value(delivery.topic)
        headers["Delaywheel-Attempt"] = str(delivery.attempt)
        headers["Delaywheel-Epoch"] = str(delivery.epoch)
        if delivery.occurrence is not None:
            # The server's, over a template's own: one key for every occurrence
            # would make a receiver drop all but the first.
            headers["Idempotency-Key"] = header_value(delivery.task_id)
        return url, method, headers, (None if method == "GET" else payload)

    async def _attempt(
        self,
        method: str,
        url: URL,
        headers: CIMultiDict[str],
        payload: bytes | None,
        timeout_s: float,
        result_bytes: int,
    ) -> Answer:
        shown = shown_url(url)
        try:
            async with self._get_session().request(
                method,
                url,
                headers=headers,
                data=payload,
                allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as response:
                kept = await _drain(response, result_bytes)
                status = response.status
        except asyncio.TimeoutError:  # aiohttp's timeouts are ClientErrors too: first
            raise DeliveryFailed(f"timed out after {timeout_s:g} s waiting for {shown}") from None
        except aiohttp.ClientConnectorError as exc:
            refused = isinstance(exc.os_error, DestinationRefused)
            what = "refused" if refused else "cannot connect to"
            raise DeliveryFailed(f"{what} {shown}: {_reason(exc.os_error, url)}") from None
        except Exception as exc:  # send raises DeliveryFailed only, whatever aiohttp does
            raise DeliveryFailed(f"request to {shown} failed: {_reason(exc, url)}") from None
        if not 200 <= status < 300:
            note = " (redirects are not followed)" if 300 <= status < 400 else ""
            raise DeliveryFailed(f"HTTP {status} from {shown}{note}")
        return f"HTTP {status}", (_result(status, kept) if result_bytes else None)

    def _get_session(self) -> aiohttp.ClientSession:
        if self._closed:
            raise DeliveryFailed("the HTTP sender is closed (the server is stopping)")
        if self._session is None:
            self._resolver = CheckedResolver(self._allow, aiohttp.ThreadedResolver())
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(resolver=self._resolver, limit=self._concurrency),
                cookie_jar=aiohttp.DummyCookieJar(),
                trust_env=False,
                auto_decompress=False,  # the answer is discarded: never inflate it
                headers={"User-Agent": f"delaywheel/{__version__}"},
            )
        return self._session


async def _drain(response: aiohttp.ClientResponse, keep_bytes: int) -> bytes:
    """Read up to DRAIN_BYTES of the answer (``keep_bytes`` if more) and
    return its first ``keep_bytes``; the status already decided the attempt,
    so a failure here only costs the connection (and what was not read)."""
    left = max(DRAIN_BYTES, keep_bytes)
    kept: list[bytes] = []
    keep = keep_bytes
    try:
        while left > 0:
            chunk = await response.content.read(min(left, 16 * 1024))
            if not chunk:
                return b"".join(kept)
            if keep > 0:
                kept.append(chunk[:keep])
                keep -= len(kept[-1])
            left -= len(chunk)
    except (aiohttp.ClientError, asyncio.TimeoutError):
        pass
    response.close()  # not at the end of the answer: the connection cannot be reused
    return b"".join(kept)


def _result(status: int, body: bytes) -> dict[str, Any]:
    """A kept HTTP answer as the task's ``result``: the body as text when it
    is UTF-8 (less a character cut at the end by ``--max-result``), else
    as bytes."""
    for cut in range(4):  # a UTF-8 character is at most 4 bytes
        try:
            return {"status": status, "body": body[: len(body) - cut].decode()}
        except UnicodeDecodeError:
            continue
    return {"status": status, "body": body}


def _reason(exc: BaseException, url: URL) -> str:
    # A ClientResponseError's str() holds the full URL; its message does not.
    text = exc.message if isinstance(exc, aiohttp.ClientResponseError) else str(exc)
    if url.raw_query_string:
        text = text.replace(url.raw_query_string, "...")
    return text or type(exc).__name__
