"""The HTTP target: the map checked at ``add``, and real requests to a real
aiohttp server on 127.0.0.1 (port 0) that records what it receives."""

from __future__ import annotations

import asyncio
import re
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import msgpack  # type: ignore[import-untyped, unused-ignore]
import pytest
from aiohttp import web
from conftest import free_port
from multidict import CIMultiDict
from waiting import wait_until_async

from delaywheel.delivery.allow import AllowList
from delaywheel.delivery.base import Delivery, DeliveryFailed
from delaywheel.delivery.http import HttpSender
from delaywheel.delivery.http_target import check_target
from delaywheel.errors import RequestError

LOCAL = AllowList("127.0.0.1")
SECRET = "s3cret"


@dataclass
class Seen:
    method: str
    path_qs: str
    headers: CIMultiDict[str]
    body: bytes
    client_port: int


@dataclass
class Receiver:
    """A real HTTP server whose handlers record every request."""

    port: int = 0
    seen: list[Seen] = field(default_factory=list)
    active: int = 0
    most_active: int = 0
    tracked: int = 0

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    async def record(self, request: web.Request) -> web.StreamResponse:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        self.seen.append(
            Seen(
                request.method,
                request.path_qs,
                CIMultiDict(request.headers),
                await request.read(),
                peer[1] if peer else 0,
            )
        )
        if "cookie" in request.query:
            return web.Response(headers={"Set-Cookie": "session=abc; Path=/"})
        status = int(request.query.get("status", "200"))
        if status == 302:
            raise web.HTTPFound(self.url("/landed"))
        size = int(request.query.get("size", "2"))
        if "trickle" not in request.query:
            return web.Response(status=status, body=b"x" * size)
        # Half now, half later: the sender must read on to reuse the connection.
        response = web.StreamResponse(status=status)
        response.content_length = size
        await response.prepare(request)
        await response.write(b"x" * (size // 2))
        await asyncio.sleep(0.05)
        await response.write(b"x" * (size - size // 2))
        return response

    async def slow(self, request: web.Request) -> web.Response:
        await asyncio.sleep(2)
        return web.Response(text="late")

    async def stall(self, request: web.Request) -> web.StreamResponse:
        """A 200 whose body never ends."""
        response = web.StreamResponse()
        response.content_length = 10
        await response.prepare(request)
        await response.write(b"12345")
        await asyncio.sleep(2)
        return response

    async def track(self, request: web.Request) -> web.Response:
        self.tracked += 1
        self.active += 1
        self.most_active = max(self.most_active, self.active)
        try:
            await asyncio.sleep(0.1)
        finally:
            self.active -= 1
        return web.Response(text="ok")


@asynccontextmanager
async def receiving() -> AsyncIterator[Receiver]:
    receiver = Receiver()
    app = web.Application()
    app.router.add_get("/slow", receiver.slow)
    app.router.add_get("/stall", receiver.stall)
    app.router.add_post("/track", receiver.track)
    app.router.add_route("*", "/{tail:.*}", receiver.record)
    # handler_cancellation: a handler the client gave up on stops, so the
    # runner's cleanup does not wait for /slow to finish its sleep.
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    receiver.port = runner.addresses[0][1]
    try:
        yield receiver
    finally:
        await runner.cleanup()


@asynccontextmanager
async def sending(allow: AllowList = LOCAL, **kwargs: Any) -> AsyncIterator[HttpSender]:
    sender = HttpSender(allow, **kwargs)
    try:
        yield sender
    finally:
        await sender.close()


def run(scenario: Callable[[Receiver], Awaitable[None]]) -> None:
    async def main() -> None:
        async with receiving() as receiver:
            await scenario(receiver)

    asyncio.run(main())


def delivery(
    url: str, body: Any = b"", allow: AllowList = LOCAL, attempt: int = 1, **target: Any
) -> Delivery:
    checked = check_target({"type": "http", "url": url, **target}, allow)
    return Delivery("t-1", "mail", attempt, 0.0, msgpack.packb(body, use_bin_type=True), checked)


async def failure(sender: HttpSender, task: Delivery) -> str:
    with pytest.raises(DeliveryFailed) as caught:
        await sender.send(task)
    return str(caught.value)


def _resolved(name: str) -> set[str]:
    try:
        return {str(info[4][0]) for info in socket.getaddrinfo(name, 80, type=socket.SOCK_STREAM)}
    except OSError:
        pytest.skip(f"{name} does not resolve here")


def _hostname_resolving_to_loopback() -> str:
    """This machine's name, when it resolves (/etc/hosts) to 127.0.0.1 only,
    where the receiver listens."""
    name = socket.gethostname()
    found = _resolved(name)
    if found != {"127.0.0.1"}:
        pytest.skip(f"{name} resolves to {found}, not 127.0.0.1 alone")
    return name


# -- the request -----------------------------------------------------------------


def test_a_bin_body_is_posted_as_is_with_the_added_headers() -> None:
    async def scenario(rx: Receiver) -> None:
        async with sending() as sender:
            task = delivery(rx.url("/hook?a=1"), b"\x00\xff", attempt=3, headers={"X-Key": "k"})
            await sender.send(task)
        (seen,) = rx.seen
        assert (seen.method, seen.path_qs, seen.body) == ("POST", "/hook?a=1", b"\x00\xff")
        assert seen.headers["Content-Type"] == "application/octet-stream"
        assert seen.headers["Delaywheel-Id"] == "t-1"
        assert seen.headers["Delaywheel-Topic"] == "mail"
        assert seen.headers["Delaywheel-Attempt"] == "3"
        assert seen.headers["X-Key"] == "k"
        assert seen.headers["User-Agent"].startswith("delaywheel/")
        assert "Delaywheel-Signature" not in seen.headers  # no secret, no signature

    run(scenario)


def test_str_and_map_bodies_and_other_methods() -> None:
    async def scenario(rx: Receiver) -> None:
        async with sending() as sender:
            await sender.send(delivery(rx.url("/s"), "héllo", method="put"))
            await sender.send(delivery(rx.url("/m"), {"n": 1, "s": "é"}, method="PATCH"))
            await sender.send(delivery(rx.url("/d"), [1, None], method="DELETE"))
        text, json_map, deleted = rx.seen
        assert (text.method, text.body) == ("PUT", "héllo".encode())
        assert text.headers["Content-Type"] == "text/plain; charset=utf-8"
        assert (json_map.method, json_map.body) == ("PATCH", '{"n":1,"s":"é"}'.encode())
        assert json_map.headers["Content-Type"] == "application/json"
        assert (deleted.method, deleted.body) == ("DELETE", b"[1,null]")

    run(scenario)


def test_a_get_carries_no_body() -> None:
    async def scenario(rx: Receiver) -> None:
        async with sending() as sender:
            await sender.send(delivery(rx.url("/g"), {"ignored": True}, method="GET"))
        (seen,) = rx.seen
        assert (seen.method, seen.body) == ("GET", b"")
        assert "Content-Type" not in seen.headers

    run(scenario)


def test_a_tasks_content_type_replaces_the_default() -> None:
    async def scenario(rx: Receiver) -> None:
        async with sending() as sender:
            task = delivery(rx.url("/x"), "<a/>", headers={"content-type": "application/xml"})
            await sender.send(task)
        assert rx.seen[0].headers.getall("Content-Type") == ["application/xml"]

    run(scenario)


def test_any_2xx_completes_and_connections_are_reused() -> None:
    async def scenario(rx: Receiver) -> None:
        async with sending() as sender:
            await sender.send(delivery(rx.url("/a?status=204&size=0")))
            await sender.send(delivery(rx.url("/b?status=201&size=60000&trickle=1")))
            await sender.send(delivery(rx.url("/c")))
            # An answer past the drain limit costs its connection, not the delivery.
            await sender.send(delivery(rx.url("/d?size=300000")))
            await sender.send(delivery(rx.url("/e")))
        ports = [seen.client_port for seen in rx.seen]
        assert ports[0] == ports[1] == ports[2]  # answers read to the end: one connection
        assert ports[4] != ports[3]

    run(scenario)


def test_no_cookie_is_kept_from_one_delivery_to_the_next() -> None:
    # By name: aiohttp's cookie jar takes no cookies from an IP-literal host anyway.
    name = _hostname_resolving_to_loopback()

    async def scenario(rx: Receiver) -> None:
        allow = AllowList(name)
        async with sending(allow) as sender:
            await sender.send(delivery(f"http://{name}:{rx.port}/login?cookie=1", allow=allow))
            await sender.send(delivery(f"http://{name}:{rx.port}/other", allow=allow))
        assert "Cookie" not in rx.seen[1].headers

    run(scenario)


def test_a_2xx_decides_the_attempt_though_its_body_stalls() -> None:
    async def scenario(rx: Receiver) -> None:
        async with sending() as sender:
            started_s = time.monotonic()
            await sender.send(delivery(rx.url("/stall"), method="GET", timeout=0.3))
            assert time.monotonic() - started_s < 1.5

    run(scenario)


# -- failed attempts -------------------------------------------------------------


def test_a_500_is_a_failed_attempt_and_the_message_hides_the_query() -> None:
    async def scenario(rx: Receiver) -> None:
        async with sending() as sender:
            message = await failure(sender, delivery(rx.url("/hook?status=500&token=secret")))
        assert message == f"HTTP 500 from http://127.0.0.1:{rx.port}/hook"

    run(scenario)


def test_a_redirect_is_a_failed_attempt_and_is_not_followed() -> None:
    async def scenario(rx: Receiver) -> None:
        async with sending() as sender:
            message = await failure(sender, delivery(rx.url("/moved?status=302")))
        assert message.startswith("HTTP 302 from") and "not followed" in message
        assert [seen.path_qs for seen in rx.seen] == ["/moved?status=302"]  # no /landed

    run(scenario)


def test_a_timeout_is_a_failed_attempt() -> None:
    async def scenario(rx: Receiver) -> None:
        async with sending() as sender:
            started_s = time.monotonic()
            message = await failure(sender, delivery(rx.url("/slow"), method="GET", timeout=0.2))
            assert time.monotonic() - started_s < 1.5
        assert message == f"timed out after 0.2 s waiting for http://127.0.0.1:{rx.port}/slow"

    run(scenario)


def test_connection_refused_is_a_failed_attempt() -> None:
    async def scenario() -> None:
        url = f"http://127.0.0.1:{free_port()}/nobody"
        async with sending() as sender:
            message = await failure(sender, delivery(url))
        assert message.startswith(f"cannot connect to {url}: ")

    asyncio.run(scenario())


def test_ids_and_topics_a_header_would_change_arrive_percent_encoded() -> None:
    # Header values are stripped and cannot hold line breaks: sent as they are,
    # " t-8" would arrive as "t-8", and "a\r\nX-Evil: 1" would be a header of its own.
    ids = ["t-8", " t-8", "t-8 ", "a\r\nX-Evil: 1", "50%", "tab\tinside"]

    async def scenario(rx: Receiver) -> None:
        async with sending() as sender:
            for task_id in ids:
                task = delivery(rx.url("/x"))
                await sender.send(Delivery(task_id, " mail", 1, 0.0, task.body_packed, task.target))
        got = [seen.headers["Delaywheel-Id"] for seen in rx.seen]
        assert got == ["t-8", "%20t-8", "t-8%20", "a%0D%0AX-Evil: 1", "50%25", "tab\tinside"]
        assert [unquote(text) for text in got] == ids
        assert {seen.headers["Delaywheel-Topic"] for seen in rx.seen} == {"%20mail"}
        assert not any("X-Evil" in seen.headers for seen in rx.seen)

    run(scenario)


def test_a_record_that_cannot_be_sent_fails_without_a_request() -> None:
    async def scenario(rx: Receiver) -> None:
        task = delivery(rx.url("/x"))
        no_json = msgpack.packb({"a": b"bin"}, use_bin_type=True)  # refused at add
        not_a_url = {**task.target, "url": "http://[::1"}
        async with sending() as sender:
            message = await failure(sender, Delivery("t", "m", 1, 0.0, no_json, task.target))
            assert message.startswith("the body cannot be sent: ")
            message = await failure(sender, Delivery("t", "m", 1, 0.0, b"\xc0", not_a_url))
            assert message.startswith("the target's url is not a URL: ")
        assert rx.seen == []

    run(scenario)


def test_send_after_close_fails() -> None:
    async def scenario(rx: Receiver) -> None:
        sender = HttpSender(LOCAL)
        await sender.send(delivery(rx.url("/first")))
        await sender.close()
        assert "closed" in await failure(sender, delivery(rx.url("/late")))
        assert len(rx.seen) == 1

    run(scenario)


# -- the destination, checked again at each attempt ---------------------------------


def test_a_name_is_refused_after_dns_when_its_address_is_not_allowed() -> None:
    name = socket.gethostname()  # resolves on any machine, and never into TEST-NET-1
    found = _resolved(name)

    async def scenario(rx: Receiver) -> None:
        test_net = AllowList("192.0.2.0/24")  # TEST-NET-1: no real host is there
        url = f"http://{name}:{rx.port}/hook"
        task = delivery(url, allow=test_net)  # passes add: DNS may yet allow it
        async with sending(test_net) as sender:
            message = await failure(sender, task)
        prefix = f"refused {url}: {name} resolves to "
        suffix = ", which --http-allow=192.0.2.0/24 refuses"
        assert message.startswith(prefix) and message.endswith(suffix)
        assert set(message.removeprefix(prefix).removesuffix(suffix).split(", ")) <= found
        assert rx.seen == []

    run(scenario)


def test_a_name_is_delivered_when_its_address_or_name_is_allowed() -> None:
    name = _hostname_resolving_to_loopback()

    async def scenario(rx: Receiver) -> None:
        for allow in (AllowList("127.0.0.0/8"), AllowList(name.upper())):
            async with sending(allow) as sender:
                await sender.send(delivery(f"http://{name}:{rx.port}/ok", allow=allow))
        assert len(rx.seen) == 2

    run(scenario)


def test_an_ip_literal_is_checked_again_at_the_attempt() -> None:
    async def scenario(rx: Receiver) -> None:
        task = delivery(rx.url("/x"))  # allowed at add, by the list of that time
        async with sending(AllowList("public")) as sender:  # restarted with the default
            message = await failure(sender, task)
        assert message == (
            f"refused http://127.0.0.1:{rx.port}/x: "
            "host 127.0.0.1 (loopback) is refused by --http-allow=public"
        )
        assert rx.seen == []

    run(scenario)


# -- the signature ---------------------------------------------------------------


def documented_verify() -> Callable[..., bool]:
    """The receiver's recipe, run exactly as docs/delivery.md gives it."""
    text = (Path(__file__).parent.parent / "docs" / "delivery.md").read_text()
    match = re.search(r"```python\n(.*?)```", text, re.DOTALL)
    assert match is not None, "docs/delivery.md has no python example"
    namespace: dict[str, Any] = {}
    exec(compile(match.group(1), "docs/delivery.md", "exec"), namespace)
    verify: Callable[..., bool] = namespace["verify"]
    return verify


def test_the_signature_verifies_with_the_documented_recipe() -> None:
    verify = documented_verify()

    async def scenario(rx: Receiver) -> None:
        async with sending(signing_secret=SECRET) as sender:
            await sender.send(delivery(rx.url("/signed"), {"amount": 5}))
            await sender.send(delivery(rx.url("/get"), method="GET"))
        for seen in rx.seen:
            header = seen.headers["Delaywheel-Signature"]
            assert re.fullmatch(r"t=\d+,v1=[0-9a-f]{64}", header)
            t_s = int(header.split(",")[0][2:])
            assert abs(time.time() - t_s) < 60
            assert verify(SECRET.encode(), header, seen.body)
            assert not verify(b"other secret", header, seen.body)
            assert not verify(SECRET.encode(), header, seen.body + b" ")
            assert not verify(SECRET.encode(), header, seen.body, now_s=t_s + 301)
        assert not verify(SECRET.encode(), "v1=00", b"")

    run(scenario)


# -- the bound on requests in flight ----------------------------------------------


def test_requests_over_the_bound_wait_for_a_slot() -> None:
    async def scenario(rx: Receiver) -> None:
        async with sending(concurrency=2) as sender:
            assert sender.state() == {"in_flight": 0, "waiting": 0, "concurrency": 2}
            sends = [
                asyncio.ensure_future(sender.send(delivery(rx.url("/track")))) for _ in range(6)
            ]
            busy = {"in_flight": 2, "waiting": 4, "concurrency": 2}

            async def full() -> bool:
                return sender.state() == busy

            try:  # each request takes 0.1 s: long enough to see the other four wait
                await wait_until_async(full, what=f"the sender to be full: {busy}")
            finally:
                await asyncio.gather(*sends)
            assert sender.state() == {"in_flight": 0, "waiting": 0, "concurrency": 2}
        assert rx.most_active == 2
        assert rx.tracked == 6

    run(scenario)


# -- check_target ----------------------------------------------------------------


def test_check_target_fills_every_field() -> None:
    url = "https://hooks.example.com/x?y=1"
    assert check_target({"type": "http", "url": url}, AllowList()) == {
        "type": "http",
        "url": url,
        "method": "POST",
        "headers": {},
        "timeout": 10.0,
    }
    given = {"type": "http", "url": url, "method": "get", "headers": {"A": "b"}, "timeout": 1}
    checked = check_target(given, AllowList())
    assert (checked["method"], checked["headers"], checked["timeout"]) == ("GET", {"A": "b"}, 1.0)
    assert type(checked["timeout"]) is float


URL = "https://hooks.example.com/"


@pytest.mark.parametrize(
    ("target", "shown"),
    [
        ({"url": URL, "retries": 3}, "'retries'"),
        ({"url": 5}, "5"),
        ({}, "no url"),
        ({"url": "ftp://example.com/x"}, "'ftp://example.com/x'"),
        ({"url": "hooks.example.com/x"}, "'hooks.example.com/x'"),
        ({"url": "http:///nohost"}, "'http:///nohost'"),
        ({"url": "https://example.com/" + "a" * 2100}, "2120 characters"),
        ({"url": "https://example.com/a b"}, "'https://example.com/a b'"),
        ({"url": "https://example.com:99999/"}, "'https://example.com:99999/'"),
        ({"url": "https://user:pw@example.com/x"}, "'https://example.com/x'"),
        ({"url": "http://127.0.0.1:8080/x"}, "127.0.0.1 (loopback)"),
        ({"url": "http://localhost/"}, "localhost (loopback)"),
        ({"url": "http://169.254.169.254/latest/meta-data"}, "169.254.169.254 (link-local)"),
        ({"url": URL, "method": "TRACE"}, "'TRACE'"),
        ({"url": URL, "method": 1}, "1"),
        ({"url": URL, "headers": ["X-A: 1"]}, "['X-A: 1']"),
        ({"url": URL, "headers": {"X A": "1"}}, "'X A'"),
        ({"url": URL, "headers": {1: "1"}}, "1"),
        ({"url": URL, "headers": {"X-A": 1}}, "X-A"),
        ({"url": URL, "headers": {"X-A": "1\r\nX-B: 2"}}, "'1\\r\\nX-B: 2'"),
        ({"url": URL, "headers": {"X-A": "a\x00"}}, "'a\\x00'"),
        ({"url": URL, "headers": {"delaywheel-id": "x"}}, "'delaywheel-id'"),
        ({"url": URL, "headers": {"Host": "x"}}, "'Host'"),
        ({"url": URL, "headers": {"content-length": "1"}}, "'content-length'"),
        ({"url": URL, "headers": {"Transfer-Encoding": "chunked"}}, "'Transfer-Encoding'"),
        ({"url": URL, "headers": {"Connection": "close"}}, "'Connection'"),
        ({"url": URL, "headers": {"X-A": "1", "x-a": "2"}}, "'x-a' twice"),
        ({"url": URL, "timeout": 0.05}, "0.05"),
        ({"url": URL, "timeout": 301}, "301"),
        ({"url": URL, "timeout": "10"}, "'10'"),
        ({"url": URL, "timeout": True}, "True"),
    ],
)
def test_check_target_refuses_naming_the_field_and_value(
    target: dict[str, Any], shown: str
) -> None:
    with pytest.raises(RequestError) as caught:
        check_target({"type": "http", **target}, AllowList())
    assert caught.value.code == "bad_request"
    assert shown in caught.value.message
    assert "target" in caught.value.message
    assert "pw" not in caught.value.message


def test_check_target_refuses_a_name_no_entry_matches() -> None:
    with pytest.raises(RequestError, match=r"hooks\.example\.com matches no entry"):
        check_target({"type": "http", "url": URL}, AllowList("other.example.com"))
