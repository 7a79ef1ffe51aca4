"""Developer profilers, not sections of ``make bench``: where the server's time goes.

- ``python -m bench.tools.profile``: py-spy profiles and the CPU per operation
  of the real server under the bench's loads (docs/performance.md, "How the
  profiles were taken").
- ``python -m bench.tools.callgrind``: the server's instructions per call
  under valgrind, to compare two versions of the hot path on a loaded machine.

docs/performance.md quotes figures from both. They use the bench's loads and
processes (``bench._loads``, ``bench._procs``); nothing in ``bench`` uses them.
"""
