"""Where the server's time goes in each bench scenario: py-spy on ``delaywheel serve``.

``python -m bench.tools.profile [SCENARIO ...]`` (all of them when none is named;
``--list`` names them). Not a bench section: it prints and saves profiles,
not figures held against targets, and py-spy's pauses slow what it watches.

A live scenario starts the real server as the compare section does
(``bench._procs``; Redis is a private redis-server, AOF everysec), drives
the same load with the same clients (``bench._loads``), with the one
connection, the server and Redis pinned to one CPU as in ``bench.compare``
(``add8_*``: 8 client processes, unpinned). An unprofiled round comes first
and gives the CPU time per operation, user and system apart, from
``/proc``. Then, ``LEAD_S`` into a second round, ``py-spy record --format
raw --rate 500 --duration 8 --native --gil --pid PID`` runs on the other
CPUs. ``restart_*`` write 1,000,000 records with ``bench.recovery``'s
helpers, time one plain start and the read floor, then start ``delaywheel
serve`` under py-spy and stop it once the port is open. ``memory`` takes no
profile: tracemalloc in fresh server processes, 200,000 tasks due in a day
added on SQLite, then a server loading that file against one on an empty
file, by the line that allocated what stays.

Reading the samples. py-spy counts a thread that is runnable, and in
blocking mode it takes the stack where the thread stops for it. With the
client on the same CPU the server is often runnable but waiting for the
CPU, inside ``write`` (the reply woke the client, which took the CPU) or
``epoll_pwait``; those samples are waiting, not work. So samples whose
innermost frame is a system call are counted apart, and the shares below
are of the rest, the user code, scaled by the user CPU time per operation
that ``/proc`` measured (system time is given apart). ``--gil`` drops the
samples of the loop waiting in epoll with the GIL released (libuv's own
poll code goes with them). ``--native`` shows the C of uvloop, msgpack and
the collector; a C function inlined from a header counts as its caller.
Tables: self time by frame; self time with C charged to the calling Python
function (py-spy's view without ``--native``); inclusive time of
``KEY_FRAMES``; self time by module. Raw stacks and JSON go to
``bench/results/profiles/``, which ignores itself in git.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import linecache
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
import tracemalloc
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from delaywheel_client import Client

from bench import progress
from bench._loads import (
    CLK_TCK,
    DAY_S,
    MAX_STEPS,
    START_DELAY_S,
    TOPIC,
    WARMUP_STEPS,
    Address,
    drive,
    drive_processes,
    rss_bytes,
    warm_up,
)
from bench._memory import settled_rss
from bench._procs import LISTENING, free_port, private_redis_process, server_process
from bench._section import FULL as COMPARE
from bench._section import add_tasks, pinned
from bench.compare import fill_dw
from bench.echo_server import running as running_echo
from bench.recovery import FULL as RECOVERY
from bench.recovery import LOADED, MIXES, fill, timed_read, timed_start
from bench.tools._stacks import (
    KEY_FRAMES,
    aggregate,
    main_thread,
    read_stacks,
    short_path,
)

ROOT = Path(__file__).resolve().parents[2]
OUT_DIR = ROOT / "bench" / "results" / "profiles"
PY_SPY = str(Path(sys.executable).parent / "py-spy")
LEAD_S = 1.0  # load before py-spy attaches
TAIL_S = 2.0  # load after its window (attaching and writing the file take a moment)
BASELINE_S = 3.0  # the unprofiled round
TOP = 15
EVERY_CPU = os.sched_getaffinity(0)
SPY_CPUS = EVERY_CPU - {min(EVERY_CPU)} or EVERY_CPU  # compare.pinned takes the lowest
WATCHED = ("server", "client", "redis")  # whose CPU a round reads, in Rounds.run's order


@dataclass(frozen=True)
class Live:
    load: str  # a bench._loads.LOADS name
    server: str  # "memory", "redis" or "echo"
    missed: str  # the figure of the last ``make bench`` it explains
    processes: int = 0  # client processes; 0: one connection, pinned with the server
    fill: int = 0  # ready tasks topped up to before each round (reserve)


LIVE = {
    "echo": Live("ping", "echo", "the floor the one-call figures are held against"),
    "ping": Live("ping", "memory", "ping server CPU / echo floor 1.35 (<= 1.3)"),
    "get": Live("get", "memory", "get server CPU / echo floor 1.71 (<= 1.3)"),
    "add_memory": Live("add", "memory", "add 0.33x echo (>= 0.7), 0.24x beanstalkd put (>= 0.5)"),
    "add_redis": Live("add", "redis", "add on Redis 0.16x beanstalkd -b (>= 0.3)"),
    "add_many_memory": Live("add_many", "memory", "add_many 1.07x serial put (>= 5)"),
    "pipeline_memory": Live("pipeline", "memory", "pipelined adds 0.76x serial put (>= 3)"),
    "reserve_ack": Live(
        "reserve_ack",
        "memory",
        "0.25x reserve+delete (>= 0.6), 0.34x echo/2 (>= 0.7)",
        fill=100_000,
    ),
    "add8_memory": Live("add", "memory", "8 processes 0.35x beanstalkd (>= 0.6)", processes=8),
    "add8_redis": Live("add", "redis", "8 processes 0.32x beanstalkd -b (>= 0.5)", processes=8),
}
RESTART = {"restart_redis": "redis", "restart_sqlite": "sqlite"}
SCENARIOS = [*LIVE, *RESTART, "memory"]

# -- py-spy and the rounds --------------------------------------------------------


@dataclass(frozen=True)
class Sampling:
    rate: int
    duration_s: float
    native: bool
    nonblocking: bool
    gil: bool

    def command(self, output: Path, *target: str, gil: bool = True) -> list[str]:
        flags = ["--native"] * self.native + ["--nonblocking"] * self.nonblocking
        flags += ["--gil"] * (self.gil and gil)
        record = [PY_SPY, "record", "--format", "raw", "--rate", str(self.rate)]
        return [*record, "--full-filenames", *flags, "--output", str(output), *target]


def cpu_split(pid: int) -> tuple[float, float]:
    """(user s, system s) of a process, all its threads: fields 14 and 15 of proc(5)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK


