"""The HA harness's checker (tests/hacheck.py) on logs made up to hold each fault,
its sink on a real HTTP port, and its request log's outcomes."""

from __future__ import annotations

import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from delaywheel_client.errors import ConnectionFailed, NotFound, Unavailable
from hacheck import (
    Delivery,
    Fault,
    Request,
    RequestLog,
    check,
    failed_attempts,
    outcome_of,
    sink,
)


def add(task_id: str, sent_s: float, delay_s: float, outcome: str = "ok") -> Request:
    return Request("add", task_id, sent_s, sent_s + 0.01, outcome, sent_s + delay_s)  # type: ignore[arg-type]


def delete(task_id: str, done_s: float, outcome: str = "ok", existed: bool = True) -> Request:
    return Request("delete", task_id, done_s - 0.01, done_s, outcome, None, existed)  # type: ignore[arg-type]


def got(task_id: str, at_s: float, epoch: int | None = 1) -> Delivery:
    return Delivery(task_id, epoch, 1, at_s)


def test_a_clean_run_reports_nothing() -> None:
    requests = [add("a", 100, 1), add("b", 100, 2), add("c", 100, 5)]
    report = check(requests, [got("a", 101.02), got("b", 102.05)], pending=["c"])
    assert report.ok and report.summary().startswith(
        "3 acknowledged, 2 delivered, 1 pending: 0 lost"
    )
    assert report.duplicates == {} and report.takeover_s is None
    assert abs(report.max_late_s - 0.04) < 1e-9  # from the reply, 0.01 s after the send


def test_an_acknowledged_add_never_delivered_nor_pending_is_lost() -> None:
    requests = [
        add("lost", 100, 1),
        add("unknown", 100, 1, outcome="unknown"),  # may never have landed
        add("refused", 100, 1, outcome="error"),
        add("deleted", 100, 1),
        delete("deleted", 100.5),
        add("delete-unknown", 100, 1),
        delete("delete-unknown", 100.5, outcome="unknown"),
    ]
    report = check(requests, [])
    assert report.lost == ["lost"] and not report.ok


def test_a_delivery_after_an_acknowledged_delete_is_resurrected() -> None:
    requests = [
        add("r", 100, 5),
        delete("r", 101),
        add("inflight", 100, 1),
        delete("inflight", 101),
    ]
    deliveries = [got("r", 105), got("inflight", 101.2)]  # in flight when deleted: not counted
    report = check(requests, deliveries)
    assert report.resurrected == ["r"] and not report.ok
    # A delete that found nothing (already delivered and gone) resurrects nothing.
    again = check([add("x", 100, 1), delete("x", 102, existed=False)], [got("x", 103)])
    assert again.resurrected == []


def test_early_deliveries_and_duplicates_per_id() -> None:
    requests = [add("early", 100, 2), add("dup", 100, 1), add("fine", 100, 1)]
    deliveries = [
        got("early", 101.5),
        got("dup", 101.0, epoch=3),
        got("dup", 104.0, epoch=4),
        got("dup", 104.1, epoch=4),
        got("fine", 100.999),  # within the clock margin
    ]
    report = check(requests, deliveries)
    assert report.early == ["early"] and not report.ok
    assert report.duplicates == {"dup": 3}


def test_a_duplicate_is_explained_only_when_it_straddles_a_fault() -> None:
    requests = [add(i, 100, 1) for i in ("crash", "pause", "late", "calm")]
    deliveries = [
        got("crash", 101.0),  # sent just before the kill at 101.2, sent again after
        got("crash", 103.0),
        got("pause", 104.0),  # first sent while its owner was stopped (102..105)
        got("pause", 105.3),
        got("late", 106.0),  # both after every fault: nothing was in flight
        got("late", 106.5),
        got("calm", 101.0),
        got("calm", 101.1),
    ]
    faults = [101.2, Fault(102.0, 105.0)]
    report = check(requests, deliveries, faults=faults)
    assert report.duplicates == {"crash": 2, "pause": 2, "late": 2, "calm": 2}
    assert report.unexplained == {"late": 2, "calm": 2}  # "calm" ended before the kill
    # With no fault (a graceful handoff), every duplicate is unexplained.
    assert check(requests, deliveries).unexplained == report.duplicates


def test_a_duplicate_of_an_add_resent_across_a_fault_is_explained() -> None:
    """An add sent as the fault began, answered 4 s later: the client resent it,
    the first send had landed and was delivered before the reply, and the
    resend made the task again (seen in tests/test_ha_sentinel.py scenario 4)."""
    resent = Request("add", "resent", 100.0, 104.2, "ok", 100.24)
    calm = Request("add", "calm", 110.0, 114.2, "ok", 110.24)  # after the fault
    quick = add("quick", 100.0, 0.24)  # answered at once: not resent
    deliveries = [got(i, at_s) for i, at_s in [("resent", 103.6), ("resent", 104.5)]]
    deliveries += [got("calm", 113.6), got("calm", 114.5)]
    deliveries += [got("quick", 104.0), got("quick", 104.5)]  # after the fault
    report = check([resent, calm, quick], deliveries, faults=[Fault(100.0, 103.1)])
    assert report.duplicates == {"resent": 2, "calm": 2, "quick": 2}
    assert report.unexplained == {"calm": 2, "quick": 2}


