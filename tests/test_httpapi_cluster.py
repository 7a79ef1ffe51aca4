"""The HTTP API on two nodes of one keyspace: any node answers any request, forwarding
what the other owns over the native protocol, and reserve collects from both."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from apicalls import Api, api_url
from clusternodes import PARTITIONS, node_pair, served
from delaywheel_client import Client
from delaywheel_client.partitions import partition_of
from serverproc import ServerProcess
from waiting import wait_until

pytestmark = [pytest.mark.process, pytest.mark.redis, pytest.mark.slow]


@pytest.fixture(scope="module")
def nodes(module_redis_url: str) -> Iterator[list[ServerProcess]]:
    with node_pair(module_redis_url, "--api-port", "0") as procs:
        yield procs


def ids_owned_by(proc: ServerProcess, prefix: str, count: int) -> list[str]:
    owned = served(proc)
    found = []
    n = 0
    while len(found) < count:
        task_id = f"{prefix}-{n}"
        if partition_of(task_id, PARTITIONS) in owned:
            found.append(task_id)
        n += 1
    return found


def test_a_node_forwards_what_the_other_owns(nodes: list[ServerProcess]) -> None:
    a, b = nodes
    api_a = Api(api_url(a))
    try:
        for task_id in ids_owned_by(b, "fwd", 5):
            added = api_a.request("POST", "/tasks", {"id": task_id, "topic": "fwd", "delay": 600})
            assert added.status == 201 and added.data["id"] == task_id, added.text
            with Client(*b.address) as on_b:  # it lives on b, the owner
                assert on_b.get(task_id)["topic"] == "fwd"
            got = api_a.request("GET", f"/tasks/{task_id}")
            assert got.status == 200 and got.data["id"] == task_id
            changed = api_a.request("PATCH", f"/tasks/{task_id}", {"body": "changed"})
            assert changed.status == 200 and changed.data["body"] == "changed"
            dup = api_a.request("POST", "/tasks", {"id": task_id, "topic": "fwd"})
            assert dup.status == 409 and dup.data["code"] == "exists"  # the owner's answer
            assert api_a.request("DELETE", f"/tasks/{task_id}").data == {"deleted": True}
            missing = api_a.request("GET", f"/tasks/{task_id}")
            assert missing.status == 404 and missing.data["code"] == "not_found"
            assert "moved" not in missing.text and "tryagain" not in missing.text
    finally:
        api_a.close()


def test_add_many_across_owners_and_list_from_both(nodes: list[ServerProcess]) -> None:
    a, b = nodes
    mine, theirs = ids_owned_by(a, "many", 3), ids_owned_by(b, "many", 3)
    api_b = Api(api_url(b))
    try:
        tasks = [{"id": i, "topic": "many", "delay": 600} for i in mine + theirs]
        added = api_b.request("POST", "/tasks", {"tasks": tasks})
        assert added.status == 201, added.text
        assert [t["id"] for t in added.data["tasks"]] == mine + theirs
        seen: list[str] = []
        cursor = ""
        while True:
            page = api_b.request("GET", f"/tasks?topic=many&limit=2{cursor}")
            assert page.status == 200, page.text
            seen += [t["id"] for t in page.data["tasks"]]
            if page.data["next"] is None:
                break
            cursor = f"&cursor={page.data['next']}"
        assert sorted(seen) == sorted(mine + theirs)
        stats = api_b.request("GET", "/stats")
        assert stats.status == 200
    finally:
        api_b.close()


def test_reserve_collects_from_every_node(nodes: list[ServerProcess]) -> None:
    a, b = nodes
    api_a = Api(api_url(a))
    try:
        for task_id in ids_owned_by(b, "far", 2):
            assert api_a.request("POST", "/tasks", {"id": task_id, "topic": "far"}).status == 201
        got = set()
        for _ in range(2):
            reserved = api_a.request("POST", "/topics/far/reserve?timeout=5")
            assert reserved.status == 200, reserved.text
            got.add(reserved.data["id"])
            acked = api_a.request("POST", f"/tasks/{reserved.data['id']}/ack")
            assert acked.status == 200 and acked.data == {"acked": True}
        assert got == set(ids_owned_by(b, "far", 2))
        assert api_a.request("POST", "/topics/far/reserve?timeout=0.2").status == 204
    finally:
        api_a.close()


def test_a_wait_is_held_by_the_tasks_owner(nodes: list[ServerProcess]) -> None:
    a, b = nodes
    (task_id,) = ids_owned_by(b, "waited", 1)
    api_a = Api(api_url(a))
    waited: dict[str, Any] = {}

    def long_poll() -> None:
        poller = Api(api_url(a))
        try:
            waited["reply"] = poller.request("GET", f"/tasks/{task_id}/wait?timeout=30")
        finally:
            poller.close()

    try:
        added = api_a.request("POST", "/tasks", {"id": task_id, "topic": "waited", "retain": 60})
        assert added.status == 201, added.text
        thread = threading.Thread(target=long_poll, daemon=True)
        thread.start()
        with Client(*b.address) as on_b:  # a forwards the wait to b, the owner
            wait_until(lambda: on_b.stats()["blocked_waits"] == 1, 10, "the wait held on b")
            assert on_b.reserve("waited", 5)["id"] == task_id  # type: ignore[index]
            on_b.ack(task_id, {"on": "b"})
        thread.join(30)
        reply = waited["reply"]
        assert reply.status == 200 and reply.data["result"] == {"on": "b"}, reply.text
    finally:
        api_a.close()
