"""The ``delaywheel`` command: ``serve`` runs the server; the rest talk to one.

Exit codes: 0 success; 1 not found, conflict or exists (also ``reserve`` that got
nothing); 2 usage error (click's own, a bad duration or time, and the server's
``bad_request``, ``too_large`` and ``unauthorized``); 3 the server cannot be reached or
is ``unavailable`` (``serve``: the store cannot be opened); 4 ``serve`` cannot listen
on its port. A failure is one line on stderr, never a traceback.

Every setting of ``serve`` can also come from an environment variable named
``DELAYWHEEL_<OPTION>`` (``--tick`` from ``DELAYWHEEL_TICK``, ``--max-body`` from
``DELAYWHEEL_MAX_BODY``); the global client options likewise (``DELAYWHEEL_SERVER``,
``DELAYWHEEL_TOKEN``, ``DELAYWHEEL_JSON``, ``DELAYWHEEL_TIMEOUT``, ``DELAYWHEEL_TLS``,
``DELAYWHEEL_TLS_CA``). ``DELAYWHEEL_TOKEN`` is read by both sides on purpose: one secret
for the server and its clients. The client's own certificate is not: ``--tls-cert`` and
``--tls-key`` read ``DELAYWHEEL_TLS_CLIENT_CERT`` and ``DELAYWHEEL_TLS_CLIENT_KEY``, as
``DELAYWHEEL_TLS_CERT`` and ``DELAYWHEEL_TLS_KEY`` are the server's.

With ``--json`` every command prints one JSON document on stdout: the server's result
for the method it calls. Bytes (a bin ``body``) are written as ``{"$bin": "<base64>"}``,
and the same wrapper is read back by ``--json-body`` and ``import``.

This module holds the group, its global options and the one place failures are
printed; the commands live in ``serve``, ``tasks``, ``consume``, ``cluster`` and
``importer``. ``--server`` takes one address or the comma-separated nodes of one
keyspace; with several, the commands use ``ClusterClient`` (each task's call goes to
its owner).
"""

from __future__ import annotations

import sys
from typing import Any

import click

from delaywheel import __version__
from delaywheel.cli import backup, cluster, consume, importer, schedules, serve, tasks, topics
from delaywheel.cli.env import DEFAULT_TIMEOUT_S, Env
from delaywheel.cli.errors import EXIT_FAILED
from delaywheel.cli.params import DURATION, EnvOption, ServerList
from delaywheel.config import DEFAULT_PORT

__all__ = ["main"]

DEFAULT_SERVER = f"127.0.0.1:{DEFAULT_PORT}"
# Checked only when a command connects (Env.client), not here: --tls-key without
# --tls-cert, say, must not stop ``serve``, which has TLS options of its own.
_TLS_FILE = click.Path(dir_okay=False)

_EPILOG = """\
Exit codes: 0 success; 1 not found, conflict or exists; 2 usage error or a request
the server refuses (bad_request, too_large, unauthorized); 3 server unreachable or
unavailable (serve: the store cannot be opened); 4 serve cannot listen on its port.
Failures are one line on stderr.

With --json each command prints one JSON document on stdout: the result of the
server method it calls. Bytes (a bin body) appear as {"$bin": "<base64>"}; the
same wrapper is accepted by --json-body and import.

Durations: 90, 1.5, 90s, 30m, 2h, 5d, 1w, 1h30m. Times: ISO 8601
(2026-12-24T09:00:00Z, with an offset, or naive = local) or a duration from now.
"""


