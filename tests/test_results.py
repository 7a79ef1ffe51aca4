"""Completed tasks kept with their results (``retain``, ``done``, ``wait``), on a
real server over SQLite and over Redis: an ack's result and an HTTP target's
answer round-trip, ``wait`` is answered on ack, death, delete and timeout,
a done task goes when its retain is over, also across a ``kill -9``."""

from __future__ import annotations

import asyncio
import base64
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from delaywheel_client import AsyncClient, Client, Worker
from delaywheel_client.errors import Conflict, NotFound, TooLarge
from endpoint import Endpoint, endpoint  # noqa: F401  (a fixture, used by name)
from flowcheck import Waiting
from helpers import unique
from serverproc import ServerProcess, free_port

pytestmark = pytest.mark.process

STORES = [pytest.param("sqlite"), pytest.param("redis", marks=pytest.mark.redis)]
MAX_RESULT = 1024  # the module server's --max-result
# Generous bounds: the machine is shared; a tick is 0.05 s.
SETTLE_S = 10.0


def _store_url(kind: str, request: pytest.FixtureRequest, directory: Path, redis: str) -> str:
    if kind == "sqlite":
        return f"sqlite:///{directory / 'dw.db'}"
    return str(request.getfixturevalue(redis))


@pytest.fixture(scope="module", params=STORES)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    url = _store_url(request.param, request, tmp_path_factory.mktemp("results"), "module_redis_url")
    proc = ServerProcess("--http-allow", "127.0.0.1", "--max-result", str(MAX_RESULT), store=url)
    yield proc
    proc.stop()


@pytest.fixture
def client(server: ServerProcess) -> Iterator[Client]:
    with Client(*server.address) as dw:
        yield dw


def _until(check: Any, what: str, within_s: float = SETTLE_S) -> Any:
    deadline = time.monotonic() + within_s
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"{what} within {within_s} s"
        time.sleep(0.02)


def _blocked(client: Client, n: int = 1) -> None:
    """Until ``n`` waits are blocked at the server (``stats``)."""
    _until(lambda: client.stats()["blocked_waits"] >= n, f"{n} waits blocked")


# -- results ---------------------------------------------------------------------


def test_an_acks_result_is_kept_with_the_done_task(client: Client) -> None:
    topic, task_id = unique("res"), unique("r")
    client.add(topic, {"n": 1}, id=task_id, retain=60)
    reserved = client.reserve(topic, 5)
    assert reserved is not None and reserved["retain"] == 60
    before_s = time.time()
    assert client.ack(task_id, {"sum": 3, "rows": [1, 2]}) is True
    task = client.get(task_id)
    assert task is not None
    assert task["state"] == "done"
    assert task["outcome"] == "acked"
    assert task["result"] == {"sum": 3, "rows": [1, 2]}
    assert before_s - 1 <= task["completed"] <= time.time() + 1
    assert task["body"] == {"n": 1} and task["cycle"] is None and task["slot"] is None
    listed = client.list(topic=topic, state="done")["tasks"]
    assert [t["id"] for t in listed] == [task_id]
    assert client.stats()["states"]["done"] >= 1
    with pytest.raises(Conflict, match="it is done, not dead"):
        client.kick_task(task_id)
    with pytest.raises(Conflict, match="it is done"):
        client.ack(task_id)
    assert client.kick(topic, 10) == 0  # kick does not apply to done tasks
    assert client.delete(task_id) is True  # removed early
    assert client.get(task_id) is None


def test_a_task_without_retain_goes_at_its_ack_as_before(client: Client) -> None:
    topic, task_id = unique("res"), unique("r")
    client.add(topic, id=task_id)
    assert client.reserve(topic, 5) is not None
    assert client.ack(task_id, "ignored: nothing keeps it") is True
    assert client.get(task_id) is None


def test_a_result_over_max_result_is_refused_naming_its_size(client: Client) -> None:
    topic, task_id = unique("res"), unique("r")
    client.add(topic, id=task_id, retain=60)
    assert client.reserve(topic, 5) is not None
    with pytest.raises(TooLarge, match=r"result is 2003 bytes packed, over the 1024-byte limit"):
        client.ack(task_id, "x" * 2000)
    assert client.get(task_id)["state"] == "reserved"  # type: ignore[index]
    assert client.ack(task_id, "x" * 1000) is True  # within it
    assert client.get(task_id)["result"] == "x" * 1000  # type: ignore[index]


