"""How the compare section drives a contender: the clients, one operation of
each load, and one round of it from this process or from many.

A load is a context manager that opens its client and yields ``(step, per_step)``:
one call of the step does ``per_step`` operations (tasks for ``add_many`` and
pipelines, pairs for reserve). ``drive`` runs one round on one connection and
reads the server's CPU time around it; ``drive_processes`` runs one round of
several client processes at once (``client_process`` is what each runs).
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

from delaywheel_client import AsyncClient, Client

BODY = b"x" * 100  # the same 100 bytes for both; msgpack bin for delaywheel
TOPIC = "bench"  # also the beanstalkd tube the puts go to
READY_TOPIC = "ready"  # pre-filled with ready tasks for reserve
DELAY_S = 3600  # whole seconds: beanstalkd takes no fractions
DAY_S = 86_400
ADD_MANY_BATCH = 1_000
PIPELINE_DEPTH = 200
FILL_BATCH = 1_000  # tasks per add_many when filling a server outside the timing
# Calls made on a fresh connection before the clock starts: the first calls
# pay for the connection's buffers and the server's first touch of the topic.
WARMUP_STEPS = 10
# Client processes get this long to connect and warm up before a round starts.
START_DELAY_S = 0.5
MAX_STEPS = 100_000_000  # every timed loop is bounded, besides its deadline
REPLY_TIMEOUT_S = 600.0  # the journal load's client: a server under callgrind is slow
CLK_TCK = os.sysconf("SC_CLK_TCK")


# -- one round ----------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """One contender's round: operations done, wall time, server CPU time."""

    ops: int
    elapsed_s: float
    server_cpu_s: float = math.nan  # not measured for the multi-process rounds

    @property
    def rate(self) -> float:
        return self.ops / self.elapsed_s

    @property
    def cpu_us(self) -> float:
        return self.server_cpu_s / self.ops * 1e6


def cpu_s(pid: int) -> float:
    """utime + stime of a process (all its threads), in seconds."""
    with open(f"/proc/{pid}/stat") as stat:
        # the command name, in parentheses, may hold spaces: split after it
        fields = stat.read().rsplit(")", 1)[1].split()
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5)
    return (utime + stime) / CLK_TCK


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024  # reported in kB
    raise RuntimeError(f"no VmRSS for process {pid}")


Step = Callable[[], object]
Address = tuple[str, int]


@contextmanager
def dw_client(address: Address) -> Iterator[Client]:
    with Client(*address) as client:
        yield client


@contextmanager
def bs_client(address: Address, tube: str = TOPIC) -> Iterator[Any]:
    import greenstalk  # only when beanstalkd is measured: it may not be installed

    with greenstalk.Client(address, encoding=None, use=tube, watch=tube) as client:
        yield client


# A load: on a fresh connection, the step a round repeats and how many
# operations one step is. By name, so that client processes can open them too.


@contextmanager
def load_ping(address: Address) -> Iterator[tuple[Step, int]]:
    with dw_client(address) as client:
        yield client.ping, 1


@contextmanager
def load_get(address: Address) -> Iterator[tuple[Step, int]]:
    with dw_client(address) as client:
        task_id = client.add(TOPIC, BODY, delay=DELAY_S)["id"]
        yield lambda: client.get(task_id), 1


@contextmanager
def load_add(address: Address) -> Iterator[tuple[Step, int]]:
    with dw_client(address) as client:
        yield lambda: client.add(TOPIC, BODY, delay=DELAY_S), 1


@contextmanager
def load_add_many(address: Address) -> Iterator[tuple[Step, int]]:
    batch = [{"topic": TOPIC, "body": BODY, "delay": DELAY_S} for _ in range(ADD_MANY_BATCH)]
    with dw_client(address) as client:
        yield lambda: client.add_many(batch), ADD_MANY_BATCH


@contextmanager
def load_pipeline(address: Address) -> Iterator[tuple[Step, int]]:
    with dw_client(address) as client:

        def step() -> None:
            pipe = client.pipeline()
            for _ in range(PIPELINE_DEPTH):
                pipe.add(TOPIC, BODY, delay=DELAY_S)
            pipe.execute()

        yield step, PIPELINE_DEPTH


