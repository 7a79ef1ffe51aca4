"""Several nodes on one Redis (issue 16's bench figures).

- ``--replicas 1`` against ``--replicas 0``: ``add`` one call at a time
  (``bench._loads.drive``), each mode against the same private primary (AOF
  on) with one local replica, under its own ``--redis-prefix``; the modes
  alternate, ``rounds`` each, the median rate is the figure.
- Takeover: a keyspace of one partition (``--partitions 1``, ``--lease 3``)
  whose node ``a`` holds 100,000 tasks, all due 0.5 s after the kill; node
  ``b`` stands by. ``a`` is killed with SIGKILL; the figures are the time from
  the kill to ``b``'s first ready task (``stats``, polled every 10 ms) and to
  all of them, against 2 L.
- Two nodes against one: 8 client processes, each a ``ClusterClient`` over
  every node's address, adding one call at a time for ``round_s``; the rate
  with two nodes on one Redis over the rate with one (no target: the
  machine has 2 cores, which the client processes share with the nodes).
``quick``: 5,000 tasks, short rounds.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from delaywheel_client import ClusterClient

from bench import Figure, Report, Target, progress
from bench._loads import BODY, DELAY_S, TOPIC, drive, dw_client
from bench._procs import _wait_for_port, free_port, private_redis_process, server_process
from bench.fire import add_in_batches, ready_count

LEASE_S = 3.0
CLIENT_PROCESSES = 8
POLL_S = 0.01
FILL_RATE_GUESS = 10_000  # add_many into Redis, tasks/s at worst here
START_LEAD_S = 2.0  # from handing the client processes their round to its start


@dataclass(frozen=True)
class Plan:
    rounds: int
    round_s: float
    takeover_tasks: int


FULL = Plan(rounds=3, round_s=5.0, takeover_tasks=100_000)
QUICK = Plan(rounds=1, round_s=0.5, takeover_tasks=5_000)


@contextmanager
def replica_of(primary_url: str, directory: Path) -> Iterator[None]:
    """A local redis-server replicating ``primary_url``, linked before it yields."""
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    primary_port = primary_url.rsplit(":", 1)[1].split("/")[0]
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--dir", str(directory), "--replicaof", "127.0.0.1", primary_port],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        _wait_for_port(port)
        deadline = time.monotonic() + 10
        while (
            b"master_link_status:up"
            not in subprocess.run(
                ["redis-cli", "-p", str(port), "info", "replication"], capture_output=True
            ).stdout
        ):
            if time.monotonic() > deadline:
                raise RuntimeError("the replica did not link to its primary")
            time.sleep(0.05)
        yield
    finally:
        proc.terminate()
        proc.wait()


def node_args(name: str, prefix: str, *more: str) -> tuple[str, ...]:
    # A port of its own (the later --port wins over server_process's 0), so
    # that the address `cluster` gives clients is one they can reach.
    port = free_port()
    return (
        "--port", str(port), "--advertise", f"127.0.0.1:{port}",
        "--node", name, "--redis-prefix", prefix, "--lease", str(LEASE_S), *more,
    )  # fmt: skip


def replicas_rates(redis_url: str, plan: Plan) -> dict[int, list[float]]:
    rates: dict[int, list[float]] = {0: [], 1: []}
    with ExitStack() as nodes:
        addresses = {}
        for replicas in (0, 1):
            args = node_args(f"r{replicas}", f"bench-r{replicas}", "--replicas", str(replicas))
            addresses[replicas] = nodes.enter_context(server_process(redis_url, args=args))
        for number in range(plan.rounds):
            for replicas in (0, 1):
                pid, address = addresses[replicas]
                run = drive("add", address, pid, plan.round_s)
                rates[replicas].append(run.rate)
                progress(f"round {number + 1}: --replicas {replicas}: {run.rate:,.0f} adds/s")
    return rates


def takeover_s(redis_url: str, tasks: int) -> tuple[float, float]:
    """(kill to first ready, kill to all ready) at the node left standing."""
    prefix = "bench-takeover"
    with ExitStack() as running:
        nodes = {
            name: running.enter_context(
                server_process(redis_url, args=node_args(name, prefix, "--partitions", "1"))
            )
            for name in ("a", "b")
        }
        time.sleep(2 * LEASE_S / 3 + 1.0)  # the one partition settles on its first-ranked node
        with dw_client(nodes["a"][1]) as client:
            owner = client.cluster()["owners"][0]["node"]
        (owner_pid, owner_address), (_, other_address) = (
            nodes[owner],
            nodes["b" if owner == "a" else "a"],
        )
        progress(f"takeover: {tasks:,} tasks into node {owner}, the partition's owner")
        # Due 0.5 s after the kill: the owner never fires them, the other finds them overdue.
        due_s = time.time() + tasks / FILL_RATE_GUESS + 1.0
        add_in_batches(
            owner_address, ({"topic": "due", "body": BODY, "at": due_s} for _ in range(tasks))
        )
        if time.time() > due_s - 0.5:
            raise RuntimeError("the fill ended too late: lower FILL_RATE_GUESS")
        time.sleep(due_s - 0.5 - time.time())
        os.kill(owner_pid, signal.SIGKILL)
        killed_s = time.time()
        first_s = all_s = float("nan")
        with dw_client(other_address) as client:
            while time.time() < killed_s + 60:
                ready = ready_count(client.stats())
                if ready and first_s != first_s:
                    first_s = time.time() - killed_s
                if ready >= tasks:
                    all_s = time.time() - killed_s
                    break
                time.sleep(POLL_S)
        return first_s, all_s


def cluster_client_process(
    seeds: list[str], start_at: float, duration_s: float
) -> tuple[int, float, float]:
    """One client process: a ClusterClient adding one call at a time (runs in the child)."""
    with ClusterClient(seeds) as client:
        for _ in range(10):
            client.add(TOPIC, BODY, delay=DELAY_S)
        time.sleep(max(0.0, start_at - time.monotonic()))
        started = time.monotonic()
        # A process that got here late (a loaded machine: 10 s of start-up
        # once left every one past the round, 0 adds) still runs a round.
        deadline = max(start_at, started) + duration_s
        adds = 0
        while time.monotonic() < deadline:
            client.add(TOPIC, BODY, delay=DELAY_S)
            adds += 1
        return adds, started, time.monotonic()


def nodes_rate(redis_url: str, nodes: int, round_s: float, pool: ProcessPoolExecutor) -> float:
    prefix = f"bench-nodes{nodes}"
    with ExitStack() as running:
        seeds = []
        for n in range(nodes):
            _, (host, port) = running.enter_context(
                server_process(redis_url, args=node_args(f"n{n}", prefix))
            )
            seeds.append(f"{host}:{port}")
        with ClusterClient(seeds) as client:  # every partition owned before the round
            deadline = time.monotonic() + 4 * LEASE_S
            while sum(o["node"] is not None for o in client.cluster()["owners"]) < 16:
                if time.monotonic() > deadline:
                    raise RuntimeError("the nodes did not take every partition")
                time.sleep(0.1)
            time.sleep(1.0)  # let a joining node's rebalance settle
        # Room for each process to start, connect and warm up before the round:
        # with 0.5 s, a loaded machine's first round (new worker processes)
        # once counted no add at all in the quick run.
        start_at = time.monotonic() + START_LEAD_S
        futures = [
            pool.submit(cluster_client_process, seeds, start_at, round_s)
            for _ in range(CLIENT_PROCESSES)
        ]
        shares = [future.result() for future in futures]
    elapsed_s = max(end for _, _, end in shares) - min(start for _, start, _ in shares)
    return sum(adds for adds, _, _ in shares) / elapsed_s


def run(quick: bool = False) -> Report:
    started = time.perf_counter()
    plan = QUICK if quick else FULL
    with (
        tempfile.TemporaryDirectory() as directory,
        private_redis_process(Path(directory)) as redis,
    ):
        if redis is None:
            raise RuntimeError("redis-server is not installed")
        _, redis_url = redis
        with replica_of(redis_url, Path(directory) / "replica"):
            rates = replicas_rates(redis_url, plan)
        first_s, all_s = takeover_s(redis_url, plan.takeover_tasks)
        progress(f"takeover: first ready {first_s:.2f} s, all {all_s:.2f} s after the kill")
        with ProcessPoolExecutor(max_workers=CLIENT_PROCESSES) as pool:
            one = nodes_rate(redis_url, 1, plan.round_s, pool)
            two = nodes_rate(redis_url, 2, plan.round_s, pool)
        progress(
            f"{CLIENT_PROCESSES} ClusterClient processes: 1 node {one:,.0f}/s, 2 nodes {two:,.0f}/s"
        )
    r0, r1 = statistics.median(rates[0]), statistics.median(rates[1])
    figures = [
        Figure("add_replicas0", "add one at a time, --replicas 0", r0, "/s", runs=tuple(rates[0])),
        Figure("add_replicas1", "  --replicas 1, a local replica", r1, "/s", runs=tuple(rates[1])),
        Figure(
            "replicas_ratio", "  --replicas 1 over --replicas 0", r1 / r0, "x", Target(">=", 0.6)
        ),
        Figure(
            "takeover_first_s",
            f"takeover of one partition of {plan.takeover_tasks:,} tasks: kill -9 to first ready",
            first_s,
            "s",
            Target("<=", 2 * LEASE_S),
            note=f"L = {LEASE_S:g} s; all ready {all_s:.2f} s after the kill",
        ),
        Figure("nodes1_rate", f"{CLIENT_PROCESSES} ClusterClient processes, one node", one, "/s"),
        Figure("nodes2_rate", "  two nodes on the same Redis", two, "/s"),
        Figure("nodes_ratio", "  two nodes over one", two / one, "x", note="2 cores: no target"),
    ]
    return Report(
        "ha",
        f"several nodes on one Redis{' (quick)' if quick else ''}: replicas, takeover, two nodes",
        figures,
        params={
            "quick": quick,
            "rounds": plan.rounds,
            "round_s": plan.round_s,
            "takeover_tasks": plan.takeover_tasks,
            "lease_s": LEASE_S,
        },
        elapsed_s=time.perf_counter() - started,
    )
