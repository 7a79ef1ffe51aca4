"""The blocking and asyncio clients against the real server (tests/serverproc.py).

One server per module for the tests that do not disturb it, each test in its own topic;
servers with other flags (a token, small limits) or that get stopped have their own.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from delaywheel_client import (
    AsyncClient,
    BadRequest,
    Client,
    Conflict,
    ConnectionFailed,
    DelaywheelError,
    Exists,
    Internal,
    NoMethod,
    NotFound,
    ServerClosed,
    TooLarge,
    Unauthorized,
    Unavailable,
    error_from,
)
from delaywheel_client.connection import PIPELINE_CHUNK_BYTES, parse_url
from serverproc import ServerProcess, free_port
from waiting import wait_until, wait_until_async

TASK_KEYS = {"id", "topic", "state", "at", "body", "ttr", "max_attempts", "attempts", "created"}
TASK_KEYS |= {"target", "cycle", "slot"}
PLACEMENT_KEYS = {"id", "at", "cycle", "slot"}


# -- every method, shaped as docs/protocol.md says ------------------------------------------------


def test_ping(client: Client) -> None:
    assert client.ping() == "pong"
    assert client.call("ping") == "pong"


def test_add_returns_placement_and_get_returns_the_task(client: Client, topic: str) -> None:
    before = time.time()
    placed = client.add(topic, {"order": 42}, delay=30)
    assert set(placed) == PLACEMENT_KEYS
    assert before + 30 <= placed["at"] <= time.time() + 30
    assert isinstance(placed["cycle"], int)
    assert isinstance(placed["slot"], int)

    task = client.get(placed["id"])
    assert task is not None
    assert set(task) >= TASK_KEYS
    assert task["topic"] == topic
    assert task["state"] == "delayed"
    assert task["body"] == {"order": 42}
    assert (task["ttr"], task["max_attempts"], task["attempts"]) == (60, 5, 0)
    assert task["target"] == {"type": "queue"}
    assert (task["cycle"], task["slot"]) == (placed["cycle"], placed["slot"])


def test_add_sends_only_the_keys_given(client: Client, topic: str) -> None:
    bare = client.add(topic)
    task = client.get(bare["id"])
    assert task is not None
    assert task["state"] == "ready"
    assert task["body"] is None

    at = time.time() + 100
    client.add(
        topic, "x", at=at, id=f"{topic}-full", ttr=7, max_attempts=2, target={"type": "queue"}
    )
    task = client.get(f"{topic}-full")
    assert task is not None
    assert task["at"] == pytest.approx(at)
    assert (task["ttr"], task["max_attempts"], task["body"]) == (7, 2, "x")


@pytest.mark.parametrize(
    "body",
    [b"\x00\xffraw", "text", 12, 1.5, True, [1, [2, b"x"]], {"k": {"n": None}, 3: "int key"}],
)
def test_body_comes_back_with_its_type(client: Client, topic: str, body: Any) -> None:
    task = client.get(client.add(topic, body)["id"])
    assert task is not None
    assert task["body"] == body
    assert type(task["body"]) is type(body)


def test_add_many_in_order_and_all_or_nothing(client: Client, topic: str) -> None:
    ids = [f"{topic}-{n}" for n in range(3)]
    placed = client.add_many([{"topic": topic, "id": i, "body": n} for n, i in enumerate(ids)])
    assert [p["id"] for p in placed] == ids
    assert all(set(p) == PLACEMENT_KEYS for p in placed)

    batch = [{"topic": topic, "id": f"{topic}-ok"}, {"topic": topic, "delay": -1}]
    with pytest.raises(BadRequest, match="task 1"):
        client.add_many(batch)
    assert client.get(f"{topic}-ok") is None


def test_update(client: Client, topic: str) -> None:
    task_id = client.add(topic, "old", delay=1000)["id"]
    updated = client.update(task_id, delay=5, body="new", ttr=9, max_attempts=3)
    assert updated["id"] == task_id
    assert (updated["body"], updated["ttr"], updated["max_attempts"]) == ("new", 9, 3)
    assert updated["at"] == pytest.approx(time.time() + 5, abs=1)
    assert updated["state"] == "delayed"
    assert client.update(task_id, delay=0)["state"] == "ready"
    with pytest.raises(NotFound):
        client.update(f"{topic}-missing", delay=1)


def test_delete_and_get_missing(client: Client, topic: str) -> None:
    task_id = client.add(topic, delay=100)["id"]
    assert client.delete(task_id) is True
    assert client.delete(task_id) is False
    assert client.get(task_id) is None


def test_list_pages_and_iter_tasks(client: Client, topic: str) -> None:
    ids = [p["id"] for p in client.add_many([{"topic": topic, "body": n} for n in range(25)])]
    page = client.list(topic=topic, limit=10)
    assert set(page) == {"tasks", "next"}
    assert [t["id"] for t in page["tasks"]] == ids[:10]
    assert page["next"] is not None
    second = client.list(topic=topic, limit=10, cursor=page["next"])
    assert [t["id"] for t in second["tasks"]] == ids[10:20]

    assert [t["id"] for t in client.iter_tasks(topic=topic, page_size=7)] == ids
    client.reserve(topic)
    assert [t["id"] for t in client.iter_tasks(topic=topic, state="reserved")] == ids[:1]
    with pytest.raises(BadRequest):
        client.list(limit=0)


def test_reserve_ack(client: Client, topic: str) -> None:
    assert client.reserve(topic) is None
    task_id = client.add(topic, "work")["id"]
    task = client.reserve([f"{topic}-other", topic])
    assert task is not None
    assert task["id"] == task_id
    assert (task["state"], task["attempts"]) == ("reserved", 1)
    assert task["deadline"] == pytest.approx(time.time() + 60, abs=2)
    assert client.ack(task_id) is True
    assert client.get(task_id) is None


def test_reserve_waits_up_to_its_timeout(client: Client, topic: str) -> None:
    started = time.monotonic()
    assert client.reserve(topic, timeout=0.3) is None
    assert time.monotonic() - started >= 0.25


def test_reserve_timeout_is_added_to_the_reply_timeout(server: ServerProcess, topic: str) -> None:
    with Client(*server.address, timeout_s=0.2, retries=0) as dw:
        assert dw.reserve(topic, timeout=0.5) is None  # longer than timeout_s: no time-out


def test_call_reserve_waits_its_timeout_too(server: ServerProcess, topic: str) -> None:
    with Client(*server.address, timeout_s=0.2, retries=0) as dw:
        assert dw.call("reserve", topic, 0.5) is None


def test_release_and_touch(client: Client, topic: str) -> None:
    task_id = client.add(topic, ttr=30)["id"]
    first = client.reserve(topic)
    assert first is not None
    time.sleep(0.01)  # stays: time must pass for touch to move the deadline on
    deadline = client.touch(task_id)
    assert deadline > first["deadline"]
    assert client.release(task_id) is True
    again = client.reserve(topic)
    assert again is not None
    assert (again["id"], again["attempts"]) == (task_id, 2)
    assert client.release(task_id, delay=100) is True
    task = client.get(task_id)
    assert task is not None
    assert task["state"] == "delayed"
    assert task["at"] == pytest.approx(time.time() + 100, abs=2)


def test_kick_revives_dead_tasks(client: Client, topic: str) -> None:
    task_id = client.add(topic, max_attempts=1)["id"]
    assert client.reserve(topic) is not None
    client.release(task_id)
    dead = client.get(task_id)
    assert dead is not None
    assert dead["state"] == "dead"
    assert client.kick(topic, 10) == 1
    kicked = client.get(task_id)
    assert kicked is not None
    assert (kicked["state"], kicked["attempts"]) == ("ready", 0)
    assert client.kick(topic, 10) == 0


def test_stats(client: Client, topic: str) -> None:
    client.add(topic, delay=100)
    stats = client.stats()
    for key in ("states", "topics", "slots", "tick", "cursor", "store", "uptime", "version"):
        assert key in stats
    assert stats["connections"] >= 1
    assert stats["store"] == "memory://"
    assert stats["topics"][topic] == {"delayed": 1}
    assert stats["states"]["delayed"] >= 1


# -- errors --------------------------------------------------------------------------------


def test_server_errors_raise_their_class(client: Client, topic: str) -> None:
    with pytest.raises(BadRequest, match="not both") as bad:
        client.add(topic, delay=1, at=time.time())
    assert bad.value.code == "bad_request"
    assert str(bad.value).startswith("bad_request: ")
    with pytest.raises(NotFound, match="nope"):
        client.ack(f"{topic}-nope")
    client.add(topic, id=f"{topic}-dup")
    with pytest.raises(Exists):
        client.add(topic, id=f"{topic}-dup")
    with pytest.raises(Conflict):
        client.ack(f"{topic}-dup")  # ready, not reserved
    with pytest.raises(NoMethod, match="frobnicate") as no_method:
        client.call("frobnicate", 1)
    assert isinstance(no_method.value, DelaywheelError)
    assert client.ping() == "pong"  # errors leave the connection usable


def test_unpackable_argument_raises_type_error(client: Client, topic: str) -> None:
    with pytest.raises(TypeError):
        client.add(topic, object())
    assert client.ping() == "pong"


@pytest.mark.parametrize(
    ("code", "cls"),
    [
        ("bad_request", BadRequest),
        ("not_found", NotFound),
        ("exists", Exists),
        ("conflict", Conflict),
        ("too_large", TooLarge),
        ("unauthorized", Unauthorized),
        ("unavailable", Unavailable),
        ("no_method", NoMethod),
        ("internal", Internal),
    ],
)
def test_error_from(code: str, cls: type[DelaywheelError]) -> None:
    error = error_from(code, "why")
    assert type(error) is cls
    assert (error.code, error.message) == (code, "why")
    copy = pickle.loads(pickle.dumps(error))
    assert (type(copy), copy.code, copy.message) == (cls, code, "why")


def test_error_from_unknown_code() -> None:
    error = error_from("teapot", "short and stout")
    assert type(error) is DelaywheelError
    assert (error.code, str(error)) == ("teapot", "teapot: short and stout")
    closed = ServerClosed("bye", "too_large")
    assert isinstance(closed, ConnectionFailed)
    assert closed.code == "too_large"
    assert pickle.loads(pickle.dumps(closed)).code == "too_large"


@pytest.fixture(scope="module")
def limited_server() -> Iterator[ServerProcess]:
    proc = ServerProcess("--max-body", "1024", "--max-message", "65536")
    yield proc
    proc.stop()


def test_too_large_body(limited_server: ServerProcess) -> None:
    with Client(*limited_server.address) as dw:
        dw.add("limits", b"x" * 1000)
        with pytest.raises(TooLarge, match="1024"):
            dw.add("limits", b"x" * 2000)
        assert dw.ping() == "pong"


def test_message_over_the_limit_is_server_closed(limited_server: ServerProcess) -> None:
    with Client(*limited_server.address) as dw:
        with pytest.raises(ServerClosed) as closed:
            dw.add("limits", b"x" * 100_000)
        assert closed.value.code == "too_large"
        assert isinstance(closed.value, ConnectionFailed)
        assert f"{limited_server.host}:{limited_server.port}" in str(closed.value)
        assert dw.ping() == "pong"  # a new connection


@pytest.mark.process
def test_refused_connection_is_server_closed_with_its_code() -> None:
    proc = ServerProcess("--max-connections", "1")
    try:
        with Client(*proc.address) as first, Client(*proc.address) as second:
            assert first.ping() == "pong"
            with pytest.raises(ServerClosed, match="too many connections") as closed:
                second.ping()
            assert closed.value.code == "unavailable"
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def token_server() -> Iterator[ServerProcess]:
    proc = ServerProcess("--token", "s3cret")
    yield proc
    proc.stop()


def test_unauthorized_without_the_token(token_server: ServerProcess) -> None:
    with Client(*token_server.address) as dw:
        assert dw.ping() == "pong"  # ping needs no auth
        with pytest.raises(Unauthorized):
            dw.add("auth", "x")
        with pytest.raises(Unauthorized):
            dw.reserve("auth")
    with Client(*token_server.address, token="wrong") as dw, pytest.raises(Unauthorized):
        dw.ping()


def test_token_is_sent_on_every_new_connection(token_server: ServerProcess) -> None:
    host, port = token_server.address
    with Client.from_url(f"delaywheel://s3cret@{host}:{port}") as dw:
        assert dw.token == "s3cret"
        results: list[Any] = []
        threads = [
            threading.Thread(target=lambda: results.append(dw.add("auth", "x"))) for _ in range(4)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(results) == 4
        assert dw.get(results[0]["id"]) is not None


def test_parse_url() -> None:
    assert parse_url("delaywheel://tok@example.com:4000") == ("example.com", 4000, "tok")
    assert parse_url("delaywheel://:p%40ss@10.0.0.1:1") == ("10.0.0.1", 1, "p@ss")
    assert parse_url("example.com:4000") == ("example.com", 4000, None)
    assert parse_url("delaywheel://[::1]:5") == ("::1", 5, None)
    assert parse_url("delaywheel://host") == ("host", 3450, None)
    with pytest.raises(ValueError, match="delaywheel URL"):
        parse_url("redis://host:1")
    assert Client.from_url("h:1", token="kw").token == "kw"


# -- pipelines -------------------------------------------------------------------------------


def test_pipeline_of_a_thousand_adds(client: Client, topic: str) -> None:
    with client.pipeline() as pipe:
        for n in range(1000):
            assert pipe.add(topic, n, id=f"{topic}-{n}") is None
        assert len(pipe) == 1000
    assert [r["id"] for r in pipe.results] == [f"{topic}-{n}" for n in range(1000)]
    assert all(set(r) == PLACEMENT_KEYS for r in pipe.results)
    assert [t["body"] for t in client.iter_tasks(topic=topic)] == list(range(1000))


def test_pipeline_errors(client: Client, topic: str) -> None:
    pipe = client.pipeline()
    pipe.add(topic, id=f"{topic}-a")
    pipe.ack(f"{topic}-missing")
    pipe.get(f"{topic}-a")
    pipe.call("nope")
    results = pipe.execute(raise_on_error=False)
    assert results[0]["id"] == f"{topic}-a"
    assert isinstance(results[1], NotFound)
    assert results[2]["state"] == "ready"
    assert isinstance(results[3], NoMethod)

    pipe.delete(f"{topic}-a")
    pipe.ack(f"{topic}-missing")
    pipe.ping()
    with pytest.raises(NotFound):
        pipe.execute()
    assert pipe.results[2] == "pong"  # every reply was read before raising
    assert client.get(f"{topic}-a") is None
    assert pipe.execute() == []


def test_pipeline_discarded_on_exception(client: Client, topic: str) -> None:
    with pytest.raises(RuntimeError), client.pipeline() as pipe:
        pipe.add(topic, id=f"{topic}-never")
        raise RuntimeError
    assert client.get(f"{topic}-never") is None


def test_pipeline_larger_than_a_write_chunk(client: Client, topic: str) -> None:
    body = b"x" * 1000
    count = PIPELINE_CHUNK_BYTES // 1000 * 3
    pipe = client.pipeline()
    for _ in range(count):
        pipe.add(topic, body)
    for _ in range(count):
        pipe.reserve(topic, timeout=1)
    results = pipe.execute()
    assert len(results) == 2 * count
    assert all(r["body"] == body and r["state"] == "reserved" for r in results[count:])


# -- threads, connections, failures ----------------------------------------------------------


def test_threads_share_a_client_while_one_blocks_in_reserve(client: Client, topic: str) -> None:
    reserved: list[Any] = []
    errors: list[BaseException] = []

    def reserve() -> None:
        try:
            reserved.append(client.reserve(f"{topic}-wait", timeout=20))
        except BaseException as exc:
            errors.append(exc)

    def add(worker: int) -> None:
        try:
            for n in range(50):
                client.add(topic, [worker, n])
        except BaseException as exc:
            errors.append(exc)

    waiting = client.stats()["waiting_reserves"]  # the module's server: others' may be there
    blocker = threading.Thread(target=reserve)
    blocker.start()
    wait_until(lambda: client.stats()["waiting_reserves"] > waiting, what="the reserve to block")
    adders = [threading.Thread(target=add, args=(w,)) for w in range(8)]
    for thread in adders:
        thread.start()
    for thread in adders:
        thread.join(15)
    assert not errors
    assert blocker.is_alive()  # the adds did not wait for the reserve
    assert len(list(client.iter_tasks(topic=topic))) == 400

    task_id = client.add(f"{topic}-wait", "wake")["id"]
    blocker.join(15)
    assert not errors
    assert reserved[0]["id"] == task_id


def test_connection_refused_is_fast_and_names_the_address() -> None:
    port = free_port()
    started = time.monotonic()
    with Client("127.0.0.1", port) as dw, pytest.raises(ConnectionFailed) as failed:
        dw.ping()
    assert time.monotonic() - started < 5
    assert f"127.0.0.1:{port}" in str(failed.value)
    assert "refused" in str(failed.value).lower()
    assert failed.value.code == "connection"


@pytest.fixture
def fixed_port_server() -> Iterator[ServerProcess]:
    """A server on a port of our choosing, so that start() after stop() comes back on it."""
    # The last --port wins (click), overriding serverproc's --port 0.
    proc = ServerProcess("--port", str(free_port()))
    yield proc
    if proc.proc is not None and proc.proc.poll() is None:
        os.kill(proc.proc.pid, signal.SIGCONT)
    proc.stop()


def test_reconnects_after_a_server_restart(fixed_port_server: ServerProcess, topic: str) -> None:
    port = fixed_port_server.port
    with Client(*fixed_port_server.address, retries=1) as dw:
        dw.add(topic, id="before")
        fixed_port_server.stop()
        fixed_port_server.start()
        assert fixed_port_server.port == port
        assert dw.add(topic, id="after")["id"] == "after"  # not a read-only method

        fixed_port_server.stop()
        with pytest.raises(ConnectionFailed, match=f"127.0.0.1:{port}.*refused"):
            dw.ping()
        fixed_port_server.start()
        assert dw.ping() == "pong"


def test_a_sent_write_whose_reply_is_lost_is_not_retried(
    fixed_port_server: ServerProcess, topic: str
) -> None:
    failures: list[BaseException] = []

    def reserve() -> None:
        try:
            dw.reserve(topic, timeout=20)
        except BaseException as exc:
            failures.append(exc)

    with Client(*fixed_port_server.address) as dw, Client(*fixed_port_server.address) as watcher:
        dw.ping()
        blocker = threading.Thread(target=reserve)
        blocker.start()
        wait_until(lambda: watcher.stats()["waiting_reserves"] == 1, what="the reserve to block")
        fixed_port_server.kill()
        blocker.join(5)
        assert not blocker.is_alive()
        assert isinstance(failures[0], ConnectionFailed)
        assert "may have been applied" in str(failures[0])


def test_no_reply_within_timeout(fixed_port_server: ServerProcess) -> None:
    assert fixed_port_server.proc is not None
    os.kill(fixed_port_server.proc.pid, signal.SIGSTOP)
    try:
        with (
            Client(*fixed_port_server.address, timeout_s=0.2, retries=0) as dw,
            pytest.raises(ConnectionFailed, match=r"no reply to ping within 0\.2 s"),
        ):
            dw.ping()
    finally:
        os.kill(fixed_port_server.proc.pid, signal.SIGCONT)


# -- AsyncClient -------------------------------------------------------------------------------


def test_async_many_concurrent_calls_on_one_connection(server: ServerProcess, topic: str) -> None:
    async def main() -> None:
        async with await AsyncClient.connect(*server.address) as dw:
            connections = (await dw.stats())["connections"]
            protocol = dw._protocol
            placed = await asyncio.gather(*(dw.add(topic, n) for n in range(500)))
            tasks = await asyncio.gather(*(dw.get(p["id"]) for p in placed))
            assert [t["body"] for t in tasks if t is not None] == list(range(500))
            assert dw._protocol is protocol
            assert (await dw.stats())["connections"] == connections

    asyncio.run(main())


def test_async_every_method(server: ServerProcess, topic: str) -> None:
    async def main() -> None:
        dw = AsyncClient.from_url(f"delaywheel://{server.host}:{server.port}")
        try:
            assert await dw.ping() == "pong"
            assert await dw.call("ping") == "pong"
            many = await dw.add_many([{"topic": topic, "body": n} for n in range(3)])
            assert len(many) == 3
            task_id = (await dw.add(topic, "x", id=f"{topic}-x", max_attempts=1))["id"]
            assert (await dw.update(task_id, body="y"))["body"] == "y"
            assert len([t async for t in dw.iter_tasks(topic=topic, page_size=2)]) == 4
            assert len((await dw.list(topic=topic, limit=1))["tasks"]) == 1
            for _ in range(3):
                reserved = await dw.reserve(topic)
                assert reserved is not None
                assert await dw.ack(reserved["id"]) is True
            assert await dw.reserve([topic]) is not None
            assert await dw.touch(task_id) > time.time()
            assert await dw.release(task_id) is True  # max_attempts 1: now dead
            assert await dw.kick(topic, 1) == 1
            assert (await dw.stats())["topics"][topic] == {"ready": 1}
            assert await dw.delete(task_id) is True
            assert await dw.get(task_id) is None
            with pytest.raises(NotFound):
                await dw.ack(task_id)
            with pytest.raises(NoMethod):
                await dw.call("nope")
        finally:
            await dw.close()

    asyncio.run(main())


def test_async_replies_out_of_order(server: ServerProcess, topic: str) -> None:
    async def main() -> None:
        async with AsyncClient(*server.address) as dw:
            before = (await dw.stats())["waiting_reserves"]  # others' may be there
            waiting = asyncio.ensure_future(dw.reserve(topic, timeout=10))

            async def blocked() -> bool:
                return bool((await dw.stats())["waiting_reserves"] > before)

            await wait_until_async(blocked, what="the reserve to block")
            assert not waiting.done()
            assert await dw.ping() == "pong"  # answered while the reserve blocks
            task_id = (await dw.add(topic, "go"))["id"]
            reserved = await asyncio.wait_for(waiting, 5)
            assert reserved is not None
            assert reserved["id"] == task_id

    asyncio.run(main())


def test_async_auth(token_server: ServerProcess) -> None:
    async def main() -> None:
        async with await AsyncClient.connect(*token_server.address, token="s3cret") as dw:
            assert (await dw.add("auth-async"))["id"]
        async with AsyncClient(*token_server.address) as dw:
            with pytest.raises(Unauthorized):
                await dw.add("auth-async")
        with pytest.raises(Unauthorized):
            await AsyncClient.connect(*token_server.address, token="wrong")

    asyncio.run(main())


def test_async_connection_refused() -> None:
    port = free_port()

    async def main() -> None:
        with pytest.raises(ConnectionFailed, match=f"127.0.0.1:{port}"):
            await AsyncClient.connect("127.0.0.1", port, retries=1)

    asyncio.run(main())


def test_async_drop_fails_pending_calls_and_next_call_reconnects(
    fixed_port_server: ServerProcess, topic: str
) -> None:
    async def main() -> None:
        async with await AsyncClient.connect(*fixed_port_server.address) as dw:
            waiting = [asyncio.ensure_future(dw.reserve(topic, timeout=20)) for _ in range(3)]

            async def blocked() -> bool:
                return bool((await dw.stats())["waiting_reserves"] == 3)

            await wait_until_async(blocked, what="the three reserves to block")
            fixed_port_server.kill()
            results = await asyncio.wait_for(asyncio.gather(*waiting, return_exceptions=True), 5)
            assert all(isinstance(r, ConnectionFailed) for r in results)
            fixed_port_server.start()
            assert await dw.add(topic, "again")

    asyncio.run(main())


def test_async_timeout_keeps_the_connection(fixed_port_server: ServerProcess) -> None:
    assert fixed_port_server.proc is not None
    pid = fixed_port_server.proc.pid

    async def main() -> None:
        async with await AsyncClient.connect(
            *fixed_port_server.address, timeout_s=0.2, retries=0
        ) as dw:
            os.kill(pid, signal.SIGSTOP)
            try:
                with pytest.raises(ConnectionFailed, match=r"no reply to ping within 0\.2 s"):
                    await dw.ping()
            finally:
                os.kill(pid, signal.SIGCONT)
            protocol = dw._protocol
            assert await dw.ping() == "pong"  # the late reply to the first ping is dropped
            assert dw._protocol is protocol

    asyncio.run(main())


def test_async_client_runs_on_uvloop(server: ServerProcess, topic: str) -> None:
    """uvloop's transports are not asyncio.Transport subclasses; the client must not care."""
    uvloop = pytest.importorskip("uvloop")

    async def main() -> None:
        async with AsyncClient(*server.address) as client:
            added = await asyncio.gather(*(client.add(topic, i) for i in range(50)))
            assert [(await client.get(a["id"]))["body"] for a in added] == list(range(50))  # type: ignore[index]

    uvloop.run(main())


