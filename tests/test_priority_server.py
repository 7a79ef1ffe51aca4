"""Task priority on a real server: kept across a kill -9 on SQLite and Redis,
the order deliveries to a busy destination start in, and the CLI."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from delaywheel_client import Client
from endpoint import Endpoint
from endpoint import endpoint as endpoint  # the fixture
from helpers import cli, cli_json, unique
from serverproc import ServerProcess
from waiting import wait_until

pytestmark = pytest.mark.process


def test_priorities_and_their_order_survive_a_kill_9(durable_store_url: str) -> None:
    proc = ServerProcess(store=durable_store_url)
    try:
        with Client(*proc.address) as dw:
            priorities = [1024, 7, 2**31 - 1, 7, 0, 1024, 300]
            ids = [dw.add("jobs", n, priority=p)["id"] for n, p in enumerate(priorities)]
            dw.update(ids[5], priority=1)
            assert dw.get(ids[5])["priority"] == 1
        proc.kill()
        proc.start()
        with Client(*proc.address) as dw:
            assert [dw.get(task_id)["priority"] for task_id in ids] == [
                1024, 7, 2**31 - 1, 7, 0, 1, 300,
            ]  # fmt: skip
            order = []
            while (task := dw.reserve("jobs", 0)) is not None:
                order.append(task["body"])
                dw.ack(task["id"])
            assert order == [4, 5, 1, 3, 6, 0, 2]
    finally:
        proc.stop()


@pytest.fixture
def one_at_a_time() -> Iterator[ServerProcess]:
    proc = ServerProcess("--http-allow", "127.0.0.1", "--http-concurrency", "1")
    try:
        yield proc
    finally:
        proc.stop()


@pytest.mark.slow
def test_deliveries_waiting_for_a_busy_destination_start_most_urgent_first(
    one_at_a_time: ServerProcess, endpoint: Endpoint
) -> None:
    endpoint.slow_s = 0.3
    target = {"type": "http", "url": endpoint.url("/slow")}
    with Client(*one_at_a_time.address) as dw:
        dw.add("hooks", "blocker", target=target)
        wait_until(lambda: endpoint.in_flight == 1, 10, "the first delivery to start")
        # Due together while the one place is taken: they wait in the lane.
        priorities = [1024, 50, 5000, 50, 0, 1024]
        dw.add_many(
            [
                {"topic": "hooks", "body": f"n{n}", "priority": p, "target": target}
                for n, p in enumerate(priorities)
            ]
        )
        wait_until(lambda: len(endpoint.requests()) == 7, 20, "every delivery")
    bodies = [seen.body.decode() for seen in endpoint.requests()]  # a str body goes as text
    assert bodies == ["blocker", "n4", "n1", "n3", "n0", "n5", "n2"]


def test_the_cli_adds_updates_and_shows_a_priority(address: str) -> None:
    topic = unique()
    urgent = cli_json(address, "add", "--topic", topic, "--priority", "0")["id"]
    plain = cli_json(address, "add", "--topic", topic)["id"]
    assert cli_json(address, "get", urgent)["priority"] == 0
    shown = cli_json(address, "update", plain, "--priority", "5")
    assert shown["priority"] == 5
    table = cli(address, "list", "--topic", topic).stdout.splitlines()
    assert table[0].split()[3] == "PRI"
    assert [row.split()[3] for row in table[1:]] == ["0", "5"]
    assert "priority: 0" in cli(address, "get", urgent).stdout
    refused = cli(address, "add", "--topic", topic, "--priority", "-1")
    assert refused.exit_code == 2 and "-1" in refused.stderr
    # A schedule's occurrences take the priority of its template.
    schedule = unique("s")
    cli_json(address, "schedule", "add", schedule, "--every", "1h", "--topic", topic,
             "--priority", "3")  # fmt: skip
    occurrence = cli_json(address, "schedule", "trigger", schedule)["id"]
    assert cli_json(address, "get", occurrence)["priority"] == 3
    updated = cli_json(address, "schedule", "update", schedule, "--unset", "priority")
    assert "priority" not in updated
