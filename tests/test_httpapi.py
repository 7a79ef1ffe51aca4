"""The HTTP API (/v1) of a real server: every route, auth, each error, the bounds, bodies
read over the protocol and back, and a long poll across a restart."""

from __future__ import annotations

import base64
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from apicalls import Api, Reply, api_url, call_once, segment
from delaywheel_client import Client
from serverproc import ServerProcess, free_port
from waiting import wait_until

pytestmark = pytest.mark.process

TOKEN = "http-api-secret"
MESSAGE_TIMEOUT_S = 2.0
MAX_REQUESTS = 4
MAX_MESSAGE = 65536
MAX_BODY = 16384


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    proc = ServerProcess(
        "--api-port", "0", "--token", TOKEN,
        "--message-timeout", str(MESSAGE_TIMEOUT_S), "--api-max-requests", str(MAX_REQUESTS),
        "--max-message", str(MAX_MESSAGE), "--max-body", str(MAX_BODY),
    )  # fmt: skip
    yield proc
    proc.stop()


@pytest.fixture
def api(server: ServerProcess) -> Iterator[Api]:
    calls = Api(api_url(server), TOKEN)
    yield calls
    calls.close()


@pytest.fixture
def client(server: ServerProcess) -> Iterator[Client]:
    with Client(*server.address, token=TOKEN) as dw:
        yield dw


def problem_of(reply: Reply, status: int, code: str) -> dict[str, Any]:
    assert reply.status == status, reply.text
    assert reply.headers["content-type"].startswith("application/problem+json")
    doc = reply.data
    assert doc["status"] == status and doc["code"] == code, doc
    assert doc["type"] == f"urn:delaywheel:problem:{code}" and doc["title"] and doc["detail"]
    return doc


# -- tasks ----------------------------------------------------------------------------------


def test_add_get_list_update_delete(api: Api, topic: str) -> None:
    added = api.request("POST", "/tasks", {"topic": topic, "body": {"n": 1}, "delay": 600})
    assert added.status == 201, added.text
    task_id = added.data["id"]
    assert set(added.data) == {"id", "at", "cycle", "slot"}

    got = api.request("GET", f"/tasks/{task_id}")
    assert got.status == 200
    assert got.data["state"] == "delayed" and got.data["body"] == {"n": 1}
    assert "body_encoding" not in got.data

    api.request("POST", "/tasks", {"topic": topic, "body": 2, "delay": 600})
    first = api.request("GET", f"/tasks?topic={topic}&limit=1")
    assert first.status == 200 and len(first.data["tasks"]) == 1 and first.data["next"]
    second = api.request("GET", f"/tasks?topic={topic}&limit=1&cursor={first.data['next']}")
    seen = [t["id"] for t in first.data["tasks"] + second.data["tasks"]]
    assert len(set(seen)) == 2 and task_id in seen
    delayed = api.request("GET", f"/tasks?topic={topic}&state=delayed")
    assert len(delayed.data["tasks"]) == 2 and delayed.data["next"] is None

    changed = api.request("PATCH", f"/tasks/{task_id}", {"body": "new", "ttr": 5})
    assert changed.status == 200 and changed.data["body"] == "new" and changed.data["ttr"] == 5

    deleted = api.request("DELETE", f"/tasks/{task_id}")
    assert deleted.status == 200 and deleted.data == {"deleted": True}
    assert api.request("DELETE", f"/tasks/{task_id}").data == {"deleted": False}
    problem_of(api.request("GET", f"/tasks/{task_id}"), 404, "not_found")


def test_reserve_ack_release_touch_kick(api: Api, topic: str) -> None:
    task_id = api.request("POST", "/tasks", {"topic": topic, "max_attempts": 1}).data["id"]
    reserved = api.request("POST", f"/topics/{topic}/reserve")
    assert reserved.status == 200 and reserved.data["id"] == task_id
    assert reserved.data["state"] == "reserved"
    touched = api.request("POST", f"/tasks/{task_id}/touch")
    assert touched.status == 200 and touched.data["deadline"] >= reserved.data["deadline"]
    # One attempt allowed: a release makes it dead; kick_task makes it ready again.
    released = api.request("POST", f"/tasks/{task_id}/release")
    assert released.status == 200 and released.data == {"released": True}
    assert api.request("GET", f"/tasks/{task_id}").data["state"] == "dead"
    assert api.request("POST", f"/tasks/{task_id}/kick").data == {"kicked": True}
    again = api.request("POST", f"/topics/{topic}/reserve?timeout=5")
    assert again.data["id"] == task_id
    api.request("POST", f"/tasks/{task_id}/release?delay=0")
    kicked = api.request("POST", f"/topics/{topic}/kick?count=10")
    assert kicked.status == 200 and kicked.data == {"kicked": 1}
    api.request("POST", f"/topics/{topic}/reserve?timeout=5")
    acked = api.request("POST", f"/tasks/{task_id}/ack")
    assert acked.status == 200 and acked.data == {"acked": True}
    problem_of(api.request("POST", f"/tasks/{task_id}/ack"), 404, "not_found")
    empty = api.request("POST", f"/topics/{topic}/reserve")
    assert empty.status == 204 and empty.text == ""


