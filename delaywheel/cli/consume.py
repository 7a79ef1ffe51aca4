"""The worker's side: ``reserve``, ``ack``, ``release``, ``touch`` and ``kick``; and the
two that ask about the server itself, ``ping`` and ``stats``.
"""

from __future__ import annotations

import time

import click

from delaywheel.cli.env import Env, client_command, task_id_argument
from delaywheel.cli.errors import EXIT_FAILED, cli_error, missing_is
from delaywheel.cli.output import plural, seconds_text, stats_text, task_text, when_text
from delaywheel.cli.params import DURATION
from delaywheel.cli.tasks import json_option


@click.command()
@click.argument("topics", nargs=-1, required=True)
@click.option(
    "--timeout",
    "wait_s",
    type=DURATION,
    default=0.0,
    help="How long to wait for a task (duration; default 0: do not wait).",
)
@client_command
def reserve(env: Env, topics: tuple[str, ...], wait_s: float) -> None:
    """Take the oldest ready task of TOPICS and print it, body included.

    The task is then reserved for its ttr: ack it when done, or release it. Exits 1
    when no task was ready within --timeout.
    """
    task = env.client().reserve(list(topics), wait_s)
    if task is None:
        raise cli_error(f"nothing ready in {', '.join(topics)}", EXIT_FAILED)
    env.emit(task, lambda: task_text(task))


@click.command()
@task_id_argument
@click.option(
    "--result",
    "result_json",
    metavar="JSON",
    help="The task's result, a JSON value, kept with a task that is retained once done.",
)
@client_command
def ack(env: Env, task_id: str, result_json: str | None) -> None:
    """Finish a reserved task: it is removed, or kept done (with --result) for its retain."""
    result = None if result_json is None else json_option(result_json, "--result")
    with missing_is(task_id):
        acked = env.client().ack(task_id, result)
    env.emit(acked, f"acked {task_id}")


@click.command()
@task_id_argument
@click.option(
    "--timeout",
    "wait_s",
    type=DURATION,
    default=0.0,
    help="How long to wait (duration; default 0: do not wait).",
)
@client_command
def wait(env: Env, task_id: str, wait_s: float) -> None:
    """Wait until a task is done, dead or gone, and print it as it ended.

    Exits 1 when it is still running after --timeout.
    """
    with missing_is(task_id):
        task = env.client().wait(task_id, wait_s)
    if task is None:
        raise cli_error(f"{task_id} is not done after {seconds_text(wait_s)}", EXIT_FAILED)
    env.emit(task, lambda: task_text(task))


@click.command()
@task_id_argument
@click.option("--delay", type=DURATION, default=0.0, help="Due again after this long.")
@client_command
def release(env: Env, task_id: str, delay: float) -> None:
    """Give a reserved task back, due again after --delay."""
    with missing_is(task_id):
        result = env.client().release(task_id, delay)
    due = "now" if not delay else "in " + seconds_text(delay)
    env.emit(result, f"released {task_id}, due {due}")


@click.command()
@task_id_argument
@client_command
def touch(env: Env, task_id: str) -> None:
    """Extend a reserved task's deadline by its ttr. Prints the new deadline."""
    with missing_is(task_id):
        deadline = env.client().touch(task_id)
    env.emit(deadline, lambda: f"{task_id}: deadline {when_text(deadline, time.time())}")


@click.command()
@click.argument("topic", required=False)
@click.option("--count", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--id", "task_id", default=None, help="Kick this one dead task instead of a topic's.")
@client_command
def kick(env: Env, topic: str | None, count: int, task_id: str | None) -> None:
    """Make up to --count dead tasks of TOPIC due again, or the one named by --id."""
    if (topic is None) == (task_id is None):
        raise click.UsageError("give a TOPIC or --id ID (one of them)")
    if task_id is not None:
        with missing_is(task_id):
            result = env.client().kick_task(task_id)
        env.emit(result, f"kicked {task_id}")
        return
    assert topic is not None
    kicked = env.client().kick(topic, count)
    env.emit(kicked, f"kicked {plural(kicked, 'task')} of {topic}")


@click.command()
@client_command
def ping(env: Env) -> None:
    """Check that the server answers."""
    client = env.client()
    started = time.perf_counter()
    result = client.ping()
    elapsed_ms = (time.perf_counter() - started) * 1000
    env.emit(result, f"{result} from {', '.join(env.addresses)} in {elapsed_ms:.1f} ms")


@click.command()
@client_command
def stats(env: Env) -> None:
    """Show server statistics: tasks by state and topic, the wheel, the store."""
    result = env.client().stats()
    env.emit(result, lambda: stats_text(result))
