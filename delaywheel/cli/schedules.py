"""``delaywheel schedule ...``: recurring schedules (docs/schedules.md).

``schedule next --cron EXPR [--tz ZONE] -n N`` (or ``--every DURATION
[--anchor TIME]``) previews a spec offline, with the same planner the
server uses, so a DST night can be checked before anything is saved. The
commands that talk to a server (add, list, get, pause, ...) come with the
engine's schedules.
"""

from __future__ import annotations

import time
from typing import Any

import click

from delaywheel.cli.env import Env, pass_env
from delaywheel.cli.errors import EXIT_USAGE, cli_error
from delaywheel.cli.params import DURATION, WHEN


@click.group()
def schedule() -> None:
    """Recurring schedules: cron (with a zone) or every N, one task per occurrence."""


@schedule.command("next")
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
@pass_env
def next_(
    env: Env,
    cron: str | None,
    tz: str | None,
    every: float | None,
    anchor: float | None,
    count: int,
    from_s: float | None,
) -> None:
    """The next occurrences of a spec, offline: UTC, local time with its offset,
    and the plan in plain English (the DST rule applied)."""
    # Imported here: the CLI starts without cronsim and the zones (its 0.09 s budget).
    from delaywheel.errors import RequestError
    from delaywheel.schedules.planner import render_next
    from delaywheel.schedules.spec import check_preview
    from delaywheel.wheel import MIN_TICK_S

    given = {"cron": cron, "tz": tz, "every": every, "anchor": anchor}
    spec: dict[str, Any] = {name: value for name, value in given.items() if value is not None}
    now_ms = round((time.time() if from_s is None else from_s) * 1000)
    try:
        # The server checks `every` against its own tick; offline, the smallest tick.
        reply = render_next(check_preview(spec, MIN_TICK_S), now_ms, count)
    except RequestError as exc:
        raise cli_error(f"schedule next: {exc.message}", EXIT_USAGE) from None
    lines = [reply["description"], *(f"{t['local']}  ({t['utc']})" for t in reply["times"])]
    env.emit(reply, "\n".join(lines))
