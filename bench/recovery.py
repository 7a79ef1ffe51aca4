"""Recovery: how long a restart takes to rebuild 1,000,000 tasks from each store.

The records are written straight into the store (as the journal would have
left them: a mix of delayed tasks spread over a week, ready and reserved
ones), then a fresh engine loads them with ``Engine.load(store.load())``, the
same call the server makes at start. Redis runs as a private redis-server on
a free port in a temporary directory; SQLite is a temporary file. Target:
<= 5 s per 1,000,000 tasks.
"""

from __future__ import annotations

import asyncio
import gc
import random
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from bench import Figure, Report, Target, progress
from bench._procs import private_redis
from delaywheel.app import recover
from delaywheel.engine import Engine
from delaywheel.store import Store, open_store
from delaywheel.task import DELAYED, READY, RESERVED, Task

TASKS = 1_000_000
WRITE_BATCH = 10_000
WEEK_S = 7 * 24 * 3600.0


def records(now_s: float, count: int) -> Iterator[list[tuple[str, bytes]]]:
    rng = random.Random(7)
    batch: list[tuple[str, bytes]] = []
    body = b"\x81\xa5order\xcd\x01\x2a"  # {"order": 298}, packed
    for i in range(count):
        roll = rng.random()
        state = DELAYED if roll < 0.9 else READY if roll < 0.97 else RESERVED
        at_s = now_s + rng.uniform(1, WEEK_S) if state == DELAYED else now_s - 5
        task = Task(
            f"task-{i}",
            f"topic-{i % 50}",
            at_s,
            body_packed=body,
            ttr_s=60.0,
            max_attempts=5,
            created_s=now_s,
            state=state,
            deadline_s=now_s + 60 if state == RESERVED else 0.0,
        )
        batch.append((task.id, task.to_record()))
        if len(batch) == WRITE_BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


async def fill(store: Store, now_s: float) -> None:
    for batch in records(now_s, TASKS):
        await store.write(dict(batch))


async def measure(url: str) -> tuple[float, int]:
    now_s = time.time()
    store = open_store(url, redis_prefix="bench")
    await store.open()
    await fill(store, now_s)
    await store.close()
    store = open_store(url, redis_prefix="bench")
    await store.open()
    engine = Engine(store, now_s=now_s)
    started = time.perf_counter()
    loaded = await recover(engine, store)  # exactly what the server does at start
    elapsed = time.perf_counter() - started
    await store.close()
    # recover() froze the loaded tasks (the server keeps them for its life);
    # hand them back to the collector so the next measurement starts clean.
    del engine
    gc.unfreeze()
    gc.collect()
    return elapsed, loaded


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
            for name, store_url in stores:
                progress(f"writing {TASKS:,} records to {name}, then loading them")
                elapsed, loaded = asyncio.run(measure(store_url))
                figures.append(
                    Figure(
                        f"recovery_{name}_s",
                        f"recovery from {name}",
                        elapsed,
                        "s",
                        target,
                        note=f"{loaded:,} tasks, {loaded / elapsed:,.0f}/s",
                    )
                )
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return Report(
        "recovery",
        f"Restart: rebuild {TASKS:,} tasks from the store (what the server does at start)",
        figures,
        params={"tasks": TASKS},
        elapsed_s=time.perf_counter() - started,
    )
