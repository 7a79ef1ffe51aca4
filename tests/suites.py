"""Which suite a test belongs to: the markers behind ``make test-fast``.

A test with none of these markers is a unit test: it runs in this process
and needs nothing running (an in-process server on port 0, a SQLite file in
tmp_path and a local HTTP endpoint are fine). ``make test-fast`` runs those.

- ``process``: starts a program of ours in a process of its own: the server,
  the CLI, the bench, any Python (a fresh venv's too). A tool that runs and
  exits (``openssl`` making certificates) does not count.
- ``redis``: needs a private redis-server (conftest.py starts them).
- ``brokers``: talks to the machine's RabbitMQ or NATS; ``brokers("nats")``
  names the one, bare it means both. tests/services.py skips the test when
  one it names does not answer (and fails it in CI).
- ``packaging``: builds the distributions, makes venvs, runs docker-compose.
- ``slow``: takes seconds (more than ``SLOW_S`` on a quiet machine).

A test gets them three ways: by hand (``pytestmark`` or a decorator), from the
fixtures it uses (``fixture_mark``, applied at collection, so a new test that
takes ``server`` or ``redis_url`` needs nothing more), and the rest is checked
as it runs. An audit hook (``sys.addaudithook``) sees every process this
pytest starts and every connection it makes: a test that starts one of our
programs or a redis-server, or connects to a broker, without the marker that
says so fails at teardown, naming the marker to add. A module fixture starts
its process in the first test that takes it; the others that take it are
held to the same. That keeps ``make test-fast`` exactly the unit tests. What
a test's subprocesses do (a server connecting to a broker) is out of sight:
those tests are marked by hand. So are connections to a private
redis-server that was started earlier (its port is a free port like any
other, so seeing one would be a guess).
"""

from __future__ import annotations

import shlex
import sys
import threading
from collections import defaultdict
from collections.abc import Generator, Iterable
from pathlib import Path
from typing import Any

import pytest
from hardening_probes import mark_hardening
from services import BROKERS, need_brokers

MARKERS = ("slow", "process", "redis", "brokers", "packaging")
SLOW_S = 3.0  # "takes seconds": over this on a quiet machine

# Fixtures of conftest.py and services.py, and the marker each gives a test
# that uses it (directly or through another fixture).
FIXTURE_MARKS = {
    "redis_server": pytest.mark.redis,
    "redis_url": pytest.mark.redis,
    "module_redis_url": pytest.mark.redis,
    "redis_cluster": pytest.mark.redis,
    "server": pytest.mark.process,  # conftest's, and every module's own: all start ServerProcess
    "rabbitmq_url": pytest.mark.brokers("rabbitmq"),
    "nats_url": pytest.mark.brokers("nats"),
}


def fixture_mark(name: str) -> pytest.MarkDecorator | None:
    """The marker a fixture gives: by ``FIXTURE_MARKS``, else by the names a module's
    own fixtures go by: ``*_server`` starts a server process (``tls_server``),
    a name with ``redis`` in it is a private redis-server (``fsync_redis``)."""
    if name in FIXTURE_MARKS:
        return FIXTURE_MARKS[name]
    if name.endswith("_server"):
        return pytest.mark.process
    if "redis" in name:
        return pytest.mark.redis
    return None


BROKER_PORTS = {port: what for what, port in BROKERS.values()}
# What a test does, and the markers that admit it.
ADMITTED_BY = {"process": {"process", "packaging"}, "redis": {"redis"}, "brokers": {"brokers"}}