def off_the_pinned_cpu() -> None:
    os.sched_setaffinity(0, SPY_CPUS)


def spy_line(log: str) -> str:
    return next((line for line in log.splitlines() if "Samples:" in line), "").strip()


def record_pid(sampling: Sampling, pid: int, output: Path) -> str:
    """py-spy on ``pid`` for its window (on the CPUs the pinned pair leaves free)."""
    command = sampling.command(output, "--duration", f"{sampling.duration_s:g}", "--pid", str(pid))
    done = subprocess.run(command, capture_output=True, text=True, preexec_fn=off_the_pinned_cpu)
    if done.returncode != 0 or not output.exists():
        raise RuntimeError(f"py-spy failed ({done.returncode}): {done.stderr[-2000:]}")
    return spy_line(done.stdout + done.stderr)


def per_op(ops: int, elapsed_s: float, spent: dict[str, list[float]]) -> dict[str, Any]:
    """A round's rate and the CPU per operation (us) of each process, user and system apart."""
    out = {"ops": ops, "rate": round(ops / elapsed_s, 1)}
    for who, cpu in spent.items():
        if cpu:
            out[f"{who}_user_us"] = round(cpu[0] / ops * 1e6, 2)
            out[f"{who}_sys_us"] = round(cpu[1] / ops * 1e6, 2)
    return out


