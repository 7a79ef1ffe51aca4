"""Processes the benchmarks run against: a private redis-server, the real server."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LISTENING = re.compile(r"delaywheel listening on (\S+):(\d+)")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_for_port(port: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@contextmanager
def private_redis(directory: Path) -> Iterator[str | None]:
    """A redis-server of our own (AOF on, everysec) on a free port; never the shared one.

    Yields None when no ``redis-server`` is installed: sections then skip Redis.
    """
    if shutil.which("redis-server") is None:
        yield None
        return
    port = free_port()
    args = [
        "redis-server",
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "yes",
        "--dir",
        str(directory),
    ]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL)
    try:
        _wait_for_port(port)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait()


@contextmanager
def running_server(store_url: str, start_log: list[str] | None = None) -> Iterator[tuple[str, int]]:
    """``delaywheel serve`` on a free port with the given store; yields (host, port).

    ``start_log``, when given, receives the lines the server logged up to and
    including the one saying it listens.
    """
    proc = subprocess.Popen(
        [sys.executable, "-m", "delaywheel", "serve", "--port", "0", "--store", store_url],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            if start_log is not None:
                start_log.append(line)
            match = LISTENING.search(line)
            if match:
                address = match.group(1), int(match.group(2))
                break
        else:
            raise RuntimeError(f"server for {store_url} did not start")
        yield address
    finally:
        proc.terminate()
        proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