def fixturenames(item: pytest.Item) -> list[str]:
    """The fixtures ``item`` uses, through other fixtures too (a test function has them)."""
    names: list[str] = getattr(item, "fixturenames", [])
    return names


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    mark_hardening(items)  # ``-m hardening``: issue 30's suite (tests/hardening_probes.py)
    for item in items:
        for name in sorted(fixturenames(item)):
            mark = fixture_mark(name)
            if mark is not None:
                item.add_marker(mark)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A ``brokers`` test goes on only if the brokers it names (bare: all) answer."""
    names: set[str] = set()
    for mark in item.iter_markers("brokers"):
        names |= set(mark.args or BROKERS)
    need_brokers(sorted(names))


# A fixture as defined in one place (a module's nodeid, or a conftest's
# directory), with one of its params.
FixtureKey = tuple[str, str, int]


class Watch:
    """What each test (and each module fixture) did that a marker must admit."""

    def __init__(self) -> None:
        self.item: pytest.Item | None = None
        self.fixtures: list[FixtureKey] = []  # being set up, innermost last
        self.did: dict[str, dict[str, str]] = defaultdict(dict)  # nodeid -> need -> example
        self.fixture_did: dict[FixtureKey, dict[str, str]] = defaultdict(dict)
        self.lock = threading.Lock()

    def audit(self, event: str, args: tuple[Any, ...]) -> None:
        if event not in ("subprocess.Popen", "socket.connect") or self.item is None:
            return
        try:
            found = self._spawned(args[1]) if event == "subprocess.Popen" else self._dialed(args[1])
        except Exception:  # an audit hook must never break what it watches
            return
        if found is not None:
            self._note(*found)

    def _spawned(self, argv: Any) -> tuple[str, str] | None:
        argv = [str(argv)] if isinstance(argv, (str, bytes, Path)) else [str(a) for a in argv]
        program = Path(argv[0]).name
        if program == "redis-server":
            return "redis", "started redis-server"
        if program.startswith(("python", "delaywheel", "docker-compose")):
            return "process", f"started `{shlex.join(argv[:4])}`"
        return None  # a tool that runs and exits (openssl, promtool): no service

    def _dialed(self, address: Any) -> tuple[str, str] | None:
        if not isinstance(address, tuple) or len(address) < 2:
            return None  # a Unix socket
        port = address[1]
        if port in BROKER_PORTS:
            return "brokers", f"connected to {BROKER_PORTS[port]} on port {port}"
        return None

    def _note(self, need: str, example: str) -> None:
        with self.lock:
            if self.item is not None:
                self.did[self.item.nodeid].setdefault(need, example)
            for fixture in self.fixtures:  # an outer fixture did what the inner one did
                self.fixture_did[fixture].setdefault(need, example)

    def unadmitted(self, item: pytest.Item) -> list[str]:
        """What ``item`` did, itself or through its module's fixtures, that its
        markers do not admit, each with the marker to add."""
        module = item.nodeid.split("::")[0]
        callspec = getattr(item, "callspec", None)
        indices: dict[str, int] = callspec.indices if callspec is not None else {}
        did = dict(self.did.pop(item.nodeid, {}))
        for name in fixturenames(item):
            key = (module, name, indices.get(name, 0))
            for need, example in self.fixture_did.get(key, {}).items():
                did.setdefault(need, f"{example} (in its fixture {name!r})")
        marked = {mark.name for mark in item.iter_markers()}
        return [
            f"{example}, so it needs the marker `{need}`"
            for need, example in sorted(did.items())
            if not ADMITTED_BY[need] & marked
        ]


WATCH = Watch()


def pytest_configure(config: pytest.Config) -> None:
    if not getattr(sys, "_delaywheel_watch", False):  # hooks cannot be removed: add one once
        sys.addaudithook(WATCH.audit)
        sys._delaywheel_watch = True  # type: ignore[attr-defined]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, None, None]:
    WATCH.item = item
    try:
        yield
    finally:
        WATCH.item = None


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(
    fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest
) -> Generator[None, None, None]:
    index = getattr(request, "param_index", 0)  # which of a parametrized fixture's params
    WATCH.fixtures.append((fixturedef.baseid, fixturedef.argname, index))
    try:
        yield
    finally:
        WATCH.fixtures.pop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    outcome = yield
    if call.when != "teardown":
        return
    report: pytest.TestReport = outcome.get_result()
    problems = WATCH.unadmitted(item)
    if problems and report.passed:
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} is not marked for what it does (tests/suites.py):\n  "
            + "\n  ".join(problems)
            + "\nAdd it with @pytest.mark.NAME on the test, or pytestmark = pytest.mark.NAME"
            " for a module whose every test does it (tests/README.md)."
        )


def slow_unit_tests(reports: Iterable[pytest.TestReport]) -> list[str]:
    """Unit tests (no marker of ours) that took over ``SLOW_S``, setup and teardown
    included: what would slow down ``make test-fast``."""
    took: dict[str, float] = defaultdict(float)
    for report in reports:
        if not any(name in report.keywords for name in MARKERS):
            took[report.nodeid] += report.duration
    return [f"{s:.1f} s {nodeid}" for nodeid, s in sorted(took.items()) if s > SLOW_S]


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """List the unit tests that were slow this time: on a quiet machine, one that
    is always over ``SLOW_S`` is marked ``slow`` or made faster."""
    reports = [r for key in ("passed", "failed", "") for r in terminalreporter.stats.get(key, [])]
    slow = slow_unit_tests(r for r in reports if isinstance(r, pytest.TestReport))
    if slow:
        terminalreporter.write_sep("-", f"unit tests over {SLOW_S} s (without the slow marker)")
        for line in slow:
            terminalreporter.write_line(line)
