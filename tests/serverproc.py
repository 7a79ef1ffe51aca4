"""Start the real ``delaywheel serve`` process on a free port, for tests.

The server logs ``delaywheel listening on HOST:PORT`` once it accepts
connections; we read the port from that line, so tests pass ``--port 0`` and
never race for a port.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path

LISTENING = re.compile(r"delaywheel listening on (\S+):(\d+)")
START_TIMEOUT_S = 30.0


class ServerProcess:
    """A running server. ``args`` go to ``delaywheel serve`` after the defaults.

    ``prefix`` goes before the command (``prlimit --nofile=256:256``), and
    ``python_args`` are the interpreter's arguments that make it delaywheel.
    """

    def __init__(
        self,
        *args: str,
        store: str = "memory://",
        tick: str = "0.05",
        env: dict[str, str] | None = None,
        prefix: Sequence[str] = (),
        python_args: Sequence[str] = ("-m", "delaywheel"),
    ) -> None:
        self.args = ["--port", "0", "--store", store, "--tick", tick, *args]
        self.command = [*prefix, sys.executable, *python_args, "serve"]
        self.env = {**os.environ, **(env or {})}
        self.log: deque[str] = deque(maxlen=2000)
        self.host = ""
        self.port = 0
        self.proc: subprocess.Popen[str] | None = None
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [*self.command, *self.args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
            cwd=Path(__file__).resolve().parent.parent,
        )
        found = threading.Event()
        self.reader = threading.Thread(target=self._read_log, args=(self.proc, found), daemon=True)
        self.reader.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not found.wait(0.05):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("server did not start:\n" + "\n".join(self.log))

    def _read_log(self, proc: subprocess.Popen[str], found: threading.Event) -> None:
        assert proc.stderr is not None
        with proc.stderr:  # closed at EOF, i.e. when the process has exited
            for line in proc.stderr:
                self.log.append(line.rstrip())
                match = LISTENING.search(line)
                if match and not found.is_set():
                    self.host, self.port = match.group(1), int(match.group(2))
                    found.set()

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