class _Group(click.Group):
    """A group whose failures are one line on stderr (click prints usage, then the error)."""

    def main(
        self,
        args: Any = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        try:
            result = super().main(args, prog_name, complete_var, False, **extra)
        except click.UsageError as exc:
            where = _command_name(exc.ctx)
            click.echo(_one_line(f"{where}: {exc.format_message()}"), err=True)
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            click.echo(_one_line(exc.format_message()), err=True)
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("delaywheel: aborted", err=True)
            sys.exit(EXIT_FAILED)
        sys.exit(result if isinstance(result, int) else 0)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _command_name(ctx: click.Context | None) -> str:
    """``delaywheel add``, whatever name the program was started by (``python -m``...)."""
    names = []
    while ctx is not None and ctx.parent is not None:
        names.append(ctx.info_name or "")
        ctx = ctx.parent
    return " ".join(["delaywheel", *reversed(names)])


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]}, epilog=_EPILOG)
@click.option(
    "--server",
    type=ServerList(),
    default=DEFAULT_SERVER,
    show_default=True,
    envvar="DELAYWHEEL_SERVER",
    show_envvar=True,
    cls=EnvOption,
    help="Server to talk to, HOST:PORT; or the nodes of one keyspace, comma-separated "
    "(each task's call then goes to its owner; see `delaywheel cluster`).",
)
@click.option(
    "--token",
    envvar="DELAYWHEEL_TOKEN",
    show_envvar=True,
    cls=EnvOption,
    help="Sent with auth before the first request (the server's --token).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    envvar="DELAYWHEEL_JSON",
    show_envvar=True,
    cls=EnvOption,
    help='Machine output: one JSON document per command on stdout; bytes as {"$bin": base64}.',
)
@click.option(
    "--timeout",
    "timeout_s",
    type=DURATION,
    default=DEFAULT_TIMEOUT_S,
    show_default=True,
    envvar="DELAYWHEEL_TIMEOUT",
    show_envvar=True,
    cls=EnvOption,
    help="Seconds to wait for each reply (reserve adds its own --timeout).",
)
@click.option(
    "--tls",
    is_flag=True,
    envvar="DELAYWHEEL_TLS",
    show_envvar=True,
    cls=EnvOption,
    help="Connect with TLS, verifying the server's certificate (the system's CAs).",
)
@click.option(
    "--tls-ca",
    type=_TLS_FILE,
    envvar="DELAYWHEEL_TLS_CA",
    show_envvar=True,
    cls=EnvOption,
    help="Trust this PEM CA for the server's certificate (implies --tls).",
)
@click.option(
    "--tls-cert",
    type=_TLS_FILE,
    envvar="DELAYWHEEL_TLS_CLIENT_CERT",
    show_envvar=True,
    cls=EnvOption,
    help="This client's PEM certificate, for a server that wants one (implies --tls).",
)
@click.option(
    "--tls-key",
    type=_TLS_FILE,
    envvar="DELAYWHEEL_TLS_CLIENT_KEY",
    show_envvar=True,
    cls=EnvOption,
    help="The PEM private key of --tls-cert (if not in the same file).",
)
@click.version_option(__version__, "-V", "--version", prog_name="delaywheel")
@click.pass_context
def main(
    ctx: click.Context,
    server: tuple[tuple[str, int], ...],
    token: str | None,
    as_json: bool,
    timeout_s: float,
    tls: bool,
    tls_ca: str | None,
    tls_cert: str | None,
    tls_key: str | None,
) -> None:
    """delaywheel: a delay-queue server built on a hierarchical time wheel.

    `delaywheel serve` runs the server; the other commands talk to one.
    """
    if timeout_s <= 0:
        raise click.BadParameter(
            f"must be more than 0, got {timeout_s:g}", param_hint="'--timeout'"
        )
    env = Env(servers=server, token=token or None, as_json=as_json,
              timeout_s=timeout_s, tls=tls, tls_ca=tls_ca, tls_cert=tls_cert,
              tls_key=tls_key)  # fmt: skip
    ctx.obj = env
    ctx.call_on_close(env.close)


for _command in (
    serve.serve,
    tasks.add,
    tasks.update,
    tasks.delete,
    tasks.get,
    tasks.list_,
    consume.reserve,
    consume.ack,
    consume.wait,
    consume.release,
    consume.touch,
    consume.kick,
    consume.ping,
    consume.stats,
    cluster.cluster,
    importer.import_,
    backup.backup,
    schedules.schedule,
    topics.topic,
):
    main.add_command(_command)
