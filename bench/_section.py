"""What the compare section's scenarios share (``bench/compare.py`` has the method).

The plan (full or quick), the servers every rotating scenario uses, pinning to
one CPU, alternating contenders round by round, the figures made from their
runs, and the untimed fills.
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

from bench import Figure, Target, progress
from bench._beanstalk import private_beanstalkd
from bench._loads import (
    BODY,
    FILL_BATCH,
    Address,
    Run,
    bs_client,
    drive,
    dw_client,
)
from bench._procs import private_redis_process, server_process
from bench.echo_server import running as running_echo_server


@dataclass(frozen=True)
class Plan:
    """How long and how much: the full run, or ``QUICK``."""

    rounds: int  # each contender of a scenario runs once per round
    round_s: float  # seconds one contender runs in one round
    processes: int  # client processes in the multi-process scenarios
    reserve_fill: int  # ready tasks put in before each reserve round (the round's cap)
    memory_tasks: int  # pending tasks for the memory-per-task figures


FULL = Plan(rounds=3, round_s=2.0, processes=8, reserve_fill=60_000, memory_tasks=200_000)
QUICK = Plan(rounds=1, round_s=0.3, processes=8, reserve_fill=10_000, memory_tasks=20_000)


# -- processes ------------------------------------------------------------------------


@dataclass
class Servers:
    """The servers of the rotating scenarios: name -> (pid, address)."""

    procs: dict[str, tuple[int, Address]] = field(default_factory=dict)
    redis_pid: int | None = None
    skipped: list[str] = field(default_factory=list)

    def has(self, name: str) -> bool:
        return name in self.procs

    def pid(self, name: str) -> int:
        return self.procs[name][0]

    def address(self, name: str) -> Address:
        return self.procs[name][1]

    def pids(self, *names: str) -> list[int]:
        pids = [self.pid(name) for name in names if self.has(name)]
        if self.redis_pid is not None and "dw_redis" in names and self.has("dw_redis"):
            pids.append(self.redis_pid)
        return pids


def start_servers(stack: ExitStack, directory: Path, beanstalkd: bool) -> Servers:
    """Every server the rotating scenarios use, all running until ``stack`` closes."""
    servers = Servers()
    progress("starting the echo server, delaywheel on memory, Redis and SQLite, beanstalkd")
    servers.procs["echo"] = stack.enter_context(running_echo_server())
    servers.procs["dw_memory"] = stack.enter_context(server_process("memory://"))
    redis_dir = directory / "redis"
    redis_dir.mkdir()
    redis = stack.enter_context(private_redis_process(redis_dir))
    if redis is None:
        servers.skipped.append("no redis-server installed: the Redis figures are left out")
    else:
        servers.redis_pid, redis_url = redis
        servers.procs["dw_redis"] = stack.enter_context(server_process(redis_url))
    sqlite_url = f"sqlite:///{directory / 'bench.db'}"
    servers.procs["dw_sqlite"] = stack.enter_context(server_process(sqlite_url))
    if beanstalkd:
        servers.procs["bs"] = stack.enter_context(private_beanstalkd())
        binlog_dir = directory / "binlog"
        binlog_dir.mkdir()
        servers.procs["bs_binlog"] = stack.enter_context(private_beanstalkd(binlog_dir))
    return servers


@contextmanager
def pinned(pids: list[int]) -> Iterator[None]:
    """This process and every thread of ``pids`` on one CPU (see the module docstring)."""
    every_cpu = os.sched_getaffinity(0)
    one_cpu = {min(every_cpu)}

    def pin(pid: int, cpus: set[int]) -> None:
        try:
            threads = [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
        except FileNotFoundError:  # it has exited: nothing to pin
            return
        for tid in threads:
            with suppress(ProcessLookupError):  # that thread has just ended
                os.sched_setaffinity(tid, cpus)

    for pid in [os.getpid(), *pids]:
        pin(pid, one_cpu)
    try:
        yield
    finally:
        for pid in [os.getpid(), *pids]:
            pin(pid, every_cpu)


# -- scenarios ----------------------------------------------------------------------


Contender = tuple[str, Callable[[], Run]]


def alternate(contenders: list[Contender], rounds: int, what: str = "") -> dict[str, list[Run]]:
    """Each contender once per round, in order, ``rounds`` times: A B A B A B."""
    runs: dict[str, list[Run]] = {name: [] for name, _ in contenders}
    for number in range(1, rounds + 1):
        for name, go in contenders:
            progress(f"{what}{name}, round {number}/{rounds}")
            runs[name].append(go())
    return runs


def median_rate(runs: list[Run]) -> float:
    return statistics.median(run.rate for run in runs)


def median_cpu_us(runs: list[Run]) -> float:
    return statistics.median(run.cpu_us for run in runs)


# What one operation is, by the unit of its rate: for the server-CPU notes.
OPERATION = {"/s": "call", "tasks/s": "task", "pairs/s": "pair"}


def rate_figure(key: str, label: str, runs: list[Run], unit: str = "/s", note: str = "") -> Figure:
    """The median rate, every round listed; with no ``note``, the server's CPU per operation."""
    rates = tuple(run.rate for run in runs)
    if not note and all(math.isfinite(run.server_cpu_s) for run in runs):
        note = f"server CPU {median_cpu_us(runs):.1f} us/{OPERATION[unit]}"
    return Figure(key, label, statistics.median(rates), unit, runs=rates, note=note)


def cpu_figure(key: str, label: str, runs: list[Run]) -> Figure:
    per_call = tuple(run.cpu_us for run in runs)
    return Figure(key, label, statistics.median(per_call), "us/call", runs=per_call)


def ratio_figure(
    key: str, label: str, numerator: float, denominator: float, target: Target | None, note: str
) -> Figure:
    value = numerator / denominator if denominator else math.nan
    return Figure(key, label, value, "x", target, note=note)


@dataclass
class Section:
    """What the scenarios share: the plan, the servers, and the figures so far."""

    plan: Plan
    servers: Servers
    figures: list[Figure] = field(default_factory=list)
    floor: dict[str, float] = field(default_factory=dict)  # the echo floor's rate and CPU

    def contender(self, name: str, load: str, server: str) -> Contender:
        """``name``: one connection running ``load`` against ``server`` for a round."""
        pid, address = self.servers.procs[server]
        return name, lambda: drive(load, address, pid, self.plan.round_s)

    def has(self, server: str) -> bool:
        return self.servers.has(server)


# -- fills (untimed) ------------------------------------------------------------------


def add_tasks(address: Address, count: int, topic: str, delay_s: int) -> None:
    """``count`` delaywheel tasks, added in batches (not timed: a fill)."""
    with dw_client(address) as client:
        for first in range(0, count, FILL_BATCH):
            size = min(FILL_BATCH, count - first)
            client.add_many([{"topic": topic, "body": BODY, "delay": delay_s}] * size)


def put_jobs(address: Address, count: int, tube: str, delay_s: int) -> None:
    """``count`` beanstalkd jobs, put one by one (no batch put in its protocol)."""
    with bs_client(address, tube) as client:
        for _ in range(count):
            client.put(BODY, delay=delay_s)