@dataclass
class Rounds:
    """A scenario's rounds against a running server, each giving its rate and the
    CPU per operation of the server, the client (one connection) and Redis."""

    live: Live
    pid: int
    address: Address
    redis: list[int]  # Redis's pid, when there is one
    pool: ProcessPoolExecutor | None = None  # the client processes
    left: int = 0  # ready tasks the previous round left (reserve), as bench.compare does

    @property
    def cap(self) -> int:
        return self.live.fill - WARMUP_STEPS if self.live.fill else MAX_STEPS

    def top_up(self) -> None:
        """Ready tasks back to ``live.fill`` (reserve), outside the rounds and the window."""
        if self.live.fill:
            fill_dw(self.address, self.live.fill - self.left)

    def run(self, seconds: float) -> dict[str, Any]:
        live = self.live
        watched = [self.pid, os.getpid(), *self.redis]
        before = [cpu_split(each) for each in watched]
        if self.pool is not None:
            run = drive_processes(self.pool, live.processes, live.load, self.address, seconds)
        else:
            run = drive(live.load, self.address, self.pid, seconds, self.cap)
            self.left = self.cap - run.ops
        spent = [
            [b - a for a, b in zip(was, cpu_split(each), strict=True)]
            for was, each in zip(before, watched, strict=True)
        ]
        if self.pool is not None:
            spent[1] = []  # the clients are other processes
        return per_op(run.ops, run.elapsed_s, dict(zip(WATCHED, spent, strict=False)))


def sampled_round(
    rounds: Rounds, sampling: Sampling, lead_s: float, raw: Path
) -> tuple[dict[str, Any], str]:
    """A round with py-spy attached ``lead_s`` into it: (the round, py-spy's line)."""
    with ThreadPoolExecutor(1) as worker:  # its thread inherits this one's CPU
        loaded = worker.submit(rounds.run, lead_s + sampling.duration_s + TAIL_S)
        time.sleep(lead_s)
        spy = record_pid(sampling, rounds.pid, raw)
        return loaded.result(), spy


def profile_live(name: str, live: Live, sampling: Sampling, out: Path) -> dict[str, Any]:
    raw = out / f"{name}.raw.txt"
    with ExitStack() as stack:
        directory = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dw-profile-")))
        redis: list[int] = []
        url = "memory://"
        if live.server == "redis":
            found = stack.enter_context(private_redis_process(directory))
            if found is None:
                return {"skipped": "no redis-server installed"}
            redis, url = [found[0]], found[1]
        spawn = server_process(url) if live.server != "echo" else running_echo()
        rounds = Rounds(live, *stack.enter_context(spawn), redis)
        lead_s = LEAD_S
        if live.processes:
            spawned = ProcessPoolExecutor(live.processes, mp_context=get_context("spawn"))
            rounds.pool = stack.enter_context(spawned)
            for future in [rounds.pool.submit(warm_up) for _ in range(live.processes)]:
                future.result()
            lead_s += START_DELAY_S
        else:
            stack.enter_context(pinned([rounds.pid, *redis]))
        progress(f"{name}: unprofiled round of {BASELINE_S:g} s")
        rounds.top_up()
        baseline = rounds.run(BASELINE_S)
        rounds.top_up()
        progress(f"{name}: profiled round, py-spy for {sampling.duration_s:g} s")
        profiled, spy = sampled_round(rounds, sampling, lead_s, raw)
    return {
        "missed": live.missed,
        "load": live.load,
        "server": live.server,
        "processes": live.processes or 1,
        "pinned_to_one_cpu": not live.processes,
        "unprofiled": baseline,
        "profiled": profiled,
        "py_spy": spy,
        "scaled_by": "server user us per operation (unprofiled round)",
        **aggregate(read_stacks(raw), baseline["server_user_us"]),
    }


