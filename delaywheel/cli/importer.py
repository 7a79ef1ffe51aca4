"""``delaywheel import``: JSON lines, sent in all-or-nothing batches with ``add_many``.

A bad line, found here or by the server, stops the import; the message says how
many tasks earlier batches added and which line to resume from.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

import click

from delaywheel.cli.durations import parse_duration, parse_when
from delaywheel.cli.env import Env, client_command
from delaywheel.cli.errors import EXIT_USAGE, CliError, cli_error, failure
from delaywheel.cli.output import from_json, plural

if TYPE_CHECKING:
    from delaywheel_client import Client, ClusterClient

# The server names the bad task by its index in the batch: "task 12: ...".
_TASK_INDEX = re.compile(r"^task (\d+): (.*)$", re.DOTALL)


@dataclass
class _Batch:
    tasks: list[dict[str, Any]] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)
    size: int = 0  # bytes read for it, for the progress bar


@dataclass
class _Added:
    """What earlier batches added: they stay added when a later one fails."""

    ids: list[str] = field(default_factory=list)
    last_line: int = 0
    batches: int = 0

    def so_far(self) -> str:
        if not self.ids:
            return "no task was added"
        return (
            f"{len(self.ids)} tasks of lines 1-{self.last_line} were added by earlier "
            f"batches; resume from line {self.last_line + 1}"
        )


def _task_from_line(raw: bytes, now_s: float) -> dict[str, Any]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"expected a task map, got {type(value).__name__}")
    task: dict[str, Any] = from_json(value)
    for name in ("delay", "ttr", "retain"):  # durations may be written as such
        if isinstance(task.get(name), str):
            task[name] = parse_duration(task[name])
    if isinstance(task.get("at"), str):
        task["at"] = parse_when(task["at"], now_s)
    return task


def _batches(stream: IO[bytes], batch_size: int) -> Iterator[_Batch | tuple[int, str]]:
    """Batches of parsed tasks; a bad line ends the iteration with (line number, problem)."""
    batch = _Batch()
    for number, raw in enumerate(stream, start=1):
        batch.size += len(raw)
        if not raw.strip():
            continue
        try:
            batch.tasks.append(_task_from_line(raw, time.time()))
        except ValueError as exc:
            yield number, str(exc)
            return
        batch.lines.append(number)
        if len(batch.tasks) >= batch_size:
            yield batch
            batch = _Batch()
    if batch.tasks or batch.size:
        yield batch


def _send(client: Client | ClusterClient, batch: _Batch, added: _Added) -> None:
    """Add the batch's tasks, or fail naming the line the server refused."""
    try:
        results = client.add_many(batch.tasks)
    except Exception as exc:
        code = getattr(exc, "code", None)
        if code is None:
            raise
        message = str(getattr(exc, "message", exc))
        # Several nodes: the batch went as one add_many per owner, so the server's
        # "task N" counts in that node's share, not in the batch: name the batch's lines.
        exact = type(client).__name__ != "ClusterClient"
        raise _refused(str(code), message, batch, added, exact) from None
    added.ids.extend(str(result["id"]) for result in results)
    added.last_line = batch.lines[-1]
    added.batches += 1


def _refused(code: str, message: str, batch: _Batch, added: _Added, exact: bool = True) -> CliError:
    where = f"lines {batch.lines[0]}-{batch.lines[-1]}: "
    match = _TASK_INDEX.match(message) if exact else None
    if match and int(match.group(1)) < len(batch.lines):
        where = f"line {batch.lines[int(match.group(1))]}: "
        message = match.group(2)
    return failure(code, message, where, f"; {added.so_far()}")


def _stream_size(stream: IO[bytes]) -> int | None:
    try:
        info = os.fstat(stream.fileno())
    except (OSError, ValueError, AttributeError):
        return None
    return info.st_size if stat.S_ISREG(info.st_mode) else None


def _progress_bar(stream: IO[bytes], env: Env) -> AbstractContextManager[Any]:
    """A bar on stderr when it is a terminal and the size is known; else no bar (None)."""
    size = _stream_size(stream)
    if size is not None and not env.as_json and sys.stderr.isatty():
        return click.progressbar(length=size, label="importing", file=sys.stderr)
    return nullcontext(None)


def _source_name(stream: IO[bytes]) -> str:
    name = getattr(stream, "name", "-")
    return "stdin" if name in ("-", "<stdin>") else click.format_filename(name)


@click.command("import")
@click.argument("file", type=click.File("rb"))
@click.option(
    "--batch-size",
    type=click.IntRange(1, 100_000),
    default=500,
    show_default=True,
    help="Tasks per add_many request.",
)
@client_command
def import_(env: Env, file: IO[bytes], batch_size: int) -> None:
    """Add the tasks in FILE ('-' for stdin): JSON lines, one task map per line.

    Each line holds the task fields of the protocol (topic, id, delay, at, body, ttr,
    target, max_attempts, priority, retain). delay, ttr and retain may also be durations
    ("90s", "2h"), at an ISO 8601 time, and {"$bin": "<base64>"} is a bytes value. Blank
    lines are skipped.

    Tasks go to the server in batches of --batch-size with add_many, and each batch
    is all or nothing. When a line is bad (locally, or refused by the server) the
    error names it and that batch and every later line are not added, but the
    batches before it HAVE been added and stay: the message says how many and
    which line to resume from (e.g. with tail -n +LINE). A progress bar is shown on
    stderr when it is a terminal.
    """
    client = env.client()
    added = _Added()
    with _progress_bar(file, env) as progress:
        for item in _batches(file, batch_size):
            if isinstance(item, tuple):
                number, problem = item
                raise cli_error(f"line {number}: {problem}; {added.so_far()}", EXIT_USAGE)
            if item.tasks:
                _send(client, item, added)
            if progress is not None:
                progress.update(item.size)
    env.emit(
        {"added": len(added.ids), "batches": added.batches, "ids": added.ids},
        f"added {plural(len(added.ids), 'task')} from {_source_name(file)} "
        f"in {plural(added.batches, 'batch', 'batches')}",
    )
