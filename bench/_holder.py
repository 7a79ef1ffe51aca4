"""A client process of the connections section: holds many connections to one server.

``python -m bench._holder KIND HOST PORT COUNT MODE [TOPIC]``, KIND ``dw``
(delaywheel), ``redis`` or ``bs`` (beanstalkd):

- MODE ``idle``: one round trip on each connection (delaywheel ``ping``, Redis
  ``PING``, beanstalkd ``list-tube-used``), then ``ready N`` (those answered);
- MODE ``block``: a consumer's blocking wait on each (``reserve`` on TOPIC,
  ``BLPOP TOPIC``, ``reserve-with-timeout`` watching tube TOPIC), then
  ``waiting``; once the replies come, ``answered N LAST``: how many, and the
  monotonic clock (shared by every process of the machine) at the last.

Either way it then holds its connections until its stdin closes. A few hundred
connections each keep a holder under a soft limit of 1,024 open files.
"""

from __future__ import annotations

import selectors
import socket
import sys
import time

import msgpack

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


def first_replies(socks: list[socket.socket]) -> dict[socket.socket, float]:
    """When each socket's first bytes came (monotonic); a socket closed or silent until
    ``REPLY_TIMEOUT_S`` is left out."""
    selector = selectors.DefaultSelector()
    waiting = set(socks)
    for sock in socks:
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ)
    got: dict[socket.socket, float] = {}
    deadline = time.monotonic() + REPLY_TIMEOUT_S
    while waiting and time.monotonic() < deadline:
        for key, _ in selector.select(timeout=1.0):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            try:
                data = sock.recv(65536)
            except OSError:
                data = b""
            if data:
                got[sock] = time.monotonic()
            selector.unregister(sock)
            waiting.discard(sock)
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
        print(f"ready {len(first_replies(socks))}", flush=True)
    else:
        for sock in socks:
            sock.sendall(block(kind, sys.argv[6]))
        if kind == "bs":
            first_replies(socks)  # WATCHING 2: the reserve's reply comes later
        print("waiting", flush=True)
        got = first_replies(socks)
        print(f"answered {len(got)} {max(got.values(), default=0.0)!r}", flush=True)
    sys.stdin.read()  # hold them until told


if __name__ == "__main__":
    main()