def test_an_http_targets_answer_is_the_result(
    server: ServerProcess,
    client: Client,
    endpoint: Endpoint,  # noqa: F811
) -> None:
    topic = unique("http")
    kept = client.add(
        topic, "hello, receiver", retain=60, target={"type": "http", "url": endpoint.url("/echo")}
    )["id"]
    task = client.wait(kept, SETTLE_S)
    assert task is not None and task["state"] == "done"
    assert task["outcome"] == "HTTP 200"
    assert task["result"] == {"status": 200, "body": "hello, receiver"}
    # The first --max-result bytes of a longer answer.
    long_id = client.add(
        topic, "y" * 3000, retain=60, target={"type": "http", "url": endpoint.url("/echo")}
    )["id"]
    task = client.wait(long_id, SETTLE_S)
    assert task is not None and task["result"] == {"status": 200, "body": "y" * MAX_RESULT}
    # Not retained: gone once delivered; the wait still says how it went.
    gone_id = client.add(topic, "z", target={"type": "http", "url": endpoint.url("/echo")})["id"]
    task = client.wait(gone_id, SETTLE_S)
    assert task is not None and task["state"] == "gone"
    assert task["outcome"] == "HTTP 200" and task["result"] is None
    assert client.get(gone_id) is None


def test_a_brokers_confirmation_is_published(redis_url: str) -> None:
    # A Redis store: its Redis is also the broker called "store".
    proc = ServerProcess(store=redis_url)
    try:
        with Client(*proc.address) as dw:
            task_id = dw.add(
                "pub", {"a": 1}, retain=60, target={"type": "redis", "key": "results-list"}
            )["id"]
            task = dw.wait(task_id, SETTLE_S)
    finally:
        proc.stop()
    assert task is not None and task["state"] == "done"
    assert task["outcome"] == "published" and task["result"] is None


def test_a_workers_return_value_is_the_acks_result(client: Client) -> None:
    topic = unique("worker")
    task_id = client.add(topic, {"a": 2, "b": 5}, retain=60)["id"]
    worker = Worker(client, reserve_timeout_s=1)

    @worker.handler(topic)
    def add_up(task: dict[str, Any]) -> int:
        return int(task["body"]["a"] + task["body"]["b"])

    assert worker.run(max_tasks=1) == 1
    task = client.get(task_id)
    assert task is not None and task["state"] == "done" and task["result"] == 7


# -- wait ------------------------------------------------------------------------


def test_wait_is_answered_on_ack(server: ServerProcess, client: Client) -> None:
    topic, task_id = unique("w"), unique("w")
    client.add(topic, id=task_id, retain=60)
    assert client.reserve(topic, 5) is not None
    waiting = Waiting(lambda: Client(*server.address), task_id, 30)
    _blocked(client)
    client.ack(task_id, [1, 2, 3])
    answer = waiting.result()
    assert answer["state"] == "done" and answer["result"] == [1, 2, 3]
    assert waiting.took_s < 25  # answered, not timed out
    # Already done: answered at once.
    assert client.wait(task_id, 30)["result"] == [1, 2, 3]  # type: ignore[index]


def test_wait_is_answered_on_death(server: ServerProcess, client: Client) -> None:
    topic, task_id = unique("w"), unique("w")
    client.add(topic, id=task_id, max_attempts=1)
    assert client.reserve(topic, 5) is not None
    waiting = Waiting(lambda: Client(*server.address), task_id, 30)
    _blocked(client)
    client.release(task_id)  # its last attempt: dead
    answer = waiting.result()
    assert answer["state"] == "dead" and answer["attempts"] == 1
    assert client.wait(task_id, 30)["state"] == "dead"  # type: ignore[index]


def test_wait_is_answered_on_delete(server: ServerProcess, client: Client) -> None:
    task_id = client.add(unique("w"), "body", delay=3600)["id"]
    waiting = Waiting(lambda: Client(*server.address), task_id, 30)
    _blocked(client)
    assert client.delete(task_id) is True
    answer = waiting.result()
    assert answer["state"] == "gone" and answer["id"] == task_id and "outcome" not in answer
    with pytest.raises(NotFound):
        client.wait(task_id, 1)


