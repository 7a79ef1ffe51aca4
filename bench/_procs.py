"""Processes the benchmarks run against: a private redis-server, the real server,
and the small servers of bench/ that print the address they listen on.

The real server is started by the tests' ``ServerProcess`` (tests/serverproc.py:
the bench runs from a checkout, as the tests do), so the two start it, read its
port and stop it the same way; ``tree_server`` starts it from another source
tree too, and times its start (bench/horizon.py, bench/recovery.py).
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from tests.serverproc import LISTENING, ServerProcess, free_port

# A server on a filled store loads before it listens (about 1.5 s a million
# tasks, docs/performance.md): the bench waits for that, however big.
START_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 60.0
ROOT = Path(__file__).resolve().parent.parent


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
    with private_redis_process(directory) as found:
        yield None if found is None else found[1]


@contextmanager
def private_redis_process(directory: Path, aof: bool = True) -> Iterator[tuple[int, str] | None]:
    """``private_redis``, yielding (pid, URL): for sections that watch the process too.

    AOF with Redis's default ``appendfsync everysec``: fsync about once a second;
    ``aof`` False: none (a fill that measures memory, not durability).
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
        "yes" if aof else "no",
        "--dir",
        str(directory),
    ]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL)
    try:
        _wait_for_port(port)
        yield proc.pid, f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait()


def wait_listening(proc: subprocess.Popen[str], timeout_s: float) -> tuple[str, int]:
    """The (host, port) a ``delaywheel serve`` child logs on its stderr once it
    listens; read line by line, at most ``timeout_s`` (the rest of its log stays
    in the pipe for the caller to drain)."""
    assert proc.stderr is not None
    deadline = time.monotonic() + timeout_s
    for line in proc.stderr:
        match = LISTENING.search(line)
        if match:
            return match.group(1), int(match.group(2))
        if time.monotonic() > deadline:
            break
    raise RuntimeError(f"{' '.join(map(str, proc.args))} did not start")


@contextmanager
def listening_child(
    command: Sequence[str], listening: str
) -> Iterator[tuple[int, tuple[str, int]]]:
    """``command`` as a child process that prints a line matching ``listening``
    (a pattern whose groups are the host and the port) on stdout once it serves;
    yields (pid, (host, port)) and stops it on the way out."""
    proc = subprocess.Popen(list(command), stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        match = re.search(listening, proc.stdout.readline())
        if match is None:
            raise RuntimeError(f"{' '.join(command)} did not start")
        yield proc.pid, (match.group(1), int(match.group(2)))
    finally:
        proc.terminate()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def knows_option(tree: Path | None, option: str) -> bool:
    """Whether the tree's server takes ``option`` (an older tree may not)."""
    serve = (tree or ROOT) / "delaywheel" / "cli" / "serve.py"
    return f'"{option}"' in serve.read_text()


def tree_server(
    tree: Path | None,
    store_url: str,
    args: Sequence[str] = (),
    start_timeout_s: float = START_TIMEOUT_S,
) -> ServerProcess:
    """``delaywheel serve`` of ``tree`` (None: this checkout; else that tree's own
    ``.venv/bin/python``, run in that tree) on a free port with ``store_url``,
    listening: its ``listening_s`` is the time from the exec to the listening line.

    ``args`` are more ``serve`` options; the tick is the server's own.
    """
    python, cwd = sys.executable, ROOT
    if tree is not None:
        python, cwd = str(tree / ".venv" / "bin" / "python"), tree
    # Every client of a bench connects from 127.0.0.1: one address may hold every
    # connection (by default a quarter of --max-connections). 24aa740 has no such option.
    if knows_option(tree, "--max-connections-per-address"):
        args = ("--max-connections-per-address", "10000", *args)
    return ServerProcess(
        *args,
        store=store_url,
        tick=None,
        start_timeout_s=start_timeout_s,
        python=python,
        cwd=cwd,
    )


@contextmanager
def running_server(store_url: str, start_log: list[str] | None = None) -> Iterator[tuple[str, int]]:
    """``delaywheel serve`` on a free port with the given store; yields (host, port).

    ``start_log``, when given, receives the lines the server logged up to and
    including the one saying it listens.
    """
    with server_process(store_url, start_log) as (_, address):
        yield address


@contextmanager
def server_process(
    store_url: str, start_log: list[str] | None = None, args: Sequence[str] = ()
) -> Iterator[tuple[int, tuple[str, int]]]:
    """``running_server``, yielding (pid, (host, port)): for sections that watch the process.

    ``args`` are more ``serve`` options, e.g. ``("--tick", "0.01")``.
    """
    try:
        server = tree_server(None, store_url, args)
    except RuntimeError as exc:
        raise RuntimeError(f"server for {store_url} did not start: {exc}") from None
    try:
        assert server.proc is not None
        if start_log is not None:
            for line in list(server.log):
                start_log.append(line)
                if LISTENING.search(line):
                    break
        yield server.proc.pid, server.address
    finally:
        server.stop(STOP_TIMEOUT_S)
