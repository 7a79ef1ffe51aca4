"""An address the server cannot listen on, as one line that says what to do.

A second server on a busy port is the usual cause (``make run`` twice): the
line names the address, the option that moves it, and, when ``/proc`` lets
us see it, the process that holds the port. That lookup reads only the
kernel's socket table and our own user's processes' descriptors, and only
once, at a start that is failing anyway.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

_PROC = Path("/proc")
_TCP_LISTEN = "0A"  # the state column of /proc/net/tcp


class ListenError(Exception):
    """The server (or its metrics endpoint) could not listen; the message says why."""


def listen_error(what: str, host: str, port: int, option: str, exc: OSError) -> ListenError:
    """The one-line error for ``exc``, raised binding ``what`` to ``host:port``."""
    shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if exc.errno == errno.EADDRINUSE:
        holder = port_holder(port) if port else None
        held = f", held by {holder}" if holder else ""
        return ListenError(
            f"cannot listen on {shown} ({what}): the address is already in use{held};"
            f" choose another port with {option}, or stop what holds it"
        )
    reason = exc.strerror or str(exc)
    return ListenError(f"cannot listen on {shown} ({what}): {reason}; check --host and {option}")


def port_holder(port: int) -> str | None:
    """``pid N (command)`` of a process listening on TCP ``port``, when visible."""
    inodes = _listening_inodes(port)
    if not inodes:
        return None
    try:
        pids = [entry for entry in os.listdir(_PROC) if entry.isdigit()]
    except OSError:
        return None
    for pid in pids:
        try:
            links = {os.readlink(fd) for fd in (_PROC / pid / "fd").iterdir()}
        except OSError:  # another user's process, or gone meanwhile
            continue
        if any(f"socket:[{inode}]" in links for inode in inodes):
            return f"pid {pid} ({_command(pid)})"
    return None


def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (_PROC / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            # local_address is HEX_ADDRESS:HEX_PORT; the inode is the 10th field.
            listening = len(fields) > 9 and fields[3] == _TCP_LISTEN
            if listening and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def _command(pid: str) -> str:
    try:
        raw = (_PROC / pid / "cmdline").read_bytes()
    except OSError:
        return "?"
    words = raw.rstrip(b"\0").split(b"\0")
    return " ".join(word.decode("utf-8", "replace") for word in words)[:120] or "?"
