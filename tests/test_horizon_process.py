"""The horizon with a real server on SQLite: killed with SIGKILL while a
start pulls the far tier, it starts again with every task, counted exactly
(the pull only reads; engine/horizon.py)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest
from delaywheel_client import Client
from serverproc import ServerProcess

from delaywheel.engine.engine import Engine
from delaywheel.store import open_store

PULLED = 6_000  # due within the horizon at the real start: pulled before it listens
FAR = 2_000  # due beyond it: left in the store


def fill(url: str, now_s: float) -> None:
    """A far tier as a server whose clock was far behind would have written."""

    async def main() -> None:
        store = open_store(url)
        await store.open()
        then_s = now_s - 100_000
        engine = Engine(store, now_s=then_s, horizon_s=120.0)
        await engine.load(store.load())
        tasks = [
            {"id": f"p{i}", "topic": "t", "at": now_s + 60 + i % 50} for i in range(PULLED)
        ] + [{"id": f"f{i}", "topic": "u", "at": now_s + 5000 + i} for i in range(FAR)]
        for start in range(0, len(tasks), 1000):
            batch = tasks[start : start + 1000]
            await engine.through_store(lambda batch=batch: engine.add_many(batch, then_s))
            await engine.journal.drain()
        assert engine.horizon.far_total == PULLED + FAR
        await store.close()

    asyncio.run(main())


@pytest.mark.slow
@pytest.mark.process
def test_kill_9_while_a_start_pulls_the_far_tier(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/far.db"
    fill(url, time.time())
    for after_s in (0.7, 1.0):
        proc = subprocess.Popen(
            [sys.executable, "-m", "delaywheel", "serve", "--port", "0", "--store", url,
             "--horizon", "2m"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        time.sleep(after_s)
        proc.kill()
        proc.wait()
    server = ServerProcess("--horizon", "2m", store=url)
    try:
        with Client(*server.address) as client:
            stats = client.stats()
            assert stats["tasks"] == PULLED + FAR
            assert stats["states"]["delayed"] == PULLED + FAR
            assert stats["wheel"]["far"] == FAR
            assert stats["topics"] == {"t": {"delayed": PULLED}, "u": {"delayed": FAR}}
            assert client.get("p123")["topic"] == "t"  # type: ignore[index]
            assert client.get("f1234")["at"] > time.time() + 4000  # type: ignore[index]
            assert client.delete("f1234") is True
            assert client.stats()["wheel"]["far"] == FAR - 1
    finally:
        server.stop()
