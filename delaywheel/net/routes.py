"""The router: how the server answers each protocol method.

The methods themselves (params, read-only or not, allowed before auth) are
the client's table, delaywheel_client/methods.py, shared with the clients;
this module adds what is the server's own. A route is ``run(conn, params,
now_s)``, the time read once per turn of the connection. The engine's verbs
are wrapped by ``_positional``, which checks the arity and passes ``now_s``
on only to a verb that takes it; ``ping``, ``auth`` and ``stats`` are the
server's own (ping and auth have no use for the time: ``_now_s``).
``reserve`` and ``wait`` have no route: the connection serves them,
because a blocked call answers out of line.
"""

from __future__ import annotations

import hmac
import inspect
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from delaywheel_client.methods import METHODS

from delaywheel.engine import validate
from delaywheel.errors import RequestError

if TYPE_CHECKING:
    from delaywheel.net.connection import Connection
    from delaywheel.net.server import Server


Route = Callable[["Connection", list[Any], float], Any]


class Method:
    """How the server answers a method, and how often it was called and failed
    since the start (for metrics: one attribute increment per request)."""

    __slots__ = ("calls", "errors", "mutating", "name", "run")

    def __init__(self, name: str, run: Route | None, mutating: bool) -> None:
        self.name = name
        self.run = run  # None: reserve (the connection serves it) or unknown
        self.mutating = mutating
        self.calls = 0
        self.errors: dict[str, int] = {}  # by error code

    def failed(self, code: str) -> None:
        self.errors[code] = self.errors.get(code, 0) + 1


def routes_for(server: Server) -> dict[str, Method]:
    """Every method's route, looked up once per request by name."""
    engine = server.engine
    handlers: dict[str, Callable[..., Any]] = {
        "add": engine.add,
        "add_many": engine.add_many,
        "update": engine.update,
        "delete": engine.delete,
        "get": engine.get,
        "list": engine.list_tasks,
        "ack": engine.ack,
        "release": engine.release,
        "touch": engine.touch,
        "kick": engine.kick,
        "kick_task": engine.kick_task,
        "schedule_add": engine.schedule_add,
        "schedule_update": engine.schedule_update,
        "schedule_pause": engine.schedule_pause,
        "schedule_resume": engine.schedule_resume,
        "schedule_delete": engine.schedule_delete,
        "schedule_get": engine.schedule_get,
        "schedule_list": engine.schedule_list,
        "schedule_next": engine.schedule_next,
        "schedule_trigger": engine.schedule_trigger,
        "schedule_backfill": engine.schedule_backfill,
        "topic_get": engine.topic_get,
        "topic_set": engine.topic_set,
        "topic_list": engine.topic_list,
    }
    own: dict[str, Route | None] = {
        "ping": _ping,
        "auth": _auth,
        "stats": _stats,
        "cluster": _cluster,
        "reserve": None,
        "wait": None,
    }
    routes = {}
    for method, spec in METHODS.items():
        if method in own:
            run = own[method]
        else:
            run = _positional(method, handlers[method], spec.params, spec.optional)
        routes[method] = Method(method, run, not spec.read_only)
    return routes


def _positional(
    method: str, handler: Callable[..., Any], names: tuple[str, ...], optional: int
) -> Route:
    """A route calling ``handler(*params)``, with the arity checked, and with
    ``now_s`` after them when the handler takes it (a verb whose outcome
    depends on the time)."""
    most = len(names)
    least = most - optional
    left_out = (None,) * optional  # the optional params when none is sent

    def timed(conn: Connection, params: list[Any], now_s: float) -> Any:
        if len(params) == most:  # the common case, without building a new list
            return handler(*params, now_s)
        if len(params) == least:  # no optional one (an ack without a result): each None
            return handler(*params, *left_out, now_s)
        return handler(*validate.params(method, params, *names, optional=optional), now_s)

    def untimed(conn: Connection, params: list[Any], _now_s: float) -> Any:
        if len(params) == most:
            return handler(*params)
        if len(params) == least:
            return handler(*params, *left_out)
        return handler(*validate.params(method, params, *names, optional=optional))

    return timed if "now_s" in inspect.signature(handler).parameters else untimed


def _arity(method: str, params: list[Any]) -> list[Any]:
    """``params`` checked against the table; missing optional ones come back as None."""
    spec = METHODS[method]
    return validate.params(method, params, *spec.params, optional=spec.optional)


def _ping(conn: Connection, params: list[Any], _now_s: float) -> str:
    if params:  # the table's check only for a wrong call (docs/performance.md)
        _arity("ping", params)
    return "pong"


def _stats(conn: Connection, params: list[Any], now_s: float) -> dict[str, Any]:
    _arity("stats", params)
    return conn.server.stats(now_s)


def _cluster(conn: Connection, params: list[Any], _now_s: float) -> dict[str, Any]:
    _arity("cluster", params)
    return conn.server.cluster_map()


def _auth(conn: Connection, params: list[Any], _now_s: float) -> bool:
    (token,) = _arity("auth", params)
    expected = conn.server.settings.token
    if expected is None:
        conn.authed = True
        return True
    signins, address = conn.server.signins, conn.address
    wait_s = signins.retry_in_s(address, "protocol")
    if wait_s:  # the token is not even looked at (net/signins.py)
        raise RequestError(
            "unauthorized",
            f"too many failed sign-ins from this address: try again in {math.ceil(wait_s)} s",
        )
    if type(token) is not str or not hmac.compare_digest(token.encode(), expected.encode()):
        signins.failed(address, "protocol")
        raise RequestError("unauthorized", "wrong token")
    signins.succeeded(address)
    conn.signed_in()
    return True
