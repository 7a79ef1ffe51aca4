"""Instructions per call of the server, counted by callgrind: ``python -m bench.tools.callgrind``.

Not a bench section: wall-clock rates on a shared 2-core machine move with
the load, instruction counts do not (repeatable to about 0.1 %), so this is
how two versions of the hot path are compared.

``python -m bench.tools.callgrind [--tree DIR ...] [--store redis|memory|sqlite] [--calls N]
[--warmup N] [--keep DIR] [LOAD] [-- SERVE OPTIONS]``
starts a private redis-server (AOF everysec, as the bench's) and ``delaywheel
serve`` under ``valgrind --tool=callgrind`` with ``PYTHONPATH`` set to each
``--tree`` (a source tree of another commit, e.g. made by ``git archive COMMIT
| tar -x -C DIR``; none given: this checkout), makes ``--warmup`` calls
(default ``WARMUP_CALLS``) of ``LOAD`` from a client of this checkout
(``bench._loads``: ``add``, ``ping``, ``get``, ...; ``http_add``: a ``POST
/v1/tasks`` on one keep-alive connection to ``--api-port``, bench/http_api.py,
so that the HTTP API's way in is measured as the protocol's is; ``journal`` is
the journal section's pipelines, 8,000 adds a call, for which ``--warmup 3
--calls 5`` is enough; ``--store sqlite`` is a fresh file per tree), zeroes
the counters (``callgrind_control -z``), makes ``--calls`` more, dumps (into
``DIR/0``, ``DIR/1``... by tree with ``--keep``, for ``callgrind_annotate``),
and prints the server's instructions per call (every thread: the main loop and
any helper). The server runs about 50 times slower under callgrind; start-up
takes a minute or so.

"less idle": the same less what the server does while idle for as long as
the calls took (counted next, in a second dump). A node of several (issue
16) works on a clock of its own (the coordinator's round every half
second): under callgrind's slowdown that work falls on few calls, and more
of it the more loaded the machine is, while a real add pays next to nothing
of it. The first figure of such a tree moved by up to 8 % between runs
(2026-12-05); compare trees by the second.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench._loads import LOADS, READY_TOPIC
from bench._procs import free_port, private_redis, wait_listening
from bench._section import add_tasks
from bench.http_api import load_http_add

# Loads on the HTTP API's own port (given the port; the server is started with it).
API_LOADS = {"http_add": load_http_add}

WARMUP_CALLS = 300
DEFAULT_CALLS = 2_000
START_TIMEOUT_S = 300.0
SLOW_LEASE_S = 600
STOP_TIMEOUT_S = 10.0
TOTALS = re.compile(r"^(?:summary|totals):\s+(\d+)", re.MULTILINE)


def _instructions(directory: Path) -> int:
    """The sum of the dump's totals (with --separate-threads, one file per thread)."""
    total = 0
    for dump in directory.glob("callgrind.out.*"):
        found = TOTALS.findall(dump.read_text(errors="replace"))
        total += int(found[-1]) if found else 0
    return total


def _dump(pid: int, out: Path, keep: Path | None = None) -> int:
    """Dump the counters, read their total and move the files away (for the next
    dump): into ``keep``, for ``callgrind_annotate``, or nowhere."""
    subprocess.run(["callgrind_control", "-d", str(pid)], check=True, capture_output=True)
    total = _instructions(out)
    for dump in out.glob("callgrind.out.*"):
        if keep is None:
            dump.unlink()
        else:
            keep.mkdir(parents=True, exist_ok=True)
            dump.rename(keep / dump.name)
    return total