def test_add_many_and_the_idempotency_key(api: Api, topic: str) -> None:
    many = api.request("POST", "/tasks", {"tasks": [{"topic": topic, "body": i} for i in range(3)]})
    assert many.status == 201 and len(many.data["tasks"]) == 3
    bad = api.request("POST", "/tasks", {"tasks": [{"topic": topic}, {"topic": topic, "nope": 1}]})
    assert "task 1" in problem_of(bad, 422, "bad_request")["detail"]

    key = {"Idempotency-Key": f"{topic}-once"}
    first = api.request("POST", "/tasks", {"topic": topic}, headers=key)
    assert first.status == 201 and first.data["id"] == f"{topic}-once"
    problem_of(api.request("POST", "/tasks", {"topic": topic}, headers=key), 409, "exists")
    # An id in the body wins over the header.
    own = api.request("POST", "/tasks", {"topic": topic, "id": f"{topic}-own"}, headers=key)
    assert own.data["id"] == f"{topic}-own"


def test_ids_with_slashes_and_spaces_are_one_segment(api: Api, topic: str) -> None:
    task_id = "a/b c%d"
    assert api.request("POST", "/tasks", {"topic": topic, "id": task_id}).status == 201
    got = api.request("GET", f"/tasks/{segment(task_id)}")
    assert got.status == 200 and got.data["id"] == task_id


def test_a_long_poll_gets_a_task_added_while_it_waits(
    api: Api, server: ServerProcess, topic: str
) -> None:
    result: list[Reply] = []
    poller = Api(api_url(server), TOKEN)
    thread = threading.Thread(
        target=lambda: result.append(poller.request("POST", f"/topics/{topic}/reserve?timeout=20"))
    )
    thread.start()
    wait_until(
        lambda: api.request("GET", "/stats").data["waiting_reserves"] >= 1,
        what="a waiting long poll",
    )
    task_id = api.request("POST", "/tasks", {"topic": topic, "body": "late"}).data["id"]
    thread.join(20)
    poller.close()
    assert result and result[0].status == 200 and result[0].data["id"] == task_id


def test_a_long_poll_whose_client_goes_leaves_the_line(
    api: Api, server: ServerProcess, topic: str
) -> None:
    def waiting() -> int:
        return int(api.request("GET", "/stats").data["waiting_reserves"])

    before = waiting()
    host, port = api_url(server).split("//")[1].split("/")[0].split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(
        f"POST /v1/topics/{topic}/reserve?timeout=60 HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {TOKEN}\r\nContent-Length: 0\r\n\r\n".encode()
    )
    wait_until(lambda: waiting() == before + 1, what="the long poll waiting")
    sock.close()
    wait_until(lambda: waiting() == before, what="the line left")
    task_id = api.request("POST", "/tasks", {"topic": topic}).data["id"]
    assert api.request("GET", f"/tasks/{task_id}").data["state"] == "ready"  # no one took it


def test_a_long_poll_that_gets_nothing_is_204(api: Api, topic: str) -> None:
    started = time.monotonic()
    reply = api.request("POST", f"/topics/{topic}/reserve?timeout=0.3")
    assert reply.status == 204
    assert time.monotonic() - started >= 0.3  # it waited its timeout out


# -- schedules, stats, cluster, ping, the document -------------------------------------------