def test_wait_times_out_with_nil(client: Client) -> None:
    task_id = client.add(unique("w"), delay=3600)["id"]
    started = time.monotonic()
    assert client.wait(task_id, 0.5) is None
    assert time.monotonic() - started >= 0.45
    assert client.wait(task_id) is None  # timeout 0: at once
    assert client.get(task_id)["state"] == "delayed"  # type: ignore[index]


@pytest.mark.slow
def test_many_waits_on_one_connection(server: ServerProcess, client: Client) -> None:
    topic = unique("many")
    ids = [client.add(topic, i, retain=60)["id"] for i in range(20)]
    idle_id = client.add(topic, "never", delay=3600)["id"]

    async def main() -> list[Any]:
        async with AsyncClient(*server.address) as dw:
            waits = [asyncio.ensure_future(dw.wait(task_id, 30)) for task_id in ids]
            idle = asyncio.ensure_future(dw.wait(idle_id, 3))
            await asyncio.to_thread(_blocked, client, 21)
            for _ in ids:  # acked from another connection, in turn
                task = await asyncio.to_thread(client.reserve, topic, 5)
                assert task is not None
                await asyncio.to_thread(client.ack, task["id"], task["body"] * 10)
            return [*await asyncio.gather(*waits), await idle]

    *answers, idle = asyncio.run(main())
    assert [(a["id"], a["state"], a["result"]) for a in answers] == [
        (task_id, "done", i * 10) for i, task_id in enumerate(ids)
    ]
    assert idle is None  # its timeout ran out


def test_bad_waits_are_refused_naming_the_value(client: Client) -> None:
    with pytest.raises(Exception, match="timeout must be a number"):
        client.call("wait", "x", "soon")
    with pytest.raises(Exception, match="id must be a str"):
        client.call("wait", 42, 1)
    with pytest.raises(Exception, match="retain must be a number"):
        client.add(unique("w"), retain=-1)


# -- retention, and restarts -------------------------------------------------------


def test_a_done_task_goes_when_its_retain_is_over(client: Client) -> None:
    topic, task_id = unique("lapse"), unique("l")
    client.add(topic, id=task_id, retain=1.5)
    assert client.reserve(topic, 5) is not None
    client.ack(task_id, "r")
    task = client.get(task_id)
    assert task is not None and task["state"] == "done"
    lapse_s = task["completed"] + 1.5
    _until(lambda: client.get(task_id) is None, "the done task gone")
    assert time.time() >= lapse_s - 0.05  # never before its time
    assert client.stats()["states"]["done"] == len(client.list(state="done")["tasks"])


@pytest.fixture(params=STORES)
def restart_store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return _store_url(request.param, request, tmp_path, "redis_url")


@pytest.mark.slow
def test_done_tasks_survive_kill_9_and_go_on_time(restart_store: str) -> None:
    port = str(free_port())
    proc = ServerProcess("--port", port, store=restart_store)
    try:
        with Client(*proc.address) as dw:
            dw.add("t", id="short", retain=1)
            dw.add("t", id="long", retain=6)
            for _ in range(2):
                task = dw.reserve("t", 5)
                assert task is not None
                dw.ack(task["id"], {"was": task["id"]})
            long_before = dw.get("long")
        assert long_before is not None and long_before["state"] == "done"
        proc.kill()
        time.sleep(1.5)  # the short one's time passes while the server is down
        proc.start()
        with Client(*proc.address) as dw:
            # Expired while down: goes at the first ticks.
            _until(lambda: dw.get("short") is None, "the expired done task gone after a restart")
            long_after = dw.get("long")
            assert long_after == long_before  # its state, result and completion time, kept
            assert dw.stats()["states"]["done"] == 1
            _until(lambda: dw.get("long") is None, "the done task gone on time", within_s=20)
            assert time.time() >= long_before["completed"] + 6 - 0.05
    finally:
        proc.stop()


