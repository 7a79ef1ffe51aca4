"""Start the real ``delaywheel serve`` process on a free port, for tests and the bench.

The server logs ``delaywheel listening on HOST:PORT`` once it accepts
connections; we read the port from that line, so tests pass ``--port 0`` and
never race for a port. ``free_port`` is for what cannot take port 0 (a
redis-server, a metrics or dashboard port given on the command line).

bench/_procs.py starts its servers with ``ServerProcess`` too: the bench is
run from a checkout, as the tests are, so it imports this module
(``tests.serverproc``) rather than keep a second copy. It imports the
standard library alone, so importing it loads nothing of pytest.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

LISTENING = re.compile(r"delaywheel listening on (\S+):(\d+)")
START_TIMEOUT_S = 30.0
REPO = Path(__file__).resolve().parent.parent  # where the server runs from
# A folder to copy every server's log into, whole (the ``log`` deque keeps the
# last 2,000 lines): ``server-NODE-PID.log``, for reading a failure of a run
# repeated in a loop. Not DELAYWHEEL_*: the server reads those as settings.
KEEP_LOGS = "KEEP_TEST_LOGS"


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listened on a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class ServerProcess:
    """A running server. ``args`` go to ``delaywheel serve`` after the defaults.

    ``prefix`` goes before the command (``prlimit --nofile=256:256``), and
    ``python_args`` are the interpreter's arguments that make it delaywheel.
    ``tick`` None leaves the server's own default (1 s), as the bench does;
    ``start_timeout_s`` is how long it may take to listen (a load included).
    ``python`` and ``cwd`` run another source tree's server (the bench's
    ``--tree``: its own interpreter, in that tree). ``listening_s`` is the time
    from the exec to the listening line, taken as the line is read.
    """

    def __init__(
        self,
        *args: str,
        store: str = "memory://",
        tick: str | None = "0.05",
        env: dict[str, str] | None = None,
        prefix: Sequence[str] = (),
        python_args: Sequence[str] = ("-m", "delaywheel"),
        start_timeout_s: float = START_TIMEOUT_S,
        python: str = sys.executable,
        cwd: Path = REPO,
    ) -> None:
        ticking = [] if tick is None else ["--tick", tick]
        self.args = ["--port", "0", "--store", store, *ticking, *args]
        self.command = [*prefix, python, *python_args, "serve"]
        self.cwd = cwd
        self.env = {**os.environ, **(env or {})}
        self.log: deque[str] = deque(maxlen=2000)
        self.logged = 0  # lines read in all: a mark for ``log_since``, as the deque drops old ones
        self.host = ""
        self.port = 0
        self.proc: subprocess.Popen[str] | None = None
        self.start_timeout_s = start_timeout_s
        self.started = 0.0  # perf_counter at the exec
        self.listening_s = 0.0
        self.start()

    def start(self) -> None:
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(
            [*self.command, *self.args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
            cwd=self.cwd,
        )
        found = threading.Event()
        self.reader = threading.Thread(target=self._read_log, args=(self.proc, found), daemon=True)
        self.reader.start()
        deadline = time.monotonic() + self.start_timeout_s
        while not found.wait(0.05):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("server did not start:\n" + "\n".join(self.log))

    def _read_log(self, proc: subprocess.Popen[str], found: threading.Event) -> None:
        assert proc.stderr is not None
        with proc.stderr, self._kept(proc.pid) as kept:  # closed at EOF: the process exited
            for line in proc.stderr:
                self.log.append(line.rstrip())
                self.logged += 1
                if kept is not None:
                    kept.write(line)
                    kept.flush()
                match = LISTENING.search(line)
                if match and not found.is_set():
                    self.listening_s = time.perf_counter() - self.started
                    self.host, self.port = match.group(1), int(match.group(2))
                    found.set()

    def _kept(self, pid: int) -> contextlib.AbstractContextManager[TextIO | None]:
        """The file this process's log is copied to, under $KEEP_TEST_LOGS (or None)."""
        folder = os.environ.get(KEEP_LOGS)
        if not folder:
            return contextlib.nullcontext()
        args = self.args
        node = args[len(args) - 1 - args[::-1].index("--node") + 1] if "--node" in args else "node"
        Path(folder).mkdir(parents=True, exist_ok=True)
        return open(Path(folder) / f"server-{node}-{pid}.log", "a")

    def log_since(self, mark: int) -> list[str]:
        """The lines logged since ``logged`` was ``mark``, as far as ``log`` still holds them."""
        lines, logged = list(self.log), self.logged
        return lines[max(0, len(lines) - (logged - mark)) :]

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """SIGTERM and wait; returns the exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self.reader.join(5)
        return code

    def kill(self) -> None:
        """SIGKILL: a crash, with no chance to flush anything."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
            self.reader.join(5)

    def log_text(self) -> str:
        return "\n".join(self.log)