def test_topic_settings_and_priority(api: Api, topic: str) -> None:
    assert api.request("GET", f"/topics/{topic}").data["paused"] is False
    changed = api.request("PATCH", f"/topics/{topic}", {"concurrency": 2, "rate": 5})
    assert changed.status == 200 and (changed.data["concurrency"], changed.data["rate"]) == (2, 5)
    problem_of(api.request("PATCH", f"/topics/{topic}", {"burst": 0}), 422, "bad_request")
    listed = api.request("GET", "/topics?paused=false&limit=1000")
    assert topic in [t["topic"] for t in listed.data["topics"]]
    urgent = api.request("POST", "/tasks", {"topic": topic, "priority": 0, "body": "u"})
    assert api.request("GET", f"/tasks/{urgent.data['id']}").data["priority"] == 0
    kept = api.request("PATCH", f"/topics/{topic}", {"dead_retain": 3600})
    assert kept.status == 200 and kept.data["dead_retain"] == 3600
    problem_of(api.request("PATCH", f"/topics/{topic}", {"dead_retain": -1}), 422, "bad_request")
    back = api.request(
        "PATCH", f"/topics/{topic}", {"concurrency": None, "rate": None, "dead_retain": None}
    )
    assert back.data["concurrency"] is None and back.data["rate"] is None
    assert back.data["dead_retain"] is None


def test_schedules(api: Api, topic: str) -> None:
    sid = f"{topic}-every"
    spec = {"id": sid, "every": 3600, "topic": topic, "body": "tick"}
    added = api.request("POST", "/schedules", spec)
    assert added.status == 201 and added.data["id"] == sid and added.data["body"] == "tick"
    problem_of(api.request("POST", "/schedules", spec), 409, "exists")
    assert api.request("GET", f"/schedules/{sid}").data["id"] == sid
    listed = api.request("GET", f"/schedules?topic={topic}&paused=false")
    assert [s["id"] for s in listed.data["schedules"]] == [sid]
    version = added.data["version"]
    changed = api.request("PATCH", f"/schedules/{sid}?expected_version={version}", {"every": 7200})
    assert changed.status == 200 and changed.data["every"] == 7200
    stale = api.request("PATCH", f"/schedules/{sid}?expected_version={version}", {"every": 60})
    assert problem_of(stale, 409, "conflict")["data"]["version"] == changed.data["version"]
    paused = api.request("POST", f"/schedules/{sid}/pause?note=maintenance")
    assert paused.data["paused"] is True and paused.data["note"] == "maintenance"
    assert api.request("GET", f"/schedules?topic={topic}&paused=true").data["schedules"]
    assert api.request("POST", f"/schedules/{sid}/resume").data["paused"] is False
    triggered = api.request("POST", f"/schedules/{sid}/trigger")
    assert triggered.status == 200 and triggered.data["id"].startswith(f"s:{sid}:")
    now = time.time()
    backfilled = api.request("POST", f"/schedules/{sid}/backfill?start={now - 3 * 7200}&end={now}")
    assert backfilled.status == 200 and set(backfilled.data) == {"ids", "existing"}
    upcoming = api.request("GET", f"/schedules/{sid}/next?n=3")
    assert len(upcoming.data["times"]) == 3 and upcoming.data["description"]
    preview = api.request("POST", "/schedules/preview?n=2", {"cron": "0 3 * * *", "tz": "UTC"})
    assert len(preview.data["times"]) == 2
    bad_cron = api.request("POST", "/schedules/preview", {"cron": "61 * * * *"})
    assert "61" in problem_of(bad_cron, 422, "bad_request")["detail"]
    assert api.request("DELETE", f"/schedules/{sid}").data == {"deleted": True}
    problem_of(api.request("GET", f"/schedules/{sid}"), 404, "not_found")


def test_stats_cluster_ping_and_the_document(api: Api, server: ServerProcess) -> None:
    stats = api.request("GET", "/stats")
    assert stats.status == 200 and "tasks" in stats.data and "version" in stats.data
    cluster = api.request("GET", "/cluster")
    assert cluster.status == 200 and "owners" in cluster.data
    assert api.request("GET", "/ping").data == {"ping": "pong"}
    doc = call_once(api_url(server), "GET", "/openapi.json")  # no token needed
    assert doc.status == 200 and doc.data["openapi"].startswith("3.1")


# -- auth and errors ---------------------------------------------------------------------


def test_auth_is_a_bearer_token(api: Api, topic: str) -> None:
    missing = api.request("GET", "/stats", token="")
    # token="" sends "Bearer " (nothing given): refused, and not counted as a guess
    assert problem_of(missing, 401, "unauthorized")
    assert missing.headers["www-authenticate"] == "Bearer"
    wrong = api.request("POST", "/tasks", {"topic": topic}, token="not-it")
    problem_of(wrong, 401, "unauthorized")
    assert api.request("GET", f"/tasks?topic={topic}").data["tasks"] == []  # nothing added
    assert api.request("GET", "/stats").status == 200  # and the right one resets the count


