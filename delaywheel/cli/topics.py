"""``delaywheel topic ...``: a topic's settings (docs/protocol.md, "Topic settings").

``show`` and ``list`` read them (``topic_get``, ``topic_list``); ``pause``,
``resume`` and ``limit`` change them (``topic_set``). ``pause`` takes an
optional duration, as beanstalkd's ``pause-tube`` does: without one the
topic stays paused until ``resume``.
"""

from __future__ import annotations

import time
from typing import Any

import click

from delaywheel.cli.env import Env, client_command
from delaywheel.cli.output import seconds_text, table, when_text
from delaywheel.cli.params import DURATION

# topic_set's paused_until for a pause with no end (delaywheel/engine/topics.py's
# PAUSED_FOR_EVER_S; kept here so that the CLI starts without the engine).
PAUSED_FOR_EVER_S = 253_402_300_799.0

topic_argument = click.argument("topic", metavar="TOPIC")


@click.group()
def topic() -> None:
    """A topic's settings: pause and resume it, limit its rate and concurrency."""


def _paused_text(settings: dict[str, Any], now_s: float) -> str:
    until = settings.get("paused_until")
    if not settings.get("paused"):
        return "no"
    if until is None or until >= PAUSED_FOR_EVER_S:
        return "yes, until resumed"
    return f"yes, until {when_text(until, now_s)}"


def _limit_text(settings: dict[str, Any]) -> str:
    parts = []
    if settings.get("rate") is not None:
        parts.append(f"{settings['rate']:g}/s (burst {settings.get('burst', 1)})")
    if settings.get("concurrency") is not None:
        parts.append(f"{settings['concurrency']} at once")
    return ", ".join(parts) or "none"


def _kept_text(settings: dict[str, Any]) -> str:
    """What a topic's retention says, when it says anything but the defaults."""
    parts = []
    if settings.get("retain"):
        parts.append(f"done {seconds_text(settings['retain'])}")
    if settings.get("dead_retain") is not None:
        parts.append(f"dead {seconds_text(settings['dead_retain'])}")
    return f"; kept: {', '.join(parts)}" if parts else ""


def _dead_retain_text(kept_s: float | None) -> str:
    return "the server's --dead-retention" if kept_s is None else seconds_text(kept_s)


def settings_text(settings: dict[str, Any]) -> str:
    now_s = time.time()
    rows = [
        ("topic", str(settings.get("topic"))),
        ("paused", _paused_text(settings, now_s)),
        ("rate", "none" if settings.get("rate") is None else f"{settings['rate']:g}/s"),
        ("burst", str(settings.get("burst"))),
        ("concurrency", str(settings.get("concurrency") or "none")),
        ("retain", seconds_text(settings.get("retain", 0))),
        ("dead retain", _dead_retain_text(settings.get("dead_retain"))),
        ("note", settings.get("note") or "-"),
    ]
    width = max(len(key) for key, _ in rows) + 1
    return "\n".join(f"{key + ':':<{width}} {value}" for key, value in rows)


@topic.command()
@topic_argument
@client_command
def show(env: Env, topic: str) -> None:
    """Show a topic's settings (the defaults when it has none)."""
    settings = env.client().topic_get(topic)
    env.emit(settings, lambda: settings_text(settings))


@topic.command("list")
@click.option("--paused/--running", "paused", default=None, help="Only paused (or running) ones.")
@click.option("--limit", type=click.IntRange(1, 1000), help="Topics per page (server default 100).")
@click.option("--cursor", metavar="TOPIC", help="Start after this topic (a previous page's next).")
@client_command
def list_(env: Env, paused: bool | None, limit: int | None, cursor: str | None) -> None:
    """List the topics that have settings, by name. With --json it prints
    {"topics": [...], "next": cursor or null}."""
    page = env.client().topic_list(paused=paused, limit=limit, cursor=cursor)
    if env.as_json:
        env.emit(page, "")
        return
    now_s = time.time()
    rows = [
        (str(t["topic"]), _paused_text(t, now_s), _limit_text(t), t.get("note") or "")
        for t in page["topics"]
    ]
    click.echo(table(("TOPIC", "PAUSED", "LIMITS", "NOTE"), rows) if rows else "no topic settings")
    if page.get("next") is not None:
        click.echo(f"more topics: --cursor {page['next']} for the next page", err=True)


@topic.command()
@topic_argument
@click.argument("duration", type=DURATION, required=False)
@click.option("--note", metavar="TEXT", help="Why, shown by show and list.")
@client_command
def pause(env: Env, topic: str, duration: float | None, note: str | None) -> None:
    """Pause a topic: its tasks still fall due and count as ready, but reserve
    skips it and its deliveries wait. For DURATION (90s, 30m, 2h), or until
    resume."""
    until = PAUSED_FOR_EVER_S if duration is None else time.time() + duration
    changes: dict[str, Any] = {"paused_until": until}
    if note is not None:
        changes["note"] = note
    settings = env.client().topic_set(topic, changes)
    env.emit(settings, lambda: f"paused {topic}: {_paused_text(settings, time.time())}")


@topic.command()
@topic_argument
@client_command
def resume(env: Env, topic: str) -> None:
    """Resume a paused topic: its backlog goes out under its limits."""
    settings = env.client().topic_set(topic, {"paused_until": None})
    env.emit(settings, f"resumed {topic}")


@topic.command()
@topic_argument
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), help="Tasks a second.")
@click.option(
    "--burst",
    type=click.IntRange(min=1),
    help="Tasks at once after a quiet time (not given: 20 ms of the rate, at least 1).",
)
@click.option("--concurrency", type=click.IntRange(min=1), help="Reserved or delivering at once.")
@click.option("--no-rate", is_flag=True, help="Remove the rate limit.")
@click.option("--no-concurrency", is_flag=True, help="Remove the concurrency limit.")
@click.option(
    "--retain", type=DURATION, help="How long a completed task is kept (30m, 1d; 0: not at all)."
)
@click.option("--dead-retain", type=DURATION, help="How long a dead task is kept (7d, 1h).")
@click.option(
    "--no-dead-retain", is_flag=True, help="Dead tasks kept as the server's --dead-retention says."
)
@client_command
def limit(
    env: Env,
    topic: str,
    rate: float | None,
    burst: int | None,
    concurrency: int | None,
    no_rate: bool,
    no_concurrency: bool,
    retain: float | None,
    dead_retain: float | None,
    no_dead_retain: bool,
) -> None:
    """Limit how fast (--rate, --burst) and how many at once (--concurrency) a
    topic's tasks are handed out, to reserve and to targets together, and how
    long its completed (--retain) and dead (--dead-retain) tasks are kept."""
    changes: dict[str, Any] = {}
    for name, value, unset in (
        ("rate", rate, no_rate),
        ("concurrency", concurrency, no_concurrency),
        ("dead-retain", dead_retain, no_dead_retain),
    ):
        if value is not None and unset:
            raise click.UsageError(f"--{name} and --no-{name} given together")
        if value is not None or unset:
            changes[name.replace("-", "_")] = value
    for name, value in (("burst", burst), ("retain", retain)):
        if value is not None:
            changes[name] = value
    if not changes:
        raise click.UsageError(
            "nothing to change: give --rate, --burst, --concurrency, --retain or --dead-retain"
        )
    settings = env.client().topic_set(topic, changes)
    env.emit(settings, lambda: f"{topic}: limits {_limit_text(settings)}{_kept_text(settings)}")
