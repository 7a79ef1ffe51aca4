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
interpreter start-up and imports. The server is started ``STARTS`` times on
the same records and the figure is the median (the machine we measure on
varies by 20 % from run to run). Redis runs as a private redis-server on a
free port in a temporary directory; SQLite is a temporary file. Target:
<= 5 s per 1,000,000 tasks.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import re
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from bench import Figure, Report, Target, progress
from bench._procs import private_redis, running_server
from delaywheel.store import Store, open_store
from delaywheel.task import DELAYED, READY, RESERVED, Task

TASKS = 1_000_000
STARTS = 3
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
        batch.append((task.id, task.to_record()))
        if len(batch) == WRITE_BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


async def fill(url: str, spread_s: float, delayed: float) -> None:
    store: Store = open_store(url)
    async with store:
        for batch in records(time.time(), TASKS, spread_s, delayed):
            await store.write(dict(batch))


def timed_start(url: str) -> tuple[float, int, float]:
    """Start the server on a filled store: (load s it logged, tasks, exec-to-port s)."""
    start_log: list[str] = []
    started = time.perf_counter()
    with running_server(url, start_log):
        listening_s = time.perf_counter() - started
    for line in start_log:
        match = LOADED.search(line)
        if match:
            return float(match.group(2)), int(match.group(1)), listening_s
    raise RuntimeError(f"the server on {url} never logged its load: {start_log[-3:]}")


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
        note=f"median of {STARTS} starts; {starts[0][1]:,} tasks;"
        f" port open {listening_s:.2f} s after exec",
    )


def run() -> Report:
    started = time.perf_counter()
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
                progress(f"writing {TASKS:,} records to {name}{label}, then starting servers")
                asyncio.run(fill(store_url, spread_s, delayed))  # the same ids: overwrites
                starts = [timed_start(store_url) for _ in range(STARTS)]
                figures.append(restart_figure(f"{name}{suffix}", f"{name}{label}", starts, target))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return Report(
        "recovery",
        f"Restart: a fresh server loads {TASKS:,} tasks from the store",
        figures,
        params={"tasks": TASKS},
        elapsed_s=time.perf_counter() - started,
    )
