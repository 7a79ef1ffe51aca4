"""The CLI on several nodes: ``--server`` as a comma-separated list (the commands then use
``ClusterClient``) and ``delaywheel cluster``, against real nodes on one Redis keyspace
(tests/clusternodes.py) and, for the one-node map, the module's memory-store server.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from clusternodes import PARTITIONS, address
from clusternodes import two_nodes as two_nodes
from delaywheel_client import Client
from delaywheel_client.routing import partition_of
from serverproc import ServerProcess

from delaywheel.cli import main

pytestmark = [pytest.mark.process, pytest.mark.redis]


def _servers(nodes: list[ServerProcess]) -> str:
    return ",".join(address(node) for node in nodes)


def cli(servers: str, *args: str) -> Result:
    return CliRunner().invoke(main, ["--server", servers, *args])


def cli_json(servers: str, *args: str) -> Any:
    result = cli(servers, "--json", *args)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return json.loads(result.stdout)


def test_a_server_list_routes_each_task_to_its_owner(
    two_nodes: list[ServerProcess], topic: str
) -> None:
    servers = _servers(two_nodes)
    cluster = cli_json(servers, "cluster")
    owner_of = {e["partition"]: e["address"] for e in cluster["owners"]}
    ids = [cli_json(servers, "add", "--topic", topic, "--delay", "1h")["id"] for _ in range(12)]
    assert {owner_of[partition_of(task_id, PARTITIONS)] for task_id in ids} == {
        address(node) for node in two_nodes
    }
    for task_id in ids:
        assert cli_json(servers, "get", task_id)["topic"] == topic
        owner = owner_of[partition_of(task_id, PARTITIONS)]
        with Client(*next(n for n in two_nodes if address(n) == owner).address) as direct:
            assert direct.get(task_id) is not None  # stored at its owner
    listed = cli_json(servers, "list", "--topic", topic, "--all")
    assert sorted(t["id"] for t in listed["tasks"]) == sorted(ids)
    stats = cli_json(servers, "stats")
    assert sorted(stats["nodes"]) == sorted(address(node) for node in two_nodes)
    ping = cli(servers, "ping")
    listed_servers = servers.replace(",", ", ")
    assert ping.exit_code == 0 and ping.stdout.startswith(f"pong from {listed_servers} in ")
    for task_id in ids:
        assert cli(servers, "delete", task_id).exit_code == 0
    assert cli(servers, "get", ids[0]).exit_code == 1  # gone: not found


def test_a_cluster_list_pages_by_a_cursor_naming_the_node(
    two_nodes: list[ServerProcess], topic: str
) -> None:
    servers = _servers(two_nodes)
    added = {cli_json(servers, "add", "--topic", topic, "--delay", "1h")["id"] for _ in range(6)}
    seen: list[str] = []
    page = cli_json(servers, "list", "--topic", topic, "--limit", "2")
    while True:
        seen += [t["id"] for t in page["tasks"]]
        if page["next"] is None:
            break
        assert page["next"][0] in servers.split(",")  # ["host:port", that node's cursor]
        cursor = json.dumps(page["next"])
        page = cli_json(servers, "list", "--topic", topic, "--limit", "2", "--cursor", cursor)
    assert sorted(seen) == sorted(added)
    text = cli(servers, "list", "--topic", topic, "--limit", "1")
    assert "--cursor '[" in text.stderr  # the hint is pasteable
    bad = cli(servers, "list", "--cursor", "nope")
    assert bad.exit_code == 2 and "'nope'" in bad.stderr


def test_cluster_prints_the_map_and_the_owned_count_per_node(
    two_nodes: list[ServerProcess],
) -> None:
    first = address(two_nodes[0])
    with Client(*two_nodes[0].address) as direct:
        expected = direct.cluster()
    assert cli_json(first, "cluster")["owners"] == expected["owners"]  # as the server sent it
    result = cli(first, "cluster")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"{PARTITIONS} partitions, lease 3s, as node a sees it"
    header = lines[2].split()
    assert header == ["PARTITION", "NODE", "ADDRESS", "EPOCH"]
    rows = [line.split() for line in lines[3 : 3 + PARTITIONS]]
    assert [int(row[0]) for row in rows] == list(range(PARTITIONS))
    assert {(row[1], row[2]) for row in rows} == {("a", first), ("b", address(two_nodes[1]))}
    for row, entry in zip(rows, expected["owners"], strict=True):
        assert row[1:] == [entry["node"], entry["address"], str(entry["epoch"])]
    per_node = [line.split() for line in lines[3 + PARTITIONS + 1 :]]
    assert per_node[0] == ["NODE", "ADDRESS", "OWNED"]
    owned = {row[0]: int(row[2]) for row in per_node[1:]}
    assert set(owned) == {"a", "b"} and sum(owned.values()) == PARTITIONS
    assert all(count > 0 for count in owned.values())


def test_cluster_of_one_server_without_partitions(server: ServerProcess) -> None:
    result = cli(f"{server.host}:{server.port}", "cluster")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines()[0].startswith("1 partition, ")
    assert f"{server.host}:{server.port}" in result.stdout


@pytest.mark.parametrize(
    ("servers", "needle"),
    [
        ("127.0.0.1:3450,,127.0.0.1:3451", "an empty address in the list"),
        (" , ", "expected HOST:PORT or a comma-separated list"),
        ("127.0.0.1:3450,h:99999", "port must be 1 to 65535, got 99999 in 'h:99999'"),
        ("127.0.0.1:3450,h:port", "expected HOST:PORT, got 'h:port'"),
    ],
)
def test_a_bad_server_list_is_a_usage_error_naming_the_value(servers: str, needle: str) -> None:
    result = CliRunner().invoke(main, ["--server", servers, "ping"])
    assert result.exit_code == 2
    assert needle in " ".join(result.stderr.split())
    assert "Traceback" not in result.stderr


def test_nodes_that_cannot_be_reached_exit_3() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "delaywheel", "--server", "127.0.0.1:1,127.0.0.1:2", "cluster"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 3, done.stderr
    assert "no node answered cluster" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1  # one line, no traceback


def test_one_address_of_several_answers_moved_naming_the_owner(
    two_nodes: list[ServerProcess], topic: str
) -> None:
    servers = _servers(two_nodes)
    first, second = (address(node) for node in two_nodes)
    owner_of = {e["partition"]: e["address"] for e in cli_json(first, "cluster")["owners"]}
    ids = (f"m{n}" for n in range(1000))
    task_id = next(i for i in ids if owner_of[partition_of(i, PARTITIONS)] == second)
    assert cli(servers, "add", "--topic", topic, "--id", task_id, "--body", "x").exit_code == 0
    alone = cli(first, "get", task_id)
    assert alone.exit_code == 1
    assert alone.stderr.startswith("moved: task ") and f"owned by b at {second}" in alone.stderr


def test_the_readmes_several_nodes_example(two_nodes: list[ServerProcess]) -> None:
    """README.md's block, as typed but for the addresses (the two nodes are this module's,
    started as its serve lines say: one Redis keyspace, --node a and b)."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    block = readme.split("delaywheel serve --store redis://127.0.0.1:6379/0 --port 3450")[1]
    block = block.split("```")[0]
    lines = [line.split("#")[0].strip() for line in block.splitlines()]
    export = next(line for line in lines if line.startswith("export DELAYWHEEL_SERVER="))
    assert export == "export DELAYWHEEL_SERVER=127.0.0.1:3450,127.0.0.1:3451"
    commands = [shlex.split(line)[1:] for line in lines if line.startswith("delaywheel ")]
    commands = [args for args in commands if args[0] != "serve"]
    assert [args[0] for args in commands] == ["cluster", "--json", "add", "get", "stats"]
    env = {"DELAYWHEEL_SERVER": _servers(two_nodes)}
    outputs = []
    for args in commands:
        result = CliRunner().invoke(main, args, env=env)
        assert result.exit_code == 0, (args, result.stderr)
        outputs.append(result.stdout)
    assert "PARTITION  NODE" in outputs[0] and json.loads(outputs[1])["partitions"] == PARTITIONS
    assert "hello-1" in outputs[3]
    assert cli(_servers(two_nodes), "delete", "hello-1").exit_code == 0
