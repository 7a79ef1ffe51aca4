"""Two source trees' servers timed side by side in one run: ``python -m bench.tools.sidebyside``.

Not a bench section: the bar "no slowdown on the hot path, side by side with
the commit before, within 3 %" compares two versions of the server, and on a
shared machine a rate measured in one run and a rate measured in another
differ by more than that (the load moves between them). Here both servers run
at once, each on a private redis-server of its own (or a fresh SQLite file, or
memory); each round drives one connection against one tree, pinned with its
server and Redis to one CPU as ``compare`` pins them, and the trees take
turns in the order A B B A, round after round, so that a drift of the machine
falls on both alike. It prints each tree's median rate and server CPU per
operation, and the ratio of the second tree to the first.

``python -m bench.tools.sidebyside --tree A --tree B [--store memory|redis|sqlite ...]
[--rounds N] [--round-s S] [LOAD ...]``; LOAD is one of ``bench._loads``'
(default ``add`` and ``pipeline``). Each server runs with ``PYTHONPATH`` set to its
tree and this checkout's interpreter, as ``bench.tools.callgrind`` runs them;
the client is this checkout's for both.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench._loads import LOADS, READY_TOPIC, WARMUP_STEPS, Address, Run, drive
from bench._procs import private_redis_process, wait_listening
from bench._section import add_tasks, pinned

START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0
# Ready tasks put in before each reserve_ack round (a round stops when they are used up).
RESERVE_FILL = 60_000


@dataclass
class Contender:
    """One tree's server on one store: what a round drives."""

    tree: Path
    pid: int
    address: Address
    pinned_pids: list[int]  # the server, and its redis-server if any
    runs: list[Run]


@contextmanager
def _server(tree: Path, store_url: str) -> Iterator[tuple[int, Address]]:
    """``delaywheel serve`` from ``tree`` (its code on ``PYTHONPATH``); yields (pid, address)."""
    env = {**os.environ, "PYTHONPATH": f"{tree}:{tree / 'client'}"}
    # the bench's clients all connect from 127.0.0.1; an older tree lacks the option
    command = [sys.executable, "-m", "delaywheel", "serve", "--port", "0", "--store", store_url]
    # from a directory of its own: ``-m`` puts the working directory first on the path
    with tempfile.TemporaryDirectory(prefix="delaywheel-sidebyside-") as cwd:
        usage = subprocess.run(
            [*command[:4], "--help"], env=env, cwd=cwd, capture_output=True, text=True, check=True
        ).stdout
        per_address = ["--max-connections-per-address", "10000"] if "per-address" in usage else []
        proc = subprocess.Popen(
            [*command, *per_address], stderr=subprocess.PIPE, text=True, env=env, cwd=cwd
        )
        drain: subprocess.Popen[bytes] | None = None
        try:
            address = wait_listening(proc, START_TIMEOUT_S)
            # the log goes on being read, so that the server never blocks on a full pipe
            drain = subprocess.Popen(["cat"], stdin=proc.stderr, stdout=subprocess.DEVNULL)
            yield proc.pid, address
        finally:
            proc.terminate()
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if drain is not None:
                drain.wait()


def _contender(stack: ExitStack, tree: Path, store: str, directory: Path) -> Contender:
    """``tree``'s server on a store of its own kind ``store``, open until ``stack`` closes."""
    extra: list[int] = []
    if store == "redis":
        redis_dir = directory / "redis"
        redis_dir.mkdir()
        found = stack.enter_context(private_redis_process(redis_dir))
        if found is None:
            sys.exit("no redis-server installed")
        redis_pid, url = found
        extra.append(redis_pid)
    elif store == "sqlite":
        url = f"sqlite:///{directory / 'bench.db'}"
    else:
        url = "memory://"
    pid, address = stack.enter_context(_server(tree, url))
    return Contender(tree, pid, address, [pid, *extra], [])


def _round(contender: Contender, load: str, round_s: float) -> Run:
    if load == "reserve_ack":  # each call takes a ready task: the same depth for both
        add_tasks(contender.address, RESERVE_FILL, READY_TOPIC, 0)
        with pinned(contender.pinned_pids):
            run = drive(
                load, contender.address, contender.pid, round_s, RESERVE_FILL - WARMUP_STEPS
            )
        # what is left is taken out unpinned, untimed: the next round starts level
        _drain_ready(contender.address)
        return run
    with pinned(contender.pinned_pids):
        return drive(load, contender.address, contender.pid, round_s)


def _drain_ready(address: Address) -> None:
    from delaywheel_client import Client

    with Client(*address) as client:
        while (task := client.reserve(READY_TOPIC, 0)) is not None:
            client.ack(task["id"])


def compare(
    trees: list[Path], store: str, load: str, rounds: int, round_s: float
) -> list[Contender]:
    """Every tree's runs of ``load`` on ``store``, rounds in the order A B B A."""
    with ExitStack() as stack:
        base = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="delaywheel-sbs-")))
        contenders = []
        for number, tree in enumerate(trees):
            directory = base / str(number)
            directory.mkdir()
            contenders.append(_contender(stack, tree, store, directory))
        for number in range(rounds):
            order = contenders if number % 2 == 0 else contenders[::-1]
            for contender in order:
                contender.runs.append(_round(contender, load, round_s))
        return contenders


def report(store: str, load: str, contenders: list[Contender]) -> None:
    first = contenders[0]
    first_rate = statistics.median(run.rate for run in first.runs)
    first_cpu = statistics.median(run.cpu_us for run in first.runs)
    for contender in contenders:
        rate = statistics.median(run.rate for run in contender.runs)
        cpu = statistics.median(run.cpu_us for run in contender.runs)
        rounds = " ".join(f"{run.rate:,.0f}" for run in contender.runs)
        print(
            f"{load:12} {store:7} {contender.tree}: {rate:10,.0f}/op·s  CPU {cpu:6.1f} µs/op"
            f"  rate {rate / first_rate:5.3f}x  CPU {cpu / first_cpu:5.3f}x  [{rounds}]",
            flush=True,
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.tools.sidebyside", description=__doc__)
    parser.add_argument("load", nargs="*", default=["add", "pipeline"], choices=sorted(LOADS))
    parser.add_argument("--tree", type=Path, action="append", required=True)
    parser.add_argument(
        "--store", action="append", choices=("memory", "redis", "sqlite"), default=None
    )
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--round-s", type=float, default=2.0)
    args = parser.parse_args(argv)
    if len(args.tree) < 2:
        parser.error("give two trees (or more): --tree A --tree B")
    for store in args.store or ["memory", "redis"]:
        for load in args.load:
            contenders = compare(
                [t.resolve() for t in args.tree], store, load, args.rounds, args.round_s
            )
            report(store, load, contenders)


if __name__ == "__main__":
    main()