@contextmanager
def load_journal(address: Address) -> Iterator[tuple[Step, int]]:
    """The journal section's load (bench/journal.py): one AsyncClient, pipelines
    of its BATCH adds, PRODUCERS of them in flight at once; a step is one
    pipeline per producer."""
    from bench.journal import BATCH, BODY, PRODUCERS  # bench.journal imports nothing of ours

    loop = asyncio.new_event_loop()
    # under callgrind a pipeline takes far longer than the default 10 s
    client = loop.run_until_complete(AsyncClient.connect(*address, timeout_s=REPLY_TIMEOUT_S))

    async def pipeline() -> None:
        pipe = client.pipeline()
        for i in range(BATCH):
            pipe.add(TOPIC, BODY, delay=DELAY_S + i % 600)
        await pipe.execute()

    async def producers() -> None:
        await asyncio.gather(*(pipeline() for _ in range(PRODUCERS)))

    try:
        yield lambda: loop.run_until_complete(producers()), BATCH * PRODUCERS
    finally:
        loop.run_until_complete(client.close())
        loop.close()


@contextmanager
def load_reserve_ack(address: Address) -> Iterator[tuple[Step, int]]:
    with dw_client(address) as client:

        def step() -> None:
            task = client.reserve(READY_TOPIC, 0)
            if task is None:
                raise RuntimeError("no ready task left to reserve")
            client.ack(task["id"])

        yield step, 1


@contextmanager
def load_put(address: Address) -> Iterator[tuple[Step, int]]:
    with bs_client(address) as client:
        yield lambda: client.put(BODY, delay=DELAY_S), 1


@contextmanager
def load_reserve_delete(address: Address) -> Iterator[tuple[Step, int]]:
    with bs_client(address, READY_TOPIC) as client:
        # timeout 0 as for delaywheel's reserve: answer at once, never wait
        yield lambda: client.delete(client.reserve(timeout=0)), 1


LOADS: dict[str, Callable[[Address], AbstractContextManager[tuple[Step, int]]]] = {
    "ping": load_ping,
    "get": load_get,
    "add": load_add,
    "add_many": load_add_many,
    "pipeline": load_pipeline,
    "journal": load_journal,
    "reserve_ack": load_reserve_ack,
    "put": load_put,
    "reserve_delete": load_reserve_delete,
}


def drive(
    load: str, address: Address, pid: int, duration_s: float, max_steps: int = MAX_STEPS
) -> Run:
    """One round of one connection: ``load``'s step again and again for ``duration_s``."""
    with LOADS[load](address) as (step, per_step):
        for _ in range(WARMUP_STEPS):
            step()
        clock = time.perf_counter
        cpu_before = cpu_s(pid)
        started = clock()
        deadline = started + duration_s
        steps = 0
        while steps < max_steps:
            step()
            steps += 1
            if clock() >= deadline:
                break
        elapsed_s = clock() - started
        server_cpu_s = cpu_s(pid) - cpu_before
    return Run(steps * per_step, elapsed_s, server_cpu_s)


def client_process(
    load: str, address: Address, start_at: float, duration_s: float
) -> tuple[int, float, float]:
    """One client process's share of a multi-process round (runs in the child):
    (operations, start, end) on the monotonic clock, which all processes share.

    Every child runs from ``start_at`` to ``start_at + duration_s``, so their rounds overlap.
    """
    with LOADS[load](address) as (step, per_step):
        for _ in range(WARMUP_STEPS):
            step()
        time.sleep(max(0.0, start_at - time.monotonic()))
        started = time.monotonic()
        deadline = start_at + duration_s
        steps = 0
        while steps < MAX_STEPS:
            step()
            steps += 1
            if time.monotonic() >= deadline:
                break
        return steps * per_step, started, time.monotonic()


def drive_processes(
    pool: ProcessPoolExecutor, processes: int, load: str, address: Address, duration_s: float
) -> Run:
    """One round of ``processes`` client processes at once: all their operations
    over the time from the first one's start to the last one's end."""
    start_at = time.monotonic() + START_DELAY_S
    futures = [
        pool.submit(client_process, load, address, start_at, duration_s) for _ in range(processes)
    ]
    shares = [future.result() for future in futures]
    first_start = min(started for _, started, _ in shares)
    last_end = max(ended for _, _, ended in shares)
    return Run(sum(ops for ops, _, _ in shares), last_end - first_start)


def warm_up() -> None:
    """A pool task that makes its worker process start (and import) before any round."""
    time.sleep(0.5)
