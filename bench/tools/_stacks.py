"""py-spy's raw (collapsed) stacks read and aggregated, for ``bench/tools/profile.py``."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

# label -> pattern over a frame's "module:function"; a sample counts once per label.
KEY_FRAMES = {
    "event loop outside Python callbacks": r"^\(event loop\)$",
    "Connection.data_received": r"connection\.py:Connection\.data_received$",
    "Connection._handle": r"connection\.py:Connection\._handle$",
    "unpack requests (Decoder)": r"protocol\.py:Decoder\.",
    "pack replies (Encoder)": r"protocol\.py:Encoder\.",
    "msgpack C code": r"^msgpack:",
    "validate": r"^delaywheel/engine/validate\.py:",
    "Engine.add / add_many": r"engine\.py:Engine\.add(_many)?$",
    "TaskTable.create": r"table\.py:TaskTable\.create$",
    "TaskTable.move": r"table\.py:TaskTable\.move$",
    "Engine.try_reserve / ack": r"engine\.py:Engine\.(try_reserve|ack)$",
    "Task() and to_record": r"(task\.py:Task\.__init__|record\.py:to_record)$",
    "Journal.record": r"journal\.py:Journal\.record$",
    "Journal.flush / _start": r"journal\.py:Journal\.(flush|_start)$",
    "Journal._written (completion)": r"journal\.py:Journal\._written$",
    "ColdTasks.pack (pack far tasks)": r"cold\.py:ColdTasks\.pack$",
    "store submit": r"^delaywheel/store/(redis/)?\w+\.py:\w+\.(submit|_submit_one)$",
    "Redis journal connection": r"^delaywheel/store/redis/link\.py:",
    "wheel insert": r"wheel\.py:TimingWheel\.insert(_many)?$",
    "task index": r"^delaywheel/engine/index\.py:",
    "reply writing (Connection._flush)": r"connection\.py:Connection\.(_flush|_send)$",
    "GC": r"^CPython:gc_collect",
    "ColdTasks.load (restart)": r"cold\.py:ColdTasks\.(load|_load_batch)$",
    "store load (restart)": r"^delaywheel/store/(redis/scan|\w+)\.py:(\w+Store\.load|scan_hash)",
    "redis-py (restart)": r"^redis/",
    "record read (restart)": r"record\.py:(read_record|_unpack_record|from_record)$",
    "imports (restart)": r"^<frozen importlib",
}
THREAD_ROOT = "threading.py:Thread._bootstrap"  # the outermost frame of a thread's stack
MAIN_TABLES = ("self_python", "inclusive")
ENTRY_FILES = ("asyncio/runners.py", "asyncio/base_events.py", "uvloop/__init__.py")
NATIVE = {  # substring of a native frame's file -> module
    "/uvloop/": "uvloop",
    "libuv": "libuv",
    "msgpack": "msgpack",
    "hiredis": "hiredis",
    "sqlite": "sqlite3",
    "libpython": "CPython",
    "/Python-3": "CPython",
    "/include/python3": "CPython",
    "libc.so": "libc",
}
SYSTEM_CALLS = frozenset(
    "read readv recv recvfrom recvmsg write writev send sendto sendmsg epoll_wait epoll_pwait"  # noqa: SIM905
    " epoll_ctl poll select futex fsync fdatasync pread64 pwrite64 nanosleep getpid".split()
)


# -- stacks ---------------------------------------------------------------------

FRAME = re.compile(r"^(.*) \(([^()]*?)(?::\d+)?\)$")
STDLIB = re.compile(r"/lib/python3\.\d+/")
Stack = list[str]  # "module:function" names, root first


def short_path(path: str) -> str:
    """A Python file's path from its package (or the stdlib) down, wherever it is."""
    if "/site-packages/" in path:
        return path.split("/site-packages/", 1)[1]
    found = STDLIB.search(path)
    if found:
        return path[found.end() :]
    for package in ("delaywheel_client/", "delaywheel/", "bench/"):
        at = path.find(f"/{package}")
        if at >= 0:
            return path[at + 1 :]
    return path


