"""Recovery: how long a restart takes to rebuild 1,000,000 tasks from each store.

The records are written straight into the store as the journal would have
left them: ready and reserved tasks, and delayed ones spread over a week;
then again with every delayed task due within the hour, and with every task
ready or reserved (the worst case: none is loaded packed). Then a real ``delaywheel serve``
starts on that store, as after a crash, and the figure is the load time it
logs (``loaded N tasks from ... in X s``: streaming the records and
rebuilding wheel, queues and index). A fresh process, because that is where
a restart loads: its heap is empty, not fragmented by the records just
written. The note gives the time from exec to the open port, which adds
interpreter start-up and imports. The server is started ``FULL.starts`` times on
the same records and the figure is the median (the machine we measure on
varies by 20 % from run to run). Redis runs as a private redis-server on a
free port in a temporary directory; SQLite is a temporary file. Target:
<= 5 s per 1,000,000 tasks.

On Redis the records go where the server keeps them: a keyspace of
``DEFAULT_PARTITIONS`` partitions (store/redis/layout.py), each record in
its partition's hash ``{<prefix>:pNNN}:tasks``, written by the Redis store
itself (opened alone: store/redis/owner.py). (Not the single-node hash
``{<prefix>}:tasks``: a start would migrate that first, and a second fill
there would be kept out by the migration's HSETNX.)

The floor: on the main mix, the same records read and nothing else, with the
store's own client, read-only, in a fresh process (spawned, as the server
is): for Redis, redis-py (with hiredis) walking each partition's hash in
turn with ``HSCAN`` at the COUNT the store's load asks for (a node loads
its partitions one after the other); for SQLite, the stdlib
``sqlite3`` running the store's ``SELECT`` with ``fetchmany`` of that batch
size, on a read-only connection. The clock runs, as the server's does, from
the first read to the last, the connection already open, with the cyclic GC
off. Each start is followed by one read (A B A B A B), and the floor is their
median. The ratio, the server's load over the floor, says what rebuilding
wheel, queues and index costs beyond reading: target <= 2.

The servers run with a horizon beyond the fill's week (``--horizon 8d``), so
that every record is loaded into memory: what a restart costs per task held.
With the default horizon a start reads only the near tier and the far
tier's counts (docs/operations.md, "The horizon").

``run(quick=True)`` does the same with ``QUICK`` counts: a smoke run.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import re
import shutil
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

import redis

from bench import Figure, Report, Target, paused_gc, progress
from bench._procs import STOP_TIMEOUT_S, private_redis, tree_server
from delaywheel.engine.record import to_record
from delaywheel.engine.task import DELAYED, READY, RESERVED, Task
from delaywheel.store import open_store
from delaywheel.store.base import DEFAULT_BATCH_SIZE
from delaywheel.store.redis.layout import DEFAULT_PARTITIONS, Layout
from delaywheel.store.redis.store import DEFAULT_PREFIX
from delaywheel.store.sqlite import parse_sqlite_url


@dataclass(frozen=True)
class Plan:
    """How much: the full run, or ``QUICK``."""

    tasks: int  # records written to the store, then loaded
    starts: int  # server starts (and floor reads) on the same records


FULL = Plan(tasks=1_000_000, starts=3)
QUICK = Plan(tasks=20_000, starts=1)
# The batch size the server's load asks the store for (``Store.load()``'s default).
READ_BATCH = DEFAULT_BATCH_SIZE
WRITE_BATCH = 10_000
WEEK_S = 7 * 24 * 3600.0
# 90 % delayed tasks spread over a week or an hour (most are loaded packed),
# and the worst case: every task ready or reserved, so none is packed.
# (figure name suffix, label suffix, how far ahead delayed tasks are spread,
# the share of delayed tasks; of the rest, 3 % of all are reserved)
MIXES = (
    ("", "", WEEK_S, 0.9),
    ("_hour", ", all due within the hour", 3600.0, 0.9),
    ("_ready", ", all ready or reserved", 0.0, 0.0),
)
# Beyond the fill's week: every task is loaded into memory, as this section
# measures (with a shorter horizon the far ones stay in the store: docs/performance.md).
HORIZON = "8d"
LOADED = re.compile(r"loaded (\d+) tasks from \S+ in ([\d.]+) s")


def records(
    now_s: float, count: int, spread_s: float, delayed: float
) -> Iterator[list[tuple[str, bytes]]]:
    rng = random.Random(7)
    batch: list[tuple[str, bytes]] = []
    body = b"\x81\xa5order\xcd\x01\x2a"  # {"order": 298}, packed
    for i in range(count):
        roll = rng.random()
        state = DELAYED if roll < delayed else READY if roll < 0.97 else RESERVED
        at_s = now_s + rng.uniform(1, spread_s) if state == DELAYED else now_s - 5
        task = Task(
            f"task-{i}",
            f"topic-{i % 50}",
            at_s,
            body_packed=body,
            ttr_s=60.0,
            max_attempts=5,
            created_s=now_s,
            state=state,
            # Far enough out that no reservation expires while the server starts.
            deadline_s=now_s + 3600 if state == RESERVED else 0.0,
        )
        batch.append((task.id, to_record(task)))
        if len(batch) == WRITE_BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


async def fill(url: str, count: int, spread_s: float, delayed: float) -> None:
    """The records written by the store itself (on Redis, the server's store with
    no owner: each partition's hash, as a node's journal leaves them)."""
    async with open_store(url) as store:
        for batch in records(time.time(), count, spread_s, delayed):
            await store.write(dict(batch))


def timed_start(url: str) -> tuple[float, int, float]:
    """Start the server on a filled store: (load s it logged, tasks, exec-to-port s)."""
    server = tree_server(None, url, ("--horizon", HORIZON))
    try:
        start_log = list(server.log)  # up to the listening line
    finally:
        server.stop(STOP_TIMEOUT_S)
    for line in start_log:
        match = LOADED.search(line)
        if match:
            return float(match.group(2)), int(match.group(1)), server.listening_s
    raise RuntimeError(f"the server on {url} never logged its load: {start_log[-3:]}")


def read_redis(url: str) -> tuple[float, int]:
    """(s, records): HSCAN each partition's hash to its end, COUNT ``READ_BATCH``."""
    # The hashes the server loads (nothing connects).
    keys = [p.tasks for p in Layout(DEFAULT_PREFIX, DEFAULT_PARTITIONS)]
    client = redis.Redis.from_url(url)  # decode_responses off, as the store's
    try:
        client.ping()  # connected before the clock starts, as the server's store is
        with paused_gc():
            started = time.perf_counter()
            count = 0
            for key in keys:
                cursor = 0
                while True:
                    cursor, fields = client.hscan(key, cursor, count=READ_BATCH)
                    count += len(fields)
                    if cursor == 0:
                        break
            return time.perf_counter() - started, count
    finally:
        client.close()


