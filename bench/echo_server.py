"""The floor: the least a MessagePack-RPC server in Python can do per request.

``python -m bench.echo_server [PORT]`` listens on 127.0.0.1 (PORT 0, the
default, picks a free one), prints ``echo listening on 127.0.0.1:PORT`` on
stdout, and serves until SIGTERM. It is a bare ``asyncio.Protocol`` on uvloop
(plain asyncio when uvloop is missing) with TCP_NODELAY, that feeds what it
reads to one ``msgpack.Unpacker`` per connection and answers every request
``[0, msgid, method, params]`` with ``[1, msgid, None, "pong"]``, whatever the
method: no dispatch, no validation, no store. Replies are packed by one reused
``Packer``, and the replies to the requests of one ``data_received`` go out as
one write, as a real server would batch them.

The compare section drives it with the project's blocking ``Client.ping()``,
one call at a time: that rate, and this process's CPU time per call, are what
the delaywheel server's own per-call figures are held against. The client
costs the same against either server, so the difference is the server's.

``running()`` starts it as a child process for the bench and stops it again.
"""

from __future__ import annotations

import asyncio
import re
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import cast

import msgpack  # type: ignore[import-untyped, unused-ignore]

from bench._procs import listening_child

HOST = "127.0.0.1"
LISTENING = re.compile(r"echo listening on (\S+):(\d+)")
REQUEST = 0
PACKER = msgpack.Packer()


class EchoProtocol(asyncio.Protocol):
    """One connection: every request answered "pong", in order."""

    def __init__(self) -> None:
        self.unpacker = msgpack.Unpacker()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport, though they are one.
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            # A reply must not wait for the ACK of the previous one (Nagle).
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.unpacker.feed(data)
        pack = PACKER.pack
        replies = [
            pack([1, message[1], None, "pong"])
            for message in self.unpacker
            if isinstance(message, list) and message and message[0] == REQUEST
        ]
        if replies and self.transport is not None:
            self.transport.write(b"".join(replies))


async def serve(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(EchoProtocol, HOST, port)
    bound = server.sockets[0].getsockname()
    print(f"echo listening on {bound[0]}:{bound[1]}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str]) -> None:
    port = int(argv[0]) if argv else 0
    try:
        import uvloop
    except ImportError:  # the floor of plain asyncio, as the server falls back to it too
        asyncio.run(serve(port))
    else:
        uvloop.run(serve(port))


@contextmanager
def running() -> Iterator[tuple[int, tuple[str, int]]]:
    """The echo server as a child process; yields (pid, (host, port))."""
    command = [sys.executable, "-m", "bench.echo_server", "0"]
    with listening_child(command, LISTENING.pattern) as found:
        yield found


if __name__ == "__main__":
    main(sys.argv[1:])
