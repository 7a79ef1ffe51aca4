"""Managing tasks: ``add``, ``update``, ``delete``, ``get`` and ``list``.

``add`` and ``update`` share the time, body, task and target options (the target ones
are in ``targets``); ``_as_changes`` folds the ones given into the one map of fields the
client sends.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from typing import IO, Any, TypeVar

import click

from delaywheel.cli.env import Env, client_command, task_id_argument
from delaywheel.cli.errors import missing_is, not_found
from delaywheel.cli.output import from_json, task_table, task_text, wheel_text, when_text
from delaywheel.cli.params import DURATION, WHEN
from delaywheel.cli.targets import target_options

F = TypeVar("F", bound=Callable[..., Any])

# The engine's (engine/task.py), spelled out: the CLI does not import the engine
# (tests/test_results_cli.py holds the two together).
STATES = ("delayed", "ready", "reserved", "delivering", "dead", "done")

_UNSET: Any = object()

# -- the options add and update share ----------------------------------------------


def _time_options(func: F) -> F:
    func = click.option(
        "--at",
        type=WHEN,
        help="Due time: ISO 8601 (2026-12-24T09:00:00Z, +01:00 offsets; naive is local "
        "time) or a duration from now. Not with --delay.",
    )(func)
    return click.option(
        "--delay", type=DURATION, help="Due after this long: 90, 90s, 30m, 2h, 5d, 1h30m."
    )(func)


def _body_options(func: F) -> F:
    func = click.option(
        "--json-body",
        metavar="JSON",
        help='Body as a JSON value, sent as that value ({"$bin": "<base64>"} is bytes).',
    )(func)
    func = click.option(
        "--body-file",
        type=click.File("rb"),
        help="Body from a file ('-' for stdin), sent as bin bytes.",
    )(func)
    return click.option("--body", metavar="TEXT", help="Body as text, sent as a str.")(func)


def _task_options(func: F) -> F:
    func = target_options(func)
    func = click.option(
        "--priority",
        type=click.IntRange(0, 2**31 - 1),
        help="0 is the most urgent; the server's default is 1024.",
    )(func)
    func = click.option(
        "--max-attempts", type=click.IntRange(min=1), help="Deliveries before the task is dead."
    )(func)
    return click.option(
        "--ttr", type=DURATION, help="Time to run once reserved (duration; 0 = at most once)."
    )(func)


def json_option(text: str | None, option: str) -> Any:
    """An option's JSON value (``{"$bin": ...}`` is bytes); ``_UNSET`` when not given."""
    if text is None:
        return _UNSET
    try:
        return from_json(json.loads(text))
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint=f"'{option}'") from None


def _body(body: str | None, body_file: IO[bytes] | None, json_body: str | None) -> Any:
    given = [name for name, value in (("--body", body), ("--body-file", body_file),
                                      ("--json-body", json_body)) if value is not None]  # fmt: skip
    if len(given) > 1:
        raise click.UsageError(f"give one of --body, --body-file, --json-body, not {given}")
    if body is not None:
        return body
    if body_file is not None:
        return body_file.read()
    return json_option(json_body, "--json-body")


def _changes(
    delay: float | None,
    at: float | None,
    body: Any,
    ttr: float | None,
    max_attempts: int | None,
    target: dict[str, Any] | None,
    priority: int | None = None,
) -> dict[str, Any]:
    if delay is not None and at is not None:
        raise click.UsageError("give --delay or --at, not both")
    fields: dict[str, Any] = {}
    if delay is not None:
        fields["delay"] = delay
    if at is not None:
        fields["at"] = at
    if body is not _UNSET:
        fields["body"] = body
    if ttr is not None:
        fields["ttr"] = ttr
    if max_attempts is not None:
        fields["max_attempts"] = max_attempts
    if target is not None:
        fields["target"] = target
    if priority is not None:
        fields["priority"] = priority
    return fields


def _as_changes(func: Callable[..., None]) -> Callable[..., None]:
    """Call ``func`` with ``changes``, the fields given, in place of the shared options."""

    @functools.wraps(func)
    def wrapper(
        *args: Any,
        delay: float | None,
        at: float | None,
        body: str | None,
        body_file: IO[bytes] | None,
        json_body: str | None,
        ttr: float | None,
        max_attempts: int | None,
        target: dict[str, Any] | None,
        priority: int | None,
        **kwargs: Any,
    ) -> None:
        body_value = _body(body, body_file, json_body)
        changes = _changes(delay, at, body_value, ttr, max_attempts, target, priority)
        func(*args, changes=changes, **kwargs)

    return wrapper


# -- the commands ------------------------------------------------------------------