def profile_restart(name: str, store: str, sampling: Sampling, tasks: int, out: Path) -> Any:
    raw = out / f"{name}.raw.txt"
    _, _, spread_s, delayed = MIXES[0]  # the mix the read floor is taken on
    with ExitStack() as stack:
        directory = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dw-profile-")))
        url = f"sqlite:///{directory / 'bench.db'}"
        if store == "redis":
            found = stack.enter_context(private_redis_process(directory))
            if found is None:
                return {"skipped": "no redis-server installed"}
            url = found[1]
        progress(f"{name}: writing {tasks:,} records")
        asyncio.run(fill(url, tasks, spread_s, delayed))
        progress(f"{name}: one plain start, the read floor, then a start under py-spy")
        plain_s, loaded, listening_s = timed_start(url)
        floor_s, _ = timed_read(store, url)
        spy, log, wall_s, cpu = record_start(sampling, url, raw)
    match = LOADED.search(log)
    stacks = read_stacks(raw)
    return {
        "missed": f"restart / read floor, {store}: bench 2.31x Redis, 5.25x SQLite (<= 2)",
        "tasks": loaded,
        "unprofiled_load_s": plain_s,
        "unprofiled_exec_to_port_s": round(listening_s, 2),
        "read_floor_s": round(floor_s, 3),
        "restart_vs_floor": round(plain_s / floor_s, 2),
        "profiled_load_s": float(match.group(2)) if match else None,
        "profiled_exec_to_port_s": round(wall_s, 2),
        "server_user_s": round(cpu[0], 2),
        "server_sys_s": round(cpu[1], 2),
        "py_spy": spy,
        "scaled_by": "server user s from exec to the open port (profiled start)",
        **aggregate(stacks, cpu[0]),
        "main_thread": main_thread(stacks),
    }


def record_start(
    sampling: Sampling, url: str, output: Path
) -> tuple[str, str, float, tuple[float, float]]:
    """``delaywheel serve`` started under py-spy, sampled until its port opens:
    (py-spy's line, the log, exec to port s, the server's (user, system) s)."""
    serve = [sys.executable, "-m", "delaywheel", "serve", "--port", "0", "--store", url]
    # every thread, GIL or not: the SQLite store reads on a thread of its own
    command = sampling.command(output, "--", *serve, gil=False)
    started = time.perf_counter()
    spy = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log: list[str] = []
    assert spy.stderr is not None
    for line in spy.stderr:  # py-spy's lines and the server's log
        log.append(line)
        if LISTENING.search(line):
            break
    wall_s = time.perf_counter() - started
    child = int(Path(f"/proc/{spy.pid}/task/{spy.pid}/children").read_text().split()[0])
    cpu = cpu_split(child)
    spy.send_signal(signal.SIGINT)  # py-spy writes its file and stops the server
    rest, errors = spy.communicate(timeout=60)
    text = "".join(log) + errors + rest
    if not output.exists():
        raise RuntimeError(f"py-spy wrote nothing for {url}: {text[-2000:]}")
    return spy_line(text), text, wall_s, cpu


# -- memory ---------------------------------------------------------------------


def traced_server(url: str, count: int, directory: str, trace: bool) -> dict[str, Any]:
    """In a fresh process, a server; its RSS (and with ``trace`` a tracemalloc snapshot,
    saved in ``directory``) after a first ping and, when ``count``, after adding that
    many tasks due in a day."""
    import uvloop

    from delaywheel.app import serve
    from delaywheel.config import Settings

    logging.getLogger("delaywheel").setLevel(logging.ERROR)  # "listening on", store warnings
    if trace:
        tracemalloc.start()
    settings = Settings(port=free_port(), store_url=url)
    found: dict[str, Any] = {}

    def snapshot(tag: str) -> None:
        time.sleep(0.2)  # the server drops the client connection that asked (its buffers)
        found[f"{tag}_rss"] = rss_bytes(os.getpid())
        if not trace:
            return
        path = Path(directory) / f"{Path(url).stem}-{count}-{tag}.snapshot"
        tracemalloc.take_snapshot().dump(str(path))
        found[tag] = str(path)

    def client() -> None:
        address = settings.host, settings.port
        settled_rss(os.getpid(), address)
        snapshot("before")
        if count:
            add_tasks(address, count, TOPIC, DAY_S)
            with Client(*address) as ping:
                ping.ping()
            snapshot("after")

    async def main() -> None:
        ready = asyncio.Event()
        server = asyncio.create_task(serve(settings, ready=ready))
        await ready.wait()
        try:
            await asyncio.to_thread(client)
        finally:
            server.cancel()
            await asyncio.gather(server, return_exceptions=True)

    uvloop.run(main())
    return found


