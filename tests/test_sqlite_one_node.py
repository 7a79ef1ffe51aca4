"""A SQLite store serves one server: a second server on the same file refuses to
start (exit 3, naming the file and the holder's pid), and the lock goes with
the holder, kill -9 included."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import run
from serverproc import ServerProcess

from delaywheel.store import StoreUnavailable
from delaywheel.store.sqlite import SqliteStore

pytestmark = pytest.mark.process


def second_server(url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "delaywheel", "serve", "--port", "0", "--store", url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_second_server_on_the_file_refuses_to_start(tmp_path: Path) -> None:
    db = tmp_path / "tasks.db"
    url = f"sqlite:///{db}"
    first = ServerProcess(store=url)
    try:
        assert first.proc is not None
        refused = second_server(url)
        assert refused.returncode == 3, refused.stderr
        assert f"the file {db} is in use by another delaywheel server" in refused.stderr
        assert f"pid {first.proc.pid}" in refused.stderr
        assert "Traceback" not in refused.stderr
    finally:
        first.kill()  # kill -9: the kernel drops the lock with the process
    after = ServerProcess(store=url)
    try:
        assert after.proc is not None and after.proc.poll() is None
    finally:
        assert after.stop() == 0


def test_the_lock_is_released_on_close_and_held_in_process(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'tasks.db'}"

    async def scenario() -> None:
        held = SqliteStore(url)
        await held.open()
        other = SqliteStore(url)
        with pytest.raises(StoreUnavailable, match="is in use by another delaywheel server"):
            await other.open()
        await held.close()
        again = SqliteStore(url)
        await again.open()
        await again.close()

    run(scenario)