@pytest.mark.slow
def test_a_wait_is_answered_across_a_restart(restart_store: str) -> None:
    port = free_port()
    proc = ServerProcess("--port", str(port), store=restart_store)
    try:
        with Client(*proc.address) as dw:
            dw.add("t", id="across", retain=60)
            assert dw.reserve("t", 5) is not None
        # Retries enough (backing off to 1 s) to outlast the restart.
        waiting = Waiting(lambda: Client("127.0.0.1", port, retries=60), "across", 60)
        with Client(*proc.address) as dw:
            _blocked(dw)
        proc.kill()
        proc.start()
        with Client(*proc.address) as dw:
            assert dw.get("across")["state"] == "reserved"  # type: ignore[index]
            dw.ack("across", "after the restart")
        answer = waiting.result()
        assert answer["state"] == "done" and answer["result"] == "after the restart"
    finally:
        proc.stop()


def test_dead_retention_removes_dead_tasks(tmp_path: Path) -> None:
    proc = ServerProcess("--dead-retention", "1", store=f"sqlite:///{tmp_path / 'dw.db'}")
    try:
        with Client(*proc.address) as dw:
            dw.add("t", id="dies", max_attempts=1)
            assert dw.reserve("t", 5) is not None
            dw.release("dies")
            dead = dw.get("dies")
            assert dead is not None and dead["state"] == "dead"
            died_s = time.time()
            _until(lambda: dw.get("dies") is None, "the dead task gone")
            assert time.time() >= died_s + 1 - 0.1
    finally:
        proc.stop()


def test_the_http_api_shows_a_done_tasks_result(tmp_path: Path) -> None:
    from apicalls import Api, api_url

    proc = ServerProcess("--api-port", "0", store=f"sqlite:///{tmp_path / 'dw.db'}")
    api = Api(api_url(proc))
    try:
        added = api.request("POST", "/tasks", {"topic": "api", "retain": 60})
        assert added.status == 201, added.text
        task_id = added.data["id"]
        with Client(*proc.address) as dw:
            assert dw.reserve("api", 5) is not None
            dw.ack(task_id, b"\x00\xff raw")
        got = api.request("GET", f"/tasks/{task_id}")
        assert got.status == 200, got.text
        assert got.data["state"] == "done" and got.data["outcome"] == "acked"
        assert got.data["result_encoding"] == "base64"
        assert base64.b64decode(got.data["result"]) == b"\x00\xff raw"
        # Acked over HTTP, with a result.
        second = api.request("POST", "/tasks", {"topic": "api", "retain": 60}).data["id"]
        assert api.request("POST", "/topics/api/reserve").data["id"] == second
        bad = api.request("POST", f"/tasks/{second}/ack", {"outcome": "x"})
        assert bad.status == 400 and "ack takes" in bad.text
        acked = api.request("POST", f"/tasks/{second}/ack", {"result": {"rows": 3}})
        assert acked.status == 200 and acked.data == {"acked": True}, acked.text
        assert api.request("GET", f"/tasks/{second}").data["result"] == {"rows": 3}
        listed = api.request("GET", "/tasks?state=done")
        assert {t["id"] for t in listed.data["tasks"]} == {task_id, second}
        # wait: a long poll, answered once the task is done; 204 on timeout.
        assert api.request("GET", f"/tasks/{second}/wait").data["result"] == {"rows": 3}
        third = api.request("POST", "/tasks", {"topic": "api", "retain": 60}).data["id"]
        assert api.request("GET", f"/tasks/{third}/wait?timeout=0.2").status == 204
        waited: dict[str, Any] = {}

        def long_poll() -> None:
            poller = Api(api_url(proc))
            try:
                waited["reply"] = poller.request("GET", f"/tasks/{third}/wait?timeout=30")
            finally:
                poller.close()

        thread = threading.Thread(target=long_poll, daemon=True)
        thread.start()
        with Client(*proc.address) as dw:
            _blocked(dw)
            assert dw.reserve("api", 5) is not None
            dw.ack(third, "over http")
        thread.join(30)
        reply = waited["reply"]
        assert reply.status == 200 and reply.data["state"] == "done", reply.text
        assert reply.data["result"] == "over http"
    finally:
        api.close()
        proc.stop()