def in_fresh_process(url: str, count: int, directory: Path, trace: bool) -> dict[str, Any]:
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
        return pool.submit(traced_server, url, count, str(directory), trace).result()


def by_line(after: str, before: str, count: int) -> dict[str, Any]:
    """What ``after`` holds beyond ``before``, per task, by the line that allocated it."""
    diffs = tracemalloc.Snapshot.load(after).compare_to(tracemalloc.Snapshot.load(before), "lineno")
    rows = []
    for diff in sorted(diffs, key=lambda d: -d.size_diff)[:TOP]:
        where = diff.traceback[0]
        rows.append(
            {
                "line": f"{short_path(where.filename)}:{where.lineno}",
                "code": linecache.getline(where.filename, where.lineno).strip(),
                "bytes_per_task": round(diff.size_diff / count, 1),
                "blocks_per_task": round(diff.count_diff / count, 2),
            }
        )
    return {"bytes_per_task": round(sum(d.size_diff for d in diffs) / count, 1), "top": rows}


def account_memory(count: int) -> dict[str, Any]:
    """Bytes per task, added on SQLite and loaded: the RSS as the bench reads it (no
    tracemalloc, which takes memory of its own), then tracemalloc by line."""
    with tempfile.TemporaryDirectory(prefix="dw-profile-") as name:
        directory = Path(name)
        found: dict[str, dict[str, Any]] = {}
        for trace in (False, True):
            url = f"sqlite:///{directory / f'loaded-{trace}.db'}"
            progress(f"memory: {count:,} tasks added on SQLite, then loaded; tracemalloc {trace}")
            found[f"added{trace}"] = in_fresh_process(url, count, directory, trace)
            found[f"loaded{trace}"] = in_fresh_process(url, 0, directory, trace)
            empty_url = f"sqlite:///{directory / f'empty-{trace}.db'}"
            found[f"empty{trace}"] = in_fresh_process(empty_url, 0, directory, trace)
        added, loaded, empty = found["addedFalse"], found["loadedFalse"], found["emptyFalse"]
        return {
            "missed": "memory per pending task 313-350 B vs beanstalkd 300 B (<= 1.0x)",
            "tasks": count,
            "added_rss_per_task": round((added["after_rss"] - added["before_rss"]) / count, 1),
            "loaded_rss_per_task": round((loaded["before_rss"] - empty["before_rss"]) / count, 1),
            "added": by_line(found["addedTrue"]["after"], found["addedTrue"]["before"], count),
            "loaded": by_line(found["loadedTrue"]["before"], found["emptyTrue"]["before"], count),
        }


# -- output ---------------------------------------------------------------------


def table(title: str, rows: list[list[Any]], unit: str, top: int = TOP) -> str:
    lines = [f"  {title}"]
    lines += [f"    {pct:5.1f} % {value:9.3f} {unit}  {name}" for name, pct, value in rows[:top]]
    return "\n".join(lines)