@pytest.mark.parametrize(
    ("body", "status", "code", "named"),
    [
        ({"body": 1}, 422, "bad_request", "topic"),
        ({"topic": "t", "delay": -1}, 422, "bad_request", "-1"),
        ({"topic": "t", "colour": "red"}, 422, "bad_request", "colour"),
        ({"topic": "t", "body": "!!", "body_encoding": "base64"}, 400, "bad_request", "!!"),
        ({"topic": "t", "body": "AA==", "body_encoding": "rot13"}, 400, "bad_request", "rot13"),
        ({"topic": "t", "body": "x" * (MAX_BODY + 10)}, 413, "too_large", str(MAX_BODY)),
        ([1, 2], 400, "bad_request", "[1, 2]"),
    ],
)
def test_a_bad_task_is_a_problem_naming_the_value(
    api: Api, body: Any, status: int, code: str, named: str
) -> None:
    doc = problem_of(api.request("POST", "/tasks", body), status, code)
    assert named in doc["detail"] and doc["instance"] == "/v1/tasks"


def test_bad_json_bad_query_and_unknown_routes(api: Api, topic: str) -> None:
    problem_of(api.request("POST", "/tasks", raw=b"{not json"), 400, "bad_request")
    problem_of(api.request("POST", "/tasks", raw=b""), 400, "bad_request")
    limit = problem_of(api.request("GET", "/tasks?limit=many"), 422, "bad_request")
    assert "many" in limit["detail"]
    assert (
        "cursor"
        in problem_of(api.request("GET", "/tasks?cursor=%%%"), 400, "bad_request")["detail"]
    )
    timeout = problem_of(
        api.request("POST", f"/topics/{topic}/reserve?timeout=-2"), 422, "bad_request"
    )
    assert "-2" in timeout["detail"]
    problem_of(api.request("GET", "/nothing-here"), 404, "no_method")
    problem_of(api.request("PUT", "/tasks"), 405, "no_method")


def test_conflict(api: Api, topic: str) -> None:
    task_id = api.request("POST", "/tasks", {"topic": topic}).data["id"]
    doc = problem_of(api.request("POST", f"/tasks/{task_id}/ack"), 409, "conflict")
    assert task_id in doc["detail"] or "ready" in doc["detail"]


# -- the bounds ---------------------------------------------------------------------------


def _half_sent(server: ServerProcess, path: str = "/v1/tasks") -> socket.socket:
    """A request whose body never finishes: it holds a request slot until cut."""
    host, port = api_url(server).split("//")[1].split("/")[0].split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
        'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"topic": '.encode()
    )
    return sock


def test_an_oversized_request_is_413(api: Api, server: ServerProcess) -> None:
    big = {"topic": "t", "body": "x" * MAX_MESSAGE}
    doc = problem_of(api.request("POST", "/tasks", big), 413, "too_large")
    assert str(MAX_MESSAGE) in doc["detail"]


def test_too_many_in_flight_is_503_and_a_slow_client_is_cut(
    api: Api, server: ServerProcess, topic: str
) -> None:
    slow = [_half_sent(server) for _ in range(MAX_REQUESTS)]
    try:

        def refused() -> Reply | None:
            reply = api.request("GET", "/stats")
            return reply if reply.status == 503 else None

        busy = wait_until(refused, what="the request slots taken")
        doc = problem_of(busy, 503, "unavailable")
        assert str(MAX_REQUESTS) in doc["detail"] and int(busy.headers["retry-after"]) >= 1
        # A long poll is not counted: it waits as a blocked reserve does.
        assert api.request("POST", f"/topics/{topic}/reserve?timeout=0.1").status == 204
        # Each half-sent body is cut after --message-timeout: 408, and the connection closed.
        started = time.monotonic()
        for sock in slow:
            answer = b""
            while chunk := sock.recv(4096):
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 408"), answer
            assert b"application/problem+json" in answer
        assert time.monotonic() - started < MESSAGE_TIMEOUT_S + 10
    finally:
        for sock in slow:
            sock.close()
    assert wait_until(lambda: api.request("GET", "/stats").status == 200, what="slots free again")


def test_headers_that_never_finish_are_cut(server: ServerProcess) -> None:
    host, port = api_url(server).split("//")[1].split("/")[0].split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"GET /v1/stats HTTP/1.1\r\nHost: x\r\n")  # and no blank line
        started = time.monotonic()
        while sock.recv(4096):
            pass
        # Closed by the server after --message-timeout (not by our 30 s timeout).
        assert time.monotonic() - started < MESSAGE_TIMEOUT_S + 10