def count(
    tree: Path | None,
    store_url: str,
    load: str,
    calls: int,
    args: list[str],
    warmup: int = WARMUP_CALLS,
    keep: Path | None = None,
) -> tuple[float, float]:
    """The server's instructions per call of ``load``, and the same less what it
    does idle in as long (see the module docstring)."""
    out = Path(tempfile.mkdtemp(prefix="delaywheel-callgrind-"))
    env = dict(os.environ)
    # 50 times slower, a node would miss its lease renewals and fence itself
    # (an older tree, with no leases, ignores the variable)
    if store_url.startswith("redis"):  # a memory store refuses the cluster options
        env.setdefault("DELAYWHEEL_LEASE", str(SLOW_LEASE_S))
    if tree is not None:
        env["PYTHONPATH"] = f"{tree}:{tree / 'client'}"
    api_port = free_port() if load in API_LOADS else None
    if api_port is not None:
        args = [*args, "--api-port", str(api_port)]
    command = [
        "valgrind",
        "--tool=callgrind",
        "--separate-threads=yes",
        f"--callgrind-out-file={out}/callgrind.out.%p",
        sys.executable,
        "-m",
        "delaywheel",
        "serve",
        "--port",
        "0",
        "--store",
        store_url,
        *args,
    ]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env, cwd=out)
    drain: subprocess.Popen[bytes] | None = None
    try:
        address = wait_listening(proc, START_TIMEOUT_S)
        # the server's log goes on being read, so that it never blocks on a full pipe
        drain = subprocess.Popen(["cat"], stdin=proc.stderr, stdout=subprocess.DEVNULL)
        if load.startswith("reserve_"):  # each call takes a ready task: fill first
            add_tasks(address, warmup + calls, READY_TOPIC, 0)
        loaded = LOADS[load](address) if api_port is None else API_LOADS[load](api_port)
        with loaded as (step, per_step):
            for _ in range(warmup):
                step()
            subprocess.run(
                ["callgrind_control", "-z", str(proc.pid)], check=True, capture_output=True
            )
            started_s = time.monotonic()
            for _ in range(calls):
                step()
            took_s = time.monotonic() - started_s
            total = _dump(proc.pid, out, keep)
            subprocess.run(
                ["callgrind_control", "-z", str(proc.pid)], check=True, capture_output=True
            )
            time.sleep(took_s)
            idle = _dump(proc.pid, out)
        return total / (calls * per_step), (total - idle) / (calls * per_step)
    finally:
        # under callgrind a graceful stop can take minutes: the dump is taken
        proc.terminate()
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if drain is not None:
            drain.wait()
        shutil.rmtree(out, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.tools.callgrind", description=__doc__)
    parser.add_argument("load", nargs="?", default="add", choices=sorted([*LOADS, *API_LOADS]))
    parser.add_argument("--tree", type=Path, action="append", default=[])
    parser.add_argument("--store", choices=("redis", "memory", "sqlite"), default="redis")
    parser.add_argument("--calls", type=int, default=DEFAULT_CALLS)
    parser.add_argument("--warmup", type=int, default=WARMUP_CALLS)
    # the calls' dumps kept there (one directory per tree), for callgrind_annotate
    parser.add_argument("--keep", type=Path, default=None)
    # anything else (after --) goes to serve, e.g. -- --replicas 1
    args, serve_args = parser.parse_known_args(argv)
    serve_args = [arg for arg in serve_args if arg != "--"]
    trees: list[Path | None] = list(args.tree) or [None]
    with tempfile.TemporaryDirectory(prefix="delaywheel-callgrind-redis-") as directory:
        for number, tree in enumerate(trees):
            with private_redis(Path(directory)) as redis_url:
                if args.store == "redis" and redis_url is None:
                    sys.exit("no redis-server installed")
                urls = {
                    "redis": redis_url,
                    "memory": "memory://",
                    # a file of its own for each tree, in the private redis's directory
                    "sqlite": f"sqlite:///{directory}/callgrind-{number}.db",
                }
                url = urls[args.store]
                assert url is not None
                keep = None if args.keep is None else args.keep / str(number)
                per_call, less_idle = count(
                    tree, url, args.load, args.calls, serve_args, args.warmup, keep
                )
            name = "this checkout" if tree is None else str(tree)
            print(
                f"{name}: {args.load} on {args.store}: {per_call:,.0f} instructions/call,"
                f" {less_idle:,.0f} less idle",
                flush=True,
            )


if __name__ == "__main__":
    main()