def render(name: str, result: dict[str, Any]) -> str:
    if "skipped" in result:
        return f"[{name}] skipped: {result['skipped']}"
    head = {key: value for key, value in result.items() if not isinstance(value, list | dict)}
    lines = [f"[{name}] " + "; ".join(f"{key} {value}" for key, value in head.items())]
    lines += [f"  {key}: {result[key]}" for key in ("unprofiled", "profiled") if key in result]
    if "self" in result:
        unit = "s" if name.startswith("restart") else "us/op"
        lines.append("  system calls (% of all samples): " + str(result["system_calls"]))
        lines.append(table("user code, self by frame (C apart)", result["self"], unit))
        lines.append(table("user code, self, C in its Python caller", result["self_python"], unit))
        lines.append(table("user code, inclusive", result["inclusive"], unit, len(KEY_FRAMES)))
        lines.append(table("user code, self by module", result["modules"], unit))
    for key, rows in result.get("main_thread", {}).items():
        lines.append(f"  main thread, {key}: " + "; ".join(f"{n} {pct} %" for n, pct in rows[:12]))
    for key in ("added", "loaded"):
        if key in result:
            lines.append(f"  {key}: {result[key]['bytes_per_task']} B/task traced; top lines:")
            lines += [
                f"    {row['bytes_per_task']:7.1f} B {row['blocks_per_task']:5.2f} blocks"
                f"  {row['line']}  {row['code']}"
                for row in result[key]["top"]
            ]
    return "\n".join(lines)


def again(out: Path, name: str) -> None:
    """The tables of a saved profile aggregated anew (after a change to ``KEY_FRAMES``)."""
    path, raw = out / f"{name}.json", out / f"{name}.raw.txt"
    if not (path.exists() and raw.exists()):
        return
    result = json.loads(path.read_text())
    scale = result["unprofiled"]["server_user_us"] if name in LIVE else result["server_user_s"]
    stacks = read_stacks(raw)
    result.update(aggregate(stacks, scale))
    if name in RESTART:
        result["main_thread"] = main_thread(stacks)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(render(name, result), flush=True)


def git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    return done.stdout.strip()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.tools.profile", description=__doc__)
    parser.add_argument("scenarios", nargs="*", metavar="SCENARIO", help=", ".join(SCENARIOS))
    parser.add_argument("--list", action="store_true", help="print the scenario names")
    parser.add_argument("--rate", type=int, default=500, help="samples a second")
    parser.add_argument("--duration", type=float, default=8.0, help="seconds sampled")
    parser.add_argument("--python-only", action="store_true", help="py-spy without --native")
    parser.add_argument("--no-gil", action="store_true", help="live: samples without the GIL too")
    parser.add_argument("--nonblocking", action="store_true", help="never pause the server")
    parser.add_argument("--tasks", type=int, default=RECOVERY.tasks, help="records, restart")
    parser.add_argument("--memory-tasks", type=int, default=COMPARE.memory_tasks)
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    parser.add_argument("--again", action="store_true", help="aggregate the saved raw files anew")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(SCENARIOS))
        return
    unknown = sorted(set(args.scenarios) - set(SCENARIOS))
    if unknown:
        parser.error(f"unknown scenario {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}")
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    (out / ".gitignore").write_text("*\n")  # bound to this machine and moment, as bench/results
    native = not (args.python_only or args.nonblocking)  # py-spy cannot unwind C unpaused
    sampling = Sampling(args.rate, args.duration, native, args.nonblocking, not args.no_gil)
    meta = {
        "commit": git("rev-parse", "HEAD"),
        "uncommitted_server_changes": bool(git("status", "--porcelain", "delaywheel", "client")),
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "sampling": asdict(sampling),
    }
    for name in args.scenarios or SCENARIOS:
        if args.again:
            again(out, name)
            continue
        when = {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        when["load_average"] = " ".join(f"{load:.2f}" for load in os.getloadavg())
        if name in LIVE:
            found = profile_live(name, LIVE[name], sampling, out)
        elif name in RESTART:
            found = profile_restart(name, RESTART[name], sampling, args.tasks, out)
        else:
            found = account_memory(args.memory_tasks)
        result = {"scenario": name, **when, **meta, **found}
        (out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
        print(render(name, result), flush=True)
    summary = {path.stem: json.loads(path.read_text()) for path in sorted(out.glob("*.json"))}
    summary.pop("summary", None)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