def test_async_pipeline_sends_many_calls_at_once(server: ServerProcess, topic: str) -> None:
    async def main() -> None:
        async with AsyncClient(*server.address) as client:
            async with client.pipeline() as pipe:
                for i in range(1000):
                    pipe.add(topic, i, id=f"{topic}-{i}")
                pipe.get(f"{topic}-999")
            assert len(pipe.results) == 1001
            assert pipe.results[-1]["body"] == 999
            again = client.pipeline()
            again.add(topic, id=f"{topic}-0")  # exists
            again.ping()
            results = await again.execute(raise_on_error=False)
            assert isinstance(results[0], Exists) and results[1] == "pong"
            again.add(topic, id=f"{topic}-0")
            with pytest.raises(Exists):
                await again.execute()

    asyncio.run(main())


def test_async_pipeline_replies_in_call_order_across_the_msgid_wrap(
    server: ServerProcess, topic: str
) -> None:
    """A pipeline's calls share one future (``Replies``): each reply goes to its call's
    place, when the msgids wrap past 2**32-1 and with single calls in flight beside it."""

    async def main() -> None:
        async with AsyncClient(*server.address) as client:
            protocol = client._protocol
            assert protocol is not None
            protocol.msgid = 2**32 - 3  # the pipeline's msgids run 2**32-3 .. 6
            pipe = client.pipeline()
            for i in range(10):
                pipe.add(topic, i, id=f"{topic}-wrap-{i}")
            alone = asyncio.ensure_future(client.ping())  # a msgid right after the pipeline's
            added = await pipe.execute()
            assert [a["id"] for a in added] == [f"{topic}-wrap-{i}" for i in range(10)]
            assert await alone == "pong"
            assert protocol.msgid == 8 and not protocol.pending
            bodies = client.pipeline()
            for i in range(10):
                bodies.get(f"{topic}-wrap-{i}")
            assert [task["body"] for task in await bodies.execute()] == list(range(10))

    asyncio.run(main())


def test_async_pipeline_with_an_unpackable_value_sends_nothing(
    server: ServerProcess, topic: str
) -> None:
    async def main() -> None:
        async with AsyncClient(*server.address) as client:
            pipe = client.pipeline()
            pipe.add(topic, 1, id=f"{topic}-packable")
            pipe.add(topic, object())
            with pytest.raises(TypeError):
                await pipe.execute()
            assert client._protocol is not None and not client._protocol.pending
            assert await client.get(f"{topic}-packable") is None  # not sent
            assert await client.ping() == "pong"

    asyncio.run(main())