@click.command()
@click.option("--topic", required=True, help="Ready queue the task is delivered to.")
@_time_options
@_body_options
@click.option("--id", "task_id", help="Your own id (makes the add idempotent).")
@_task_options
@click.option(
    "--retain",
    type=DURATION,
    help="Keep the task done, with its result, this long once acked or delivered "
    "(default: the topic's retain, else not at all).",
)
@client_command
@_as_changes
def add(
    env: Env, topic: str, task_id: str | None, retain: float | None, changes: dict[str, Any]
) -> None:
    """Add a task, due now, after --delay, or at --at.

    Prints the id, due time, and the task's cycle and slot in the wheel (when it is in it).
    """
    payload = changes.pop("body", None)
    _warn_if_past(changes)
    result = env.client().add(topic, payload, id=task_id, retain=retain, **changes)
    wheel = wheel_text(result)
    env.emit(
        result,
        lambda: (
            f"added {result['id']}, due {when_text(result['at'], time.time())}"
            + ("" if wheel is None else f", {wheel}")
        ),
    )


@click.command()
@task_id_argument
@click.option("--topic", help="Move the task to this topic.")
@_time_options
@_body_options
@_task_options
@client_command
@_as_changes
def update(env: Env, task_id: str, topic: str | None, changes: dict[str, Any]) -> None:
    """Change a task: only the options given are sent. Prints the updated task."""
    if topic is not None:
        changes["topic"] = topic
    if not changes:
        raise click.UsageError("nothing to update: give at least one option")
    _warn_if_past(changes)
    with missing_is(task_id):
        task = env.client().update(task_id, **changes)
    env.emit(task, lambda: task_text(task))


# A time this far in the past is a mistake more often than "now" (a year typed
# wrong, a naive local time taken for UTC): it is accepted, and said.
PAST_NOTE_S = 1.0


def _warn_if_past(changes: dict[str, Any]) -> None:
    """A note on stderr when ``--at`` is in the past: the server takes it as due now."""
    at = changes.get("at")
    now_s = time.time()
    if isinstance(at, (int, float)) and at < now_s - PAST_NOTE_S:
        click.echo(
            f"note: --at {when_text(at, now_s)} is in the past: the task is due now",
            err=True,
        )


@click.command()
@task_id_argument
@client_command
def delete(env: Env, task_id: str) -> None:
    """Delete a task, in any state. Exits 1 when there was no such task."""
    if not env.client().delete(task_id):
        not_found(task_id)
    env.emit(True, f"deleted {task_id}")


@click.command()
@task_id_argument
@client_command
def get(env: Env, task_id: str) -> None:
    """Show a task, body included. Exits 1 when there is no such task."""
    task = env.client().get(task_id)
    if task is None:
        not_found(task_id)
    env.emit(task, lambda: task_text(task))


@click.command("list")
@click.option("--topic", help="Only tasks of this topic.")
@click.option("--state", type=click.Choice(STATES), help="Only tasks in this state.")
@click.option("--limit", type=click.IntRange(1, 1000), help="Tasks per page (server default 100).")
@click.option(
    "--cursor",
    "cursor_text",
    metavar="CURSOR",
    help="Start after this cursor (a previous page's next: a number, f... past the "
    'horizon, or with several servers the JSON ["host:port", cursor]).',
)
@click.option("--all", "follow", is_flag=True, help="Follow cursors to the last page.")
@client_command
def list_(
    env: Env,
    topic: str | None,
    state: str | None,
    limit: int | None,
    cursor_text: str | None,
    follow: bool,
) -> None:
    """List tasks, oldest first, one page unless --all.

    The table shows id, topic, state, due time and attempts, and the last error
    (its first 60 characters) when a listed task has one. With --json it prints
    {"tasks": [...], "next": cursor or null}, each error whole.
    """
    client = env.client()
    cursor = _cursor(cursor_text)
    tasks: list[dict[str, Any]] = []
    while True:
        page = client.list(topic=topic, state=state, limit=limit, cursor=cursor)
        tasks.extend(page["tasks"])
        cursor = page.get("next")
        if cursor is None or not follow:
            break
    if env.as_json:
        env.emit({"tasks": tasks, "next": cursor}, "")
        return
    click.echo(task_table(tasks) if tasks else "no tasks")
    if cursor is not None:
        shown = cursor if isinstance(cursor, int | str) else f"'{json.dumps(cursor)}'"
        click.echo(f"more tasks: use --all, or --cursor {shown} for the next page", err=True)


def _cursor(text: str | None) -> Any:
    """``--cursor``: a node's cursor (a number; ``f...`` in the tasks beyond the
    horizon) or a cluster's (``["host:port", cursor]``)."""
    if text is None:
        return None
    if text.startswith("f"):
        return text
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if type(value) in (int, str) or (
        type(value) is list and len(value) == 2 and isinstance(value[0], str)
    ):
        return value
    raise click.BadParameter(
        f'expected a number or ["host:port", number], got {text!r}', param_hint="'--cursor'"
    )
