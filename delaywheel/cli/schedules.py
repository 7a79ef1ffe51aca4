"""``delaywheel schedule ...``: recurring schedules (docs/schedules.md).

``add``, ``update``, ``pause``, ``resume``, ``delete``, ``get``, ``list``,
``trigger`` and ``backfill`` call the server's ``schedule_*`` method of the
same name; ``next`` previews an unsaved spec offline, with the planner the
server uses (so a DST night can be checked before anything is saved), or a
saved schedule's id on the server.

``add`` takes the template options as ``delaywheel add`` does (the same
body, ttr, max-attempts and target options), and ``update`` sends only the
options given; ``--unset FIELD`` removes an optional field (sent as null).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import IO, Any, TypeVar

import click

from delaywheel.cli.env import Env, client_command
from delaywheel.cli.errors import EXIT_USAGE, cli_error, missing_is, not_found
from delaywheel.cli.output import when_text
from delaywheel.cli.params import DURATION, WHEN
from delaywheel.cli.schedule_text import schedule_table, schedule_text
from delaywheel.cli.tasks import _UNSET, _body, _body_options, _task_options

F = TypeVar("F", bound=Callable[..., Any])

# The server's choices (delaywheel/schedules/spec.py; tests/test_cli_schedules.py
# checks they agree), kept here so that the CLI starts without importing cronsim.
CATCHUP_POLICIES = ("latest", "skip", "all")
OVERLAP_POLICIES = ("skip", "buffer_one", "allow")
# The fields ``update --unset`` may remove, as the options spell them.
OPTIONAL_FIELDS = (
    "tz", "anchor", "start-at", "end-at", "max-runs", "jitter", "catchup",
    "catchup-window", "overlap", "body", "ttr", "max-attempts", "target", "priority",
)  # fmt: skip

schedule_id_argument = click.argument("schedule_id", metavar="ID")


@click.group()
def schedule() -> None:
    """Recurring schedules: cron (with a zone) or every N, one task per occurrence."""


# -- the options add and update share ----------------------------------------------


def _spec_options(func: F) -> F:
    func = click.option(
        "--anchor", type=WHEN, help="With --every: occurrences are anchor + k·every."
    )(func)
    func = click.option(
        "--every", type=DURATION, help="Instead of --cron: the interval (90s, 15m, 1h)."
    )(func)
    func = click.option(
        "--tz", metavar="ZONE", help="With --cron: an IANA zone name or UTC.  [default: UTC]"
    )(func)
    return click.option(
        "--cron", "cron", metavar="EXPR", help="5 fields, or 6 with seconds first."
    )(func)


def _policy_options(func: F) -> F:
    options = (
        click.option("--start-at", type=WHEN, help="No occurrence before this time."),
        click.option("--end-at", type=WHEN, help="No occurrence after this time."),
        click.option(
            "--max-runs", type=click.IntRange(min=1), help="End after this many fired."
        ),
        click.option(
            "--jitter", type=DURATION, help="Fire up to this long after each nominal time "
            "(the same offset on every server, never reaching the next occurrence).",
        ),
        click.option(
            "--catchup", type=click.Choice(CATCHUP_POLICIES),
            help="After downtime: fire the newest missed (latest, the default), none "
            "(skip) or each, up to 100 (all).",
        ),
        click.option(
            "--catchup-window", type=DURATION,
            help="Only missed occurrences this young may fire.  [default: 24h]",
        ),
        click.option(
            "--overlap", type=click.Choice(OVERLAP_POLICIES),
            help="While the previous occurrence is in flight: skip (the default), hold one "
            "(buffer_one) or run anyway (allow).",
        ),
    )  # fmt: skip
    for option in reversed(options):
        func = option(func)
    return func


def _as_fields(func: Callable[..., None]) -> Callable[..., None]:
    """Call ``func`` with ``fields``, the schedule map's fields given, in place of the
    spec, policy, body and task options."""

    @functools.wraps(func)
    def wrapper(
        *args: Any,
        body: str | None,
        body_file: IO[bytes] | None,
        json_body: str | None,
        **kwargs: Any,
    ) -> None:
        given = {name: kwargs.pop(name) for name in _FIELD_OPTIONS}
        fields = {name: value for name, value in given.items() if value is not None}
        payload = _body(body, body_file, json_body)
        if payload is not _UNSET:
            fields["body"] = payload
        func(*args, fields=fields, **kwargs)

    return wrapper


_FIELD_OPTIONS = (
    "cron", "tz", "every", "anchor", "start_at", "end_at", "max_runs", "jitter",
    "catchup", "catchup_window", "overlap", "ttr", "max_attempts", "target", "priority",
)  # fmt: skip


def _next_text(schedule: dict[str, Any]) -> str:
    next_s = schedule.get("next")
    return "no next occurrence" if next_s is None else f"next {when_text(next_s, time.time())}"


# -- the commands ------------------------------------------------------------------


@schedule.command()
@schedule_id_argument
@_spec_options
@click.option("--topic", required=True, help="Ready queue each occurrence is delivered to.")
@_body_options
@_task_options
@_policy_options
@client_command
@_as_fields
def add(env: Env, schedule_id: str, topic: str, fields: dict[str, Any]) -> None:
    """Save a schedule: --cron EXPR [--tz ZONE] or --every DURATION, and the task
    each occurrence puts (the options of `delaywheel add`). Prints its next time."""
    saved = env.client().schedule_add({"id": schedule_id, **fields, "topic": topic})
    env.emit(saved, lambda: f"added schedule {saved['id']}, {_next_text(saved)}")


@schedule.command()
@schedule_id_argument
@_spec_options
@click.option("--topic", help="Occurrences go to this topic from now on.")
@_body_options
@_task_options
@_policy_options
@click.option(
    "--unset", "unset", multiple=True, type=click.Choice(OPTIONAL_FIELDS),
    help="Remove this optional field (back to its default); repeat for more.",
)  # fmt: skip
@click.option(
    "--expected-version", type=click.IntRange(min=1),
    help="Refuse (conflict, exit 1) unless the schedule is at this version.",
)  # fmt: skip
@client_command
@_as_fields
def update(
    env: Env,
    schedule_id: str,
    topic: str | None,
    unset: tuple[str, ...],
    expected_version: int | None,
    fields: dict[str, Any],
) -> None:
    """Change a schedule: only the options given are sent. The pending occurrence
    becomes the first after now (never a past one). Prints the schedule."""
    if topic is not None:
        fields["topic"] = topic
    for option in unset:
        name = option.replace("-", "_")
        if name in fields:
            raise click.UsageError(f"--unset {option} and --{option} given together")
        fields[name] = None
    if not fields:
        raise click.UsageError("nothing to update: give at least one option")
    with missing_is(schedule_id):
        updated = env.client().schedule_update(schedule_id, fields, expected_version)
    env.emit(updated, lambda: schedule_text(updated))


@schedule.command()
@schedule_id_argument
@click.option("--note", metavar="TEXT", help="Why, shown by get and list.")
@client_command
def pause(env: Env, schedule_id: str, note: str | None) -> None:
    """Pause a schedule: its pending occurrence goes with the same write."""
    with missing_is(schedule_id):
        paused = env.client().schedule_pause(schedule_id, note)
    env.emit(paused, f"paused schedule {schedule_id}")


@schedule.command()
@schedule_id_argument
@client_command
def resume(env: Env, schedule_id: str) -> None:
    """Resume a paused schedule from now: what passed while paused is not fired
    (use backfill for that)."""
    with missing_is(schedule_id):
        resumed = env.client().schedule_resume(schedule_id)
    env.emit(resumed, lambda: f"resumed schedule {schedule_id}, {_next_text(resumed)}")


@schedule.command()
@schedule_id_argument
@client_command
def delete(env: Env, schedule_id: str) -> None:
    """Delete a schedule (occurrences already put stay tasks). Exits 1 when there
    was no such schedule."""
    if not env.client().schedule_delete(schedule_id):
        not_found(schedule_id)
    env.emit(True, f"deleted schedule {schedule_id}")


@schedule.command()
@schedule_id_argument
@client_command
def get(env: Env, schedule_id: str) -> None:
    """Show a schedule and its state. Exits 1 when there is no such schedule."""
    found = env.client().schedule_get(schedule_id)
    if found is None:
        not_found(schedule_id)
    env.emit(found, lambda: schedule_text(found))


@schedule.command("list")
@click.option("--topic", help="Only schedules whose occurrences go to this topic.")
@click.option("--paused/--active", "paused", default=None, help="Only paused (or active) ones.")
@click.option(
    "--limit", type=click.IntRange(1, 1000), help="Schedules per page (server default 100)."
)
@click.option("--cursor", metavar="ID", help="Start after this cursor (a previous page's next).")
@click.option("--all", "follow", is_flag=True, help="Follow cursors to the last page.")
@client_command
def list_(
    env: Env,
    topic: str | None,
    paused: bool | None,
    limit: int | None,
    cursor: str | None,
    follow: bool,
) -> None:
    """List schedules in id order, one page unless --all. With --json it prints
    {"schedules": [...], "next": cursor or null}."""
    client = env.client()
    found: list[dict[str, Any]] = []
    while True:
        page = client.schedule_list(topic=topic, paused=paused, limit=limit, cursor=cursor)
        found.extend(page["schedules"])
        cursor = page.get("next")
        if cursor is None or not follow:
            break
    if env.as_json:
        env.emit({"schedules": found, "next": cursor}, "")
        return
    click.echo(schedule_table(found) if found else "no schedules")
    if cursor is not None:
        click.echo(f"more schedules: use --all, or --cursor {cursor} for the next page", err=True)


@schedule.command()
@schedule_id_argument
@client_command
def trigger(env: Env, schedule_id: str) -> None:
    """Put one extra occurrence now (not counted; the schedule goes on as planned)."""
    with missing_is(schedule_id):
        put = env.client().schedule_trigger(schedule_id)
    env.emit(put, f"triggered schedule {schedule_id}: {put['id']}")


@schedule.command()
@schedule_id_argument
@click.argument("start", type=WHEN)
@click.argument("end", type=WHEN)
@client_command
def backfill(env: Env, schedule_id: str, start: float, end: float) -> None:
    """Put the occurrences from START to END (ISO 8601 times; END is at most now)
    under their own ids; one still present is left as it is. Prints the ids put."""
    with missing_is(schedule_id):
        filled = env.client().schedule_backfill(schedule_id, start, end)
    summary = f"backfilled {len(filled['ids'])}, {filled['existing']} already present"
    env.emit(filled, lambda: "\n".join([summary, *filled["ids"]]))


@schedule.command("next")
@click.argument("schedule_id", metavar="[ID]", required=False)
@click.option("--cron", "cron", metavar="EXPR", help="5 fields, or 6 with seconds first.")
@click.option("--tz", metavar="ZONE", help="With --cron: an IANA zone name or UTC.  [default: UTC]")
@click.option("--every", type=DURATION, help="Instead of --cron: the interval (90s, 15m, 1h).")
@click.option("--anchor", type=WHEN, help="With --every: occurrences are anchor + k·every.")
@click.option(
    "-n", "count", type=click.IntRange(1, 1000), default=5, show_default=True,
    help="How many occurrences.",
)  # fmt: skip
@click.option(
    "--from", "from_s", type=WHEN, help="Preview from this time instead of now (ISO 8601)."
)
@client_command
def next_(
    env: Env,
    schedule_id: str | None,
    cron: str | None,
    tz: str | None,
    every: float | None,
    anchor: float | None,
    count: int,
    from_s: float | None,
) -> None:
    """The next occurrences of a spec, offline (--cron or --every), or of a saved
    schedule ID on the server: the plan in plain English (the DST rule applied),
    then each time in the schedule's zone with its offset and in UTC. With --json:
    the reply, each time's Unix seconds under "utc"."""
    given = {"cron": cron, "tz": tz, "every": every, "anchor": anchor}
    spec: dict[str, Any] = {name: value for name, value in given.items() if value is not None}
    if schedule_id is not None:
        if spec or from_s is not None:
            named = ", ".join(f"--{name}" for name in [*spec, *(["from"] if from_s else [])])
            raise click.UsageError(f"give a saved schedule's ID or a spec, not both ({named})")
        with missing_is(schedule_id):
            reply = env.client().schedule_next(schedule_id, count)
    else:
        reply = _preview(spec, count, from_s)
    lines = [
        reply["description"],
        *(f"{t['local']}  ({_utc_text(t['utc'])})" for t in reply["times"]),
    ]
    env.emit(reply, "\n".join(lines))


def _utc_text(unix_s: float) -> str:
    """``2026-12-07T01:30:00Z``: the reply's ``utc`` (Unix seconds) as a UTC time."""
    shown = datetime.fromtimestamp(unix_s, timezone.utc).isoformat(timespec="seconds")
    return shown.replace("+00:00", "Z")


def _preview(spec: dict[str, Any], count: int, from_s: float | None) -> dict[str, Any]:
    # Imported here: the CLI starts without cronsim and the zones (its 0.09 s budget).
    from delaywheel.errors import RequestError
    from delaywheel.schedules.planner import render_next
    from delaywheel.schedules.spec import check_preview
    from delaywheel.wheel import MIN_TICK_S

    now_ms = round((time.time() if from_s is None else from_s) * 1000)
    try:
        # The server checks `every` against its own tick; offline, the smallest tick.
        reply: dict[str, Any] = render_next(check_preview(spec, MIN_TICK_S), now_ms, count)
    except RequestError as exc:
        raise cli_error(f"schedule next: {exc.message}", EXIT_USAGE) from None
    return reply