def test_the_next_attempt_after_one_its_sender_saw_fail_is_explained() -> None:
    """Scenario 7 saw it: attempt 1 reached the sink after the server's 1 s
    timeout, and attempt 2 went. Only attempts under numbers of their own,
    each but the last logged as failed: an attempt sent twice under one
    number is a resend, which only a fault explains."""
    requests = [add(i, 100, 1) for i in ("retried", "unlogged", "resent", "thrice")]
    deliveries = [
        Delivery("retried", 3, 1, 101.0),
        Delivery("retried", 4, 2, 102.5),  # by the next owner: the record said delayed
        Delivery("unlogged", 3, 1, 101.0),  # no server said attempt 1 failed
        Delivery("unlogged", 3, 2, 102.1),
        Delivery("resent", 3, 1, 101.0),  # attempt 1 failed, then sent again as 1
        Delivery("resent", 4, 1, 102.1),
        Delivery("thrice", 3, 1, 101.0),
        Delivery("thrice", 3, 2, 102.1),
        Delivery("thrice", 3, 3, 104.1),
    ]
    lines = [
        "2026-12-06 10:06:29,808 INFO delaywheel.delivery.dispatcher: task 'retried' attempt 1"
        " to http://127.0.0.1:40893 failed: timed out after 1 s waiting for"
        " http://127.0.0.1:40893/deliver",
        *(
            f"x INFO delaywheel.delivery.dispatcher: task '{task_id}' attempt {n} to"
            " http://127.0.0.1:9 failed: HTTP 503"
            for task_id, n in [("resent", 1), ("thrice", 1), ("thrice", 2)]
        ),
        "x INFO delaywheel.cluster: handed back partition 3",
    ]
    failed = failed_attempts(lines)
    assert failed == {("retried", 1), ("resent", 1), ("thrice", 1), ("thrice", 2)}
    report = check(requests, deliveries, failed=failed)
    assert report.retried == {"retried": 2, "thrice": 3}
    assert report.unexplained == {"unlogged": 2, "resent": 2}
    assert "2 retried after a failed attempt" in report.summary()


def test_takeover_is_the_worst_lateness_after_the_fault() -> None:
    requests = [add(f"t{i}", 100, i) for i in range(1, 6)]
    deliveries = [
        got("t1", 101.0),
        got("t2", 102.0),
        got("t3", 107.5),
        got("t4", 107.6),
        got("t5", 107.7),
    ]
    report = check(requests, deliveries, faults=[102.5])
    assert report.ok
    assert report.takeover_s is not None and abs(report.takeover_s - 4.49) < 1e-9
    assert abs(report.max_late_s - 4.49) < 1e-9


def test_outcomes_of_client_errors() -> None:
    lost_reply = ConnectionFailed("reply lost")
    lost_reply.maybe_applied = True
    assert outcome_of(lost_reply) == "unknown"
    assert outcome_of(ConnectionFailed("refused")) == "error"
    assert outcome_of(Unavailable("too few replicas")) == "unknown"
    assert outcome_of(NotFound("no task")) == "error"
    assert outcome_of(TimeoutError()) == "unknown"


def test_the_request_log_classifies_each_call() -> None:
    class Flaky:
        def add(self, *args: object, **kwargs: object) -> dict[str, str]:
            if kwargs["id"] == "down":
                raise ConnectionFailed("connect refused")
            return {"id": str(kwargs["id"])}

        def delete(self, task_id: str) -> bool:
            raise Unavailable("store unreachable")

    log = RequestLog()
    assert log.add(Flaky(), "up", 1.0) == "ok"
    assert log.add(Flaky(), "down", 1.0) == "error"
    assert log.delete(Flaky(), "up") == "unknown"
    outcomes = [(r.op, r.task_id, r.outcome) for r in log.snapshot()]
    assert outcomes == [("add", "up", "ok"), ("add", "down", "error"), ("delete", "up", "unknown")]
    first = log.snapshot()[0]
    assert first.due_s is not None and abs(first.due_s - first.sent_s - 1.0) < 1e-9


def test_the_sink_logs_each_delivery_over_http() -> None:
    with sink() as running:
        for epoch in ("7", None):
            headers = {"Delaywheel-Id": "t-1", "Delaywheel-Attempt": "2"}
            if epoch:
                headers["Delaywheel-Epoch"] = epoch
            request = urllib.request.Request(running.url, b"{}", headers, method="POST")
            with urllib.request.urlopen(request, timeout=5) as reply:
                assert reply.status == 200
        received = running.received()
    assert [(d.task_id, d.epoch, d.attempt) for d in received] == [("t-1", 7, 2), ("t-1", None, 2)]


def test_the_sink_takes_a_burst_of_deliveries_at_once() -> None:
    """A node taking partitions over sends every overdue task at once: the sink
    logs each as it comes, not a SYN retransmission (1 s) later, past the
    checker's in-flight margin."""
    burst = 64
    with sink() as running:
        started_s = time.time()

        def deliver(n: int) -> None:
            headers = {"Delaywheel-Id": f"t-{n}", "Delaywheel-Attempt": "1"}
            request = urllib.request.Request(running.url, b"{}", headers, method="POST")
            with urllib.request.urlopen(request, timeout=5) as reply:
                assert reply.status == 200

        with ThreadPoolExecutor(burst) as pool:
            list(pool.map(deliver, range(burst)))
        received = running.received()
    assert len(received) == burst
    assert max(d.at_s for d in received) - started_s < 0.5