def frame_name(text: str) -> str:
    """``"module:function"`` of one py-spy frame; Python modules end in ``.py``."""
    match = FRAME.match(text)
    function, path = (match.group(1), match.group(2)) if match else (text, "?")
    if path.endswith(".py") or path.startswith("<"):
        return f"{short_path(path)}:{function}"
    found = [module for part, module in NATIVE.items() if part in path]
    return f"{found[0] if found else Path(path).name}:{'?' if function[:2] == '0x' else function}"


def is_python(name: str) -> bool:
    return name.split(":", 1)[0].endswith((".py", ">"))


def read_stacks(path: Path) -> list[tuple[Stack, int]]:
    """py-spy's raw output: a stack and its sample count per line."""
    stacks = []
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        # a frame inlined from a header is its caller's code
        texts = [text for text in stack.split(";") if not re.search(r"\.h(:\d+)?\)$", text)]
        stacks.append(([frame_name(text) for text in texts], int(count)))
    return stacks


def python_leaf(stack: Stack) -> str:
    """The innermost Python frame: where py-spy without --native puts the sample."""
    leaf = next((name for name in reversed(stack) if is_python(name)), "?")
    return "(event loop)" if leaf.startswith(ENTRY_FILES) else leaf


def in_system_call(stack: Stack) -> bool:
    module, _, function = stack[-1].partition(":")
    return module == "libc" and function in SYSTEM_CALLS


def aggregate(stacks: list[tuple[Stack, int]], scale: float) -> dict[str, Any]:
    """Shares of the user-code samples, each with ``scale`` times it (the user CPU
    per operation, or of the whole start); system calls as shares of all samples."""
    total = sum(count for _, count in stacks)
    calls: Counter[str] = Counter()
    own: Counter[str] = Counter()
    folded: Counter[str] = Counter()
    modules: Counter[str] = Counter()
    keys: Counter[str] = Counter()
    for stack, count in stacks:
        if in_system_call(stack):
            calls[f"{stack[-1]} (in {python_leaf(stack)})"] += count
            continue
        gc = any(name.startswith("CPython:gc_collect") for name in stack)
        py_leaf = python_leaf(stack)
        own[stack[-1]] += count
        folded["(GC)" if gc else py_leaf] += count
        modules["CPython GC" if gc else stack[-1].rsplit(":", 1)[0]] += count
        for label, pattern in KEY_FRAMES.items():
            if any(re.search(pattern, name) for name in [*stack, py_leaf]):
                keys[label] += count
    user = total - sum(calls.values())

    def rows(counter: Counter[str], top: int, of: int = user) -> list[list[Any]]:
        return [
            [name, round(100 * n / of, 1), round(scale * n / of, 3)]
            for name, n in counter.most_common(top)
        ]

    return {
        "samples": total,
        "user_code_samples": user,
        "system_calls_pct_of_all": round(100 * (total - user) / max(total, 1), 1),
        "system_calls": [row[:2] for row in rows(calls, 6, max(total, 1))],
        "self": rows(own, 40),
        "self_python": rows(folded, 40),
        "inclusive": rows(keys, len(KEY_FRAMES)),
        "modules": rows(modules, 25),
    }


def main_thread(stacks: list[tuple[Stack, int]]) -> dict[str, list[list[Any]]]:
    """Shares of the main thread's samples alone (the SQLite store reads on a thread
    of its own, whose outermost Python frame is ``THREAD_ROOT``)."""
    mine = [
        (stack, count)
        for stack, count in stacks
        if not next((name for name in stack if is_python(name)), "").startswith(THREAD_ROOT)
    ]
    found = aggregate(mine, 0.0)
    return {key: [row[:2] for row in found[key]] for key in MAIN_TABLES}
