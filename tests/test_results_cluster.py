"""Completed tasks on two nodes of one Redis keyspace: the cluster clients
send ``wait`` and ``ack``'s result to each task's owner, a wait blocks there
until the ack (sent by another client) makes the task done."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from clusternodes import PARTITIONS, address, served, two_nodes  # noqa: F401  (a fixture)
from delaywheel_client import AsyncClusterClient, ClusterClient
from delaywheel_client.partitions import partition_of
from serverproc import ServerProcess

pytestmark = [pytest.mark.process, pytest.mark.redis]


@pytest.fixture
def dw(two_nodes: list[ServerProcess]) -> Iterator[ClusterClient]:  # noqa: F811
    with ClusterClient([address(proc) for proc in two_nodes]) as client:
        yield client


def test_results_and_waits_go_to_each_tasks_owner(
    two_nodes: list[ServerProcess],  # noqa: F811
    dw: ClusterClient,
) -> None:
    ids = [f"owned-{i}" for i in range(8)]
    wanted = {partition_of(task_id, PARTITIONS) for task_id in ids}
    assert all(wanted & served(proc) for proc in two_nodes)  # both nodes own some of them
    for task_id in ids:
        dw.add("cluster-results", {"i": task_id}, id=task_id, retain=60)
    answers: dict[str, Any] = {}

    def wait_all() -> None:
        async def main() -> None:
            async with AsyncClusterClient([address(p) for p in two_nodes]) as waiter:
                found = await asyncio.gather(*(waiter.wait(task_id, 30) for task_id in ids))
            answers.update(zip(ids, found, strict=True))

        asyncio.run(main())

    thread = threading.Thread(target=wait_all, daemon=True)
    thread.start()
    for _ in ids:
        task = dw.reserve("cluster-results", 10)
        assert task is not None
        assert dw.ack(task["id"], {"done_by": "worker", "i": task["body"]["i"]}) is True
    thread.join(60)
    assert not thread.is_alive()
    assert {task_id: (a["state"], a["result"]["i"]) for task_id, a in answers.items()} == {
        task_id: ("done", task_id) for task_id in ids
    }
    for task_id in ids:
        assert dw.get(task_id)["outcome"] == "acked"  # type: ignore[index]
    listed = {task["id"] for task in dw.iter_tasks(topic="cluster-results", state="done")}
    assert listed == set(ids)  # list visits every node
