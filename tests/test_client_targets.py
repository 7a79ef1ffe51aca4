"""``delaywheel_client.targets``: the maps it builds, and the same maps read back from a
real server.

The server (one per module) has a Redis store, so ``store`` is a broker, plus a Redis
broker ``r`` (the same Redis), a RabbitMQ broker ``q`` and a NATS broker ``n`` (both run
on this machine: a test of the server skips when either does not answer, see
tests/services.py), and lets HTTP targets point at 127.0.0.1. Tasks are added an hour
ahead, so nothing is delivered; the server keeps a target with every field present,
which is what the constructors build, so a round trip gives back the very map sent.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from conftest import free_port
from delaywheel_client import AsyncClient, BadRequest, Client, targets
from serverproc import ServerProcess
from targetserver import server as server  # the module's server

HOOK = f"http://127.0.0.1:{free_port()}/hook"  # nothing listens: never called an hour ahead
HOUR_S = 3600

# -- the maps, as docs/protocol.md spells them ----------------------------------------------------


def test_constructors_build_the_protocol_maps() -> None:
    assert targets.QUEUE == {"type": "queue"}
    assert targets.http("https://example.com/hook") == {
        "type": "http",
        "url": "https://example.com/hook",
        "method": "POST",
        "headers": {},
        "timeout": 10.0,
    }
    assert targets.http(
        "https://example.com/hook", method="PUT", headers={"X-A": "1"}, timeout_s=2.5
    ) == {
        "type": "http",
        "url": "https://example.com/hook",
        "method": "PUT",
        "headers": {"X-A": "1"},
        "timeout": 2.5,
    }
    assert targets.redis_list("jobs") == {
        "type": "redis", "key": "jobs", "mode": "list", "broker": "store"
    }  # fmt: skip
    assert targets.redis_stream("events", broker="cache") == {
        "type": "redis", "key": "events", "mode": "stream", "broker": "cache"
    }  # fmt: skip
    assert targets.amqp("work", broker="q") == {
        "type": "amqp", "broker": "q", "exchange": "", "routing_key": "work"
    }  # fmt: skip
    assert targets.amqp("work", broker="q", exchange="ex")["exchange"] == "ex"
    assert targets.nats("jobs.due", broker="n") == {
        "type": "nats", "broker": "n", "subject": "jobs.due"
    }  # fmt: skip


def test_headers_are_copied() -> None:
    headers = {"X-A": "1"}
    target = targets.http("https://example.com/", headers=headers)
    headers["X-B"] = "2"
    assert target["headers"] == {"X-A": "1"}


def test_exported_from_the_package() -> None:
    import delaywheel_client

    assert delaywheel_client.targets is targets
    assert "targets" in delaywheel_client.__all__


# -- against the server --------------------------------------------------------------------------


ROUND_TRIPS = {
    "http": targets.http(HOOK),
    "http-all-fields": targets.http(
        HOOK, method="DELETE", headers={"Authorization": "Bearer t0k"}, timeout_s=2.5
    ),
    "redis-list": targets.redis_list("jobs"),
    "redis-stream": targets.redis_stream("events"),
    "redis-named-broker": targets.redis_list("jobs", broker="r"),
    "amqp": targets.amqp("work", broker="q"),
    "amqp-exchange": targets.amqp("work", broker="q", exchange="amq.direct"),
    "nats": targets.nats("jobs.due", broker="n"),
}


@pytest.mark.parametrize("target", ROUND_TRIPS.values(), ids=ROUND_TRIPS.keys())
def test_add_then_get_gives_the_target_back(
    client: Client, topic: str, target: dict[str, Any]
) -> None:
    placed = client.add(topic, {"n": 1}, delay=HOUR_S, target=target)
    task = client.get(placed["id"])
    assert task is not None
    assert task["target"] == target
    assert task["state"] == "delayed"


@pytest.mark.parametrize("target", ROUND_TRIPS.values(), ids=ROUND_TRIPS.keys())
def test_update_sets_the_target(client: Client, topic: str, target: dict[str, Any]) -> None:
    placed = client.add(topic, "x", delay=HOUR_S)
    assert client.update(placed["id"], target=target)["target"] == target
    assert client.update(placed["id"], target=targets.QUEUE)["target"] == targets.QUEUE
    assert targets.QUEUE == {"type": "queue"}  # sent, not changed


def test_pipeline_and_async_client_take_targets(server: ServerProcess, topic: str) -> None:
    with Client(*server.address) as dw:
        with dw.pipeline() as pipe:
            pipe.add(topic, 1, delay=HOUR_S, target=targets.nats("a", broker="n"))
            pipe.add(topic, 2, delay=HOUR_S, target=targets.redis_list("b"))
        got = [dw.get(placed["id"]) for placed in pipe.results]
    assert [task["target"] for task in got if task is not None] == [
        targets.nats("a", broker="n"),
        targets.redis_list("b"),
    ]

    async def main() -> None:
        dw = await AsyncClient.connect(*server.address)
        try:
            placed = await dw.add(topic, 3, delay=HOUR_S, target=targets.amqp("c", broker="q"))
            task = await dw.get(placed["id"])
            assert task is not None and task["target"] == targets.amqp("c", broker="q")
        finally:
            await dw.close()

    asyncio.run(main())


@pytest.mark.parametrize(
    ("target", "needle"),
    [
        (targets.http("http://10.1.2.3/hook"), "10.1.2.3"),
        (targets.http(HOOK, method="FETCH"), "FETCH"),
        (targets.http(HOOK, timeout_s=0), "timeout"),
        (targets.amqp("rk", broker="nosuch"), "nosuch"),
        (targets.nats("s", broker="q"), "'q'"),  # a broker of another kind
    ],
)
def test_refused_targets_are_bad_requests_naming_them(
    client: Client, topic: str, target: dict[str, Any], needle: str
) -> None:
    with pytest.raises(BadRequest) as raised:
        client.add(topic, delay=HOUR_S, target=target)
    assert needle in str(raised.value)


def test_dead_task_carries_last_error_and_is_kicked(client: Client, topic: str) -> None:
    """The client needs nothing new for ``dead`` tasks: a task is a plain dict, so
    ``last_error`` and the new states come through; ``list`` and ``kick`` take them."""
    gone = targets.http(f"http://127.0.0.1:{free_port()}/gone")
    placed = client.add(topic, "x", target=gone, max_attempts=1)
    deadline = time.monotonic() + 20
    while (task := client.get(placed["id"])) is None or task["state"] != "dead":
        assert time.monotonic() < deadline, f"task never went dead: {task}"
        time.sleep(0.05)
    assert isinstance(task["last_error"], str) and task["last_error"]
    page = client.list(topic=topic, state="dead")
    assert [t["id"] for t in page["tasks"]] == [placed["id"]]
    assert [t["id"] for t in client.iter_tasks(topic=topic, state="dead")] == [placed["id"]]
    assert client.kick(topic, 10) == 1
    assert client.reserve(topic) is None  # a targeted task never reaches the ready queue
