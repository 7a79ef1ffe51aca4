"""A client process that holds many connections to a server, for tests/test_connections.py.

``python tests/holder.py HOST PORT COUNT ping`` opens COUNT connections, pings on
each and prints ``served N`` (the connections that got their pong) once every
one has answered or failed; ``... reserve TOPIC`` sends a blocking ``reserve``
on each, prints ``waiting``, then, once the replies come, ``reserved N IDS
LAST`` (how many got a task, their ids as JSON, and the monotonic clock when
the last arrived, a clock every process of the machine shares). Either way it
then holds the connections until its stdin closes. A few processes of a few
hundred connections each stay under a soft limit of 1,024 open files.
"""

from __future__ import annotations

import json
import selectors
import socket
import sys
import time
from typing import Any

import msgpack

REPLY_TIMEOUT_S = 60.0


def connect(address: tuple[str, int], count: int) -> list[socket.socket]:
    socks = []
    for _ in range(count):
        sock = socket.create_connection(address, timeout=30)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        socks.append(sock)
    return socks


def replies(socks: list[socket.socket]) -> dict[socket.socket, tuple[Any, float]]:
    """The first message from each socket and when it came (monotonic), or none for a
    socket closed or silent until ``REPLY_TIMEOUT_S``."""
    selector = selectors.DefaultSelector()
    unpackers = {}
    for sock in socks:
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ)
        unpackers[sock] = msgpack.Unpacker(raw=False, strict_map_key=False)
    got: dict[socket.socket, tuple[Any, float]] = {}
    deadline = time.monotonic() + REPLY_TIMEOUT_S
    while unpackers and time.monotonic() < deadline:
        for key, _ in selector.select(timeout=1.0):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            try:
                data = sock.recv(65536)
            except OSError:
                data = b""
            if not data:
                selector.unregister(sock)
                del unpackers[sock]
                continue
            unpacker = unpackers[sock]
            unpacker.feed(data)
            for message in unpacker:
                got[sock] = (message, time.monotonic())
                selector.unregister(sock)
                del unpackers[sock]
                break
    return got


def main() -> None:
    host, port, count, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    socks = connect((host, port), count)
    if mode == "ping":
        for sock in socks:
            sock.sendall(msgpack.packb([0, 1, "ping", []]))
        got = replies(socks)
        served = sum(1 for message, _ in got.values() if message == [1, 1, None, "pong"])
        print(f"served {served}", flush=True)
    else:
        request = msgpack.packb([0, 1, "reserve", [[sys.argv[5]], REPLY_TIMEOUT_S]])
        for sock in socks:
            sock.sendall(request)
        print("waiting", flush=True)
        got = replies(socks)
        ids = [message[3]["id"] for message, _ in got.values() if message[3] is not None]
        last = max((at for _, at in got.values()), default=0.0)
        print(f"reserved {len(ids)} {json.dumps(ids, separators=(',', ':'))} {last!r}", flush=True)
    sys.stdin.read()  # hold them until told


if __name__ == "__main__":
    main()