def test_the_sign_in_rule_holds_an_address_that_guesses() -> None:
    proc = ServerProcess("--api-port", "0", "--token", TOKEN)
    try:
        calls = Api(api_url(proc), TOKEN)
        replies = [calls.request("GET", "/stats", token=f"guess-{n}") for n in range(8)]
        assert {r.status for r in replies[:5]} == {401}
        # Held for a second at first, doubling: one of the next three meets it however
        # slow the machine is between them.
        held = next(r for r in replies[5:] if r.status == 429)
        problem_of(held, 429, "unauthorized")
        assert int(held.headers["retry-after"]) >= 1
        calls.close()
    finally:
        proc.stop()


# -- bodies across the two protocols -------------------------------------------------------

BODIES: list[Any] = [
    b"\x00\x01\xffbytes",
    "text ✓",
    42,
    -(2**63),
    2.5,
    True,
    {"map": {"nested": [1, "two", None]}},
    [1, [2, [3]], {"k": "v"}],
    None,
    {1: "int key"},  # no JSON form: body_encoding msgpack
    [b"bytes inside"],  # no JSON form either
]


@pytest.mark.parametrize("body", BODIES, ids=[repr(b)[:20] for b in BODIES])
def test_a_body_is_the_same_over_http_and_the_protocol(
    api: Api, client: Client, topic: str, body: Any
) -> None:
    # Added over the protocol, read over HTTP...
    task_id = client.add(topic, body, delay=600)["id"]
    shown = api.request("GET", f"/tasks/{task_id}").data
    assert _decoded(shown) == body
    # ...and that JSON sent back over HTTP, read over the protocol.
    again = {k: shown[k] for k in ("body", "body_encoding") if k in shown}
    http_id = api.request("POST", "/tasks", {"topic": topic, "delay": 600, **again}).data["id"]
    stored = client.get(http_id)
    assert stored is not None and stored["body"] == body and type(stored["body"]) is type(body)


def _decoded(shown: dict[str, Any]) -> Any:
    encoding = shown.get("body_encoding")
    if encoding is None:
        return shown["body"]
    raw = base64.b64decode(shown["body"])
    return raw if encoding == "base64" else msgpack.unpackb(raw, raw=False, strict_map_key=False)


# -- a long poll across a restart ----------------------------------------------------------


def test_a_long_poll_across_a_restart(tmp_path: Path) -> None:
    """The server stops under a waiting long poll: the poll is answered (204) or cut, the
    client polls again until the server is back, and gets the task added then."""
    api_port = free_port()
    proc = ServerProcess("--api-port", str(api_port), store=f"sqlite:///{tmp_path / 'dw.db'}")
    base = f"http://127.0.0.1:{api_port}/v1"
    got: list[Reply] = []
    answers: list[str] = []
    stop = threading.Event()

    def worker() -> None:
        """A client that polls again after any answer but a task, as workers do."""
        while not stop.is_set():
            poller = Api(base, timeout_s=30)
            try:
                reply = poller.request("POST", "/topics/restart/reserve?timeout=10")
            except OSError as exc:  # the server is down: retry after a pause
                answers.append(type(exc).__name__)
                time.sleep(0.2)
                continue
            finally:
                poller.close()
            answers.append(str(reply.status))
            if reply.status == 200:
                got.append(reply)
                return

    thread = threading.Thread(target=worker)
    try:
        thread.start()
        wait_until(
            lambda: call_once(base, "GET", "/stats").data["waiting_reserves"] >= 1, what="a poll"
        )
        proc.stop()
        assert answers and answers[0] == "204"  # the stop answered the waiting poll
        proc.start()
        wait_until(
            lambda: call_once(base, "GET", "/stats").data["waiting_reserves"] >= 1,
            what="polling again",
        )
        task_id = call_once(base, "POST", "/tasks", {"topic": "restart"}).data["id"]
        thread.join(30)
        assert got and got[0].data["id"] == task_id
    finally:
        stop.set()
        thread.join(30)
        proc.stop()


def test_the_dashboard_port_serves_the_api_too() -> None:
    web_port = free_port()
    proc = ServerProcess("--api-port", "0", "--web-port", str(web_port), "--token", TOKEN)
    try:
        on_web = Api(f"http://127.0.0.1:{web_port}/v1", TOKEN)
        added = on_web.request("POST", "/tasks", {"topic": "web-port"})
        assert added.status == 201
        assert (
            call_once(api_url(proc), "GET", f"/tasks/{added.data['id']}", token=TOKEN).status == 200
        )
        problem_of(on_web.request("GET", "/stats", token="wrong"), 401, "unauthorized")
        on_web.close()
    finally:
        proc.stop()
