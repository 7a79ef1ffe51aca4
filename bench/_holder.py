"""A client process that holds many connections to one server: the connections
section of the bench, and tests/test_connections.py.

``python -m bench._holder KIND HOST PORT COUNT MODE [TOPIC]``, KIND ``dw``
(delaywheel), ``redis`` or ``bs`` (beanstalkd):

- MODE ``idle``: one round trip on each connection (delaywheel ``ping``, Redis
  ``PING``, beanstalkd ``list-tube-used``), then ``ready N``: those answered
  (for delaywheel, those answered ``pong``);
- MODE ``block``: a consumer's blocking wait on each (``reserve`` on TOPIC,
  ``BLPOP TOPIC``, ``reserve-with-timeout`` watching tube TOPIC), then
  ``waiting``; once the replies come, ``answered N LAST IDS``: how many, the
  monotonic clock (shared by every process of the machine) at the last, and
  for delaywheel the reserved tasks' ids as JSON (``[]`` for the others).

Delaywheel's replies are read as MessagePack, whole, and checked; the others'
first bytes count as the answer. Either way it then holds its connections
until its stdin closes. A few hundred connections each keep a holder under a
soft limit of 1,024 open files.
"""

from __future__ import annotations

import json
import selectors
import socket
import sys
import time
from typing import Any, NamedTuple

import msgpack


class Reply(NamedTuple):
    message: Any  # delaywheel's: the decoded message; the others': the bytes
    at_s: float  # monotonic


WAIT_S = 120  # a blocked consumer's timeout, far beyond any round
REPLY_TIMEOUT_S = 60.0

ROUND_TRIP = {
    "dw": msgpack.packb([0, 1, "ping", []]),
    "redis": b"PING\r\n",
    "bs": b"list-tube-used\r\n",
}


def block(kind: str, topic: str) -> bytes:
    if kind == "dw":
        return bytes(msgpack.packb([0, 1, "reserve", [[topic], WAIT_S]]))
    if kind == "redis":
        return f"BLPOP {topic} {WAIT_S}\r\n".encode()
    return f"watch {topic}\r\nreserve-with-timeout {WAIT_S}\r\n".encode()


def first_replies(kind: str, socks: list[socket.socket]) -> dict[socket.socket, Reply]:
    """Each socket's first reply and when it came (monotonic); a socket closed or
    silent until ``REPLY_TIMEOUT_S`` is left out. Delaywheel's is its first whole
    MessagePack message; the others' their first bytes."""
    selector = selectors.DefaultSelector()
    unpackers: dict[socket.socket, msgpack.Unpacker | None] = {}
    for sock in socks:
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ)
        unpackers[sock] = msgpack.Unpacker(raw=False) if kind == "dw" else None
    got: dict[socket.socket, Reply] = {}
    deadline = time.monotonic() + REPLY_TIMEOUT_S
    while unpackers and time.monotonic() < deadline:
        for key, _ in selector.select(timeout=1.0):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            try:
                data = sock.recv(65536)
            except OSError:
                data = b""
            unpacker = unpackers[sock]
            if data and unpacker is not None:
                unpacker.feed(data)
                message = next(unpacker, None)
                if message is None:
                    continue  # a reply in pieces: wait for the rest
                got[sock] = Reply(message, time.monotonic())
            elif data:
                got[sock] = Reply(data, time.monotonic())
            selector.unregister(sock)
            del unpackers[sock]
    return got


def main() -> None:
    kind, host, port, count, mode = sys.argv[1:6]
    socks = []
    for _ in range(int(count)):
        sock = socket.create_connection((host, int(port)), timeout=30)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        socks.append(sock)
    if mode == "idle":
        for sock in socks:
            sock.sendall(ROUND_TRIP[kind])
        got = first_replies(kind, socks).values()
        ready = sum(1 for reply in got if kind != "dw" or reply.message == [1, 1, None, "pong"])
        print(f"ready {ready}", flush=True)
    else:
        for sock in socks:
            sock.sendall(block(kind, sys.argv[6]))
        if kind == "bs":
            first_replies(kind, socks)  # WATCHING 2: the reserve's reply comes later
        print("waiting", flush=True)
        got = first_replies(kind, socks).values()
        ids = [reply.message[3]["id"] for reply in got if kind == "dw" and reply.message[3]]
        last = max((reply.at_s for reply in got), default=0.0)
        answered = len(ids) if kind == "dw" else len(got)
        print(f"answered {answered} {last!r} {json.dumps(ids, separators=(',', ':'))}", flush=True)
    sys.stdin.read()  # hold them until told


if __name__ == "__main__":
    main()
