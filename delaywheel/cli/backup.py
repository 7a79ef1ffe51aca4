"""``delaywheel backup --store URL FILE``: copy a running server's store (docs/operations.md)."""

from __future__ import annotations

from pathlib import Path

import click

from delaywheel.cli.env import Env, pass_env
from delaywheel.cli.errors import EXIT_UNREACHABLE, EXIT_USAGE, cli_error
from delaywheel.cli.output import plural
from delaywheel.cli.params import EnvOption
from delaywheel.config import DEFAULT_STORE


@click.command()
@click.option(
    "--store",
    "store_url",
    default=DEFAULT_STORE,
    show_default=True,
    envvar="DELAYWHEEL_STORE",
    show_envvar=True,
    cls=EnvOption,
    help="The store to copy: sqlite:///PATH, or redis://HOST:PORT/DB (the whole instance).",
)
@click.option(
    "--redis-prefix",
    default="delaywheel",
    show_default=True,
    envvar="DELAYWHEEL_REDIS_PREFIX",
    show_envvar=True,
    cls=EnvOption,
    help="Key prefix in Redis (only to count the store's tasks).",
)
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@pass_env
def backup(env: Env, store_url: str, redis_prefix: str, file: Path) -> None:
    """Copy the store to FILE, consistently, while the server runs.

    SQLite: a SQLite database (the backup API, in one step). Redis: an RDB
    snapshot of the instance, streamed as to a replica (SYNC). FILE is replaced
    only when the copy is complete.
    """
    from delaywheel.store.backup import backup as copy_store
    from delaywheel.store.base import StoreConfigError, StoreUnavailable

    try:
        done = copy_store(store_url, file, redis_prefix=redis_prefix)
    except StoreConfigError as exc:
        raise cli_error(str(exc), EXIT_USAGE) from None
    except StoreUnavailable as exc:
        raise cli_error(str(exc), EXIT_UNREACHABLE) from None
    except OSError as exc:  # FILE's directory is missing or not writable
        raise cli_error(f"cannot write {file}: {exc.strerror or exc}", EXIT_USAGE) from None
    counted = "" if done.tasks is None else f"{plural(done.tasks, 'task')}, "
    kind = "RDB snapshot" if store_url.startswith("redis") else "SQLite database"
    env.emit(
        {
            "store": done.store,
            "file": str(done.file),
            "bytes": done.size_bytes,
            "tasks": done.tasks,
            "duration_s": round(done.took_s, 3),
        },
        f"backed up {done.store} to {done.file} ({kind}): {counted}"
        f"{done.size_bytes} bytes in {done.took_s:.2f} s",
    )
