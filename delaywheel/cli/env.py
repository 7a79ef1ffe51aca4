"""The global options, the client made from them, and the decorator client commands share."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import click

from delaywheel.cli.errors import EXIT_USAGE, cli_error, server_error
from delaywheel.cli.output import dumps
from delaywheel.cli.params import address_text
from delaywheel.config import DEFAULT_HOST, DEFAULT_PORT

if TYPE_CHECKING:
    from delaywheel_client import Client, ClusterClient

DEFAULT_TIMEOUT_S = 10.0


@dataclass
class Env:
    """The global options, and the client made from them on first use."""

    # ``--server``: one address, or the nodes of one keyspace (then a ClusterClient).
    servers: tuple[tuple[str, int], ...] = ((DEFAULT_HOST, DEFAULT_PORT),)
    token: str | None = None
    as_json: bool = False
    timeout_s: float = DEFAULT_TIMEOUT_S
    tls: bool = False
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    _clients: list[Client | ClusterClient] = field(default_factory=list)

    @property
    def addresses(self) -> list[str]:
        """``--server``'s addresses as ``host:port`` text."""
        return [address_text(host, port) for host, port in self.servers]

    def client(self) -> Client | ClusterClient:
        """A ``delaywheel_client.Client`` for the global options (it connects on first use),
        or a ``ClusterClient`` when ``--server`` lists several nodes: it then sends each
        call about a task to the task's owner. A TLS file it cannot load is a usage error
        naming it."""
        from delaywheel_client import Client, ClusterClient

        settings: dict[str, Any] = {
            "token": self.token,
            "timeout_s": self.timeout_s,
            "connect_timeout_s": min(5.0, self.timeout_s),
            "tls": self.tls,
            "tls_ca": self.tls_ca,
            "tls_cert": self.tls_cert,
            "tls_key": self.tls_key,
        }
        try:
            made: Client | ClusterClient
            if len(self.servers) == 1:
                made = Client(*self.servers[0], **settings)
            else:
                made = ClusterClient(self.addresses, **settings)
        except ValueError as exc:  # the client names the file: tls_ca 'ca.pem': ...
            message = re.sub(r"(^|, |needs )tls_(ca|cert|key)\b", r"\1--tls-\2", str(exc))
            raise cli_error(message, EXIT_USAGE) from None
        self._clients.append(made)
        return made

    def close(self) -> None:
        for made in self._clients:
            with suppress(Exception):  # best effort: the process is ending anyway
                made.close()
        self._clients.clear()

    def emit(self, result: Any, text: str | Callable[[], str]) -> None:
        """Print ``result`` as JSON with ``--json``, else ``text``."""
        if self.as_json:
            click.echo(dumps(result))
        else:
            click.echo(text() if callable(text) else text)


pass_env = click.make_pass_decorator(Env)

# The ID argument of the commands that act on one task.
task_id_argument = click.argument("task_id", metavar="ID")


def client_command(func: Callable[..., None]) -> Callable[..., None]:
    """Pass the ``Env`` first, and turn client errors (and any surprise) into one-line failures."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        # Imported here so that ``serve`` never depends on the client's network code.
        from delaywheel_client import errors

        try:
            func(*args, **kwargs)
        except (click.ClickException, click.exceptions.Exit, click.Abort, BrokenPipeError):
            raise  # click reports these itself (a closed pipe exits quietly)
        except errors.DelaywheelError as exc:
            raise server_error(exc) from None
        except Exception as exc:
            raise cli_error(f"unexpected error: {type(exc).__name__}: {exc}") from None

    return pass_env(wrapper)
