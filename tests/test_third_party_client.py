"""docs/protocol.md: any conforming MessagePack-RPC client works unchanged against the server.

The client here is pynvim's ``msgpack_rpc`` layer (Neovim's maintained Python client): it
sends method names as bin, announces itself with a notification, and packs its own msgids.
"""

from __future__ import annotations

import gc

import pytest
from pynvim import msgpack_rpc
from serverproc import ServerProcess


# pynvim's Session.close() closes its event loop in the same breath as its transport, so
# the transport's socket is never closed and warns when collected; collect it here, inside
# this test's warning filter, rather than at some later test.
@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_pynvim_add_then_get(server: ServerProcess) -> None:
    session = msgpack_rpc.tcp_session(server.host, server.port)
    try:
        placed = session.request("add", {"topic": "third-party", "id": "nv-1", "body": [1, b"x"]})
        assert placed["id"] == "nv-1"
        assert set(placed) == {"id", "at", "cycle", "slot"}
        task = session.request("get", "nv-1")
        assert task["id"] == "nv-1"
        assert task["topic"] == "third-party"
        assert task["state"] == "ready"
        assert task["body"] == [1, b"x"]
        assert session.request("get", "nv-missing") is None
        with pytest.raises(Exception, match="no task with id 'nv-missing'"):
            session.request("ack", "nv-missing")
    finally:
        session.close()
        del session
        gc.collect()
