"""A bare MessagePack-RPC peer over a plain socket: no client library in the way."""

from __future__ import annotations

import socket
from typing import Any

import msgpack


class Raw:
    """A bare MessagePack-RPC peer: no client library in the way."""

    def __init__(self, address: tuple[str, int], timeout_s: float = 10.0) -> None:
        self.sock = socket.create_connection(address, timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
        self.msgid = 0

    def send(self, method: str, *params: Any) -> int:
        self.msgid += 1
        self.sock.sendall(msgpack.packb([0, self.msgid, method, list(params)]))
        return self.msgid

    def recv(self) -> Any:
        while True:
            for message in self.unpacker:
                return message
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("closed by server")
            self.unpacker.feed(data)

    def call(self, method: str, *params: Any) -> Any:
        """The result, or ("error", code, message)."""
        msgid = self.send(method, *params)
        kind, got_id, error, result = self.recv()
        assert (kind, got_id) == (1, msgid)
        return result if error is None else ("error", *error)

    def closed(self) -> bool:
        try:
            return self.sock.recv(1) == b""
        except (ConnectionResetError, TimeoutError):
            return True

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Raw:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