def read_sqlite(url: str) -> tuple[float, int]:
    """(s, records): the store's SELECT on a read-only connection, ``READ_BATCH`` a fetch."""
    path, _ = parse_sqlite_url(url)
    conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    try:
        with paused_gc():
            started = time.perf_counter()
            cursor = conn.execute("SELECT id, record FROM tasks")
            count = 0
            while rows := cursor.fetchmany(READ_BATCH):
                count += len(rows)
            return time.perf_counter() - started, count
    finally:
        conn.close()


READERS = {"redis": read_redis, "sqlite": read_sqlite}


def timed_read(name: str, url: str) -> tuple[float, int]:
    """The floor: ``READERS[name](url)`` in a fresh interpreter (spawned: an empty heap)."""
    with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
        return pool.submit(READERS[name], url).result()


def restart_figure(
    key: str, label: str, starts: list[tuple[float, int, float]], target: Target
) -> Figure:
    loads_s = tuple(start[0] for start in starts)
    listening_s = statistics.median(start[2] for start in starts)
    return Figure(
        f"recovery_{key}_s",
        f"recovery from {label}",
        statistics.median(loads_s),
        "s",
        target,
        runs=loads_s,
        note=f"median of {len(starts)} starts; {starts[0][1]:,} tasks;"
        f" port open {listening_s:.2f} s after exec",
    )


CLIENTS = {
    "redis": f"redis-py HSCAN COUNT {READ_BATCH:,}",
    "sqlite": f"sqlite3 SELECT, fetchmany {READ_BATCH:,}, read-only",
}


def floor_figures(name: str, restart: Figure, reads: list[tuple[float, int]]) -> list[Figure]:
    """The read floor of ``name`` and the restart's load over it."""
    reads_s = tuple(read[0] for read in reads)
    floor_s = statistics.median(reads_s)
    return [
        Figure(
            f"floor_{name}_s",
            f"  read floor, {name}",
            floor_s,
            "s",
            runs=reads_s,
            note=f"median of {len(reads)} reads; {reads[0][1]:,} records; {CLIENTS[name]}",
        ),
        Figure(
            f"recovery_{name}_vs_floor",
            f"  restart / read floor, {name}",
            restart.value / floor_s if floor_s else float("nan"),
            "x",
            Target("<=", 2.0),
            note="load time over the time to only read the records",
        ),
    ]


def run(quick: bool = False) -> Report:
    started = time.perf_counter()
    plan = QUICK if quick else FULL
    figures: list[Figure] = []
    directory = Path(tempfile.mkdtemp(prefix="delaywheel-bench-"))
    target = Target("<=", 5.0)
    try:
        stores = [("sqlite", f"sqlite:///{directory / 'bench.db'}")]
        with private_redis(directory) as url:
            if url is None:
                progress("no redis-server installed: Redis skipped")
            else:
                stores.insert(0, ("redis", url))
            for (name, store_url), (suffix, label, spread_s, delayed) in itertools.product(
                stores, MIXES
            ):
                floor = not suffix  # the main mix: a read floor after each start
                progress(
                    f"writing {plan.tasks:,} records to {name}{label}, then starting servers"
                    + (" and reading the records alone" if floor else "")
                )
                # the same ids: overwrites
                asyncio.run(fill(store_url, plan.tasks, spread_s, delayed))
                starts: list[tuple[float, int, float]] = []
                reads: list[tuple[float, int]] = []
                for _ in range(plan.starts):
                    starts.append(timed_start(store_url))
                    if floor:
                        reads.append(timed_read(name, store_url))
                # A load or a read of other keys than the fill's would time something else.
                counts = {start[1] for start in starts} | {read[1] for read in reads}
                if counts != {plan.tasks}:
                    raise RuntimeError(
                        f"{name}{label}: {plan.tasks:,} records written, but loaded or read"
                        f" {sorted(counts)}"
                    )
                restart = restart_figure(f"{name}{suffix}", f"{name}{label}", starts, target)
                figures.append(restart)
                if floor:
                    figures += floor_figures(name, restart, reads)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return Report(
        "recovery",
        f"Restart{' (quick)' if quick else ''}: a fresh server loads {plan.tasks:,} tasks"
        " from the store",
        figures,
        params={
            "quick": quick,
            "tasks": plan.tasks,
            "starts": plan.starts,
            "read_batch": READ_BATCH,
        },
        elapsed_s=time.perf_counter() - started,
    )
