"""The one rule for failed sign-ins (net/signins.py), on a clock the test moves."""

from __future__ import annotations

from delaywheel.net import signins
from delaywheel.net.signins import SignIns


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def test_a_few_failures_then_a_growing_refusal() -> None:
    clock = Clock()
    rule = SignIns(clock)
    for _ in range(signins.FREE_FAILURES - 1):
        rule.failed("10.0.0.1", "protocol")
        assert rule.retry_in_s("10.0.0.1", "protocol") == 0
    blocks = []
    for _ in range(9):
        rule.failed("10.0.0.1", "api")
        blocks.append(rule.retry_in_s("10.0.0.1", "sign_in"))
        clock.now_s += blocks[-1]  # it waits its block out, then fails again
    assert blocks == [1, 2, 4, 8, 16, 32, 60, 60, 60]
    assert rule.failures == {"protocol": 4, "api": 9, "sign_in": 0}
    assert rule.refused == {"protocol": 0, "api": 0, "sign_in": 9}
    assert rule.retry_in_s("10.0.0.2", "protocol") == 0  # another address is not refused


def test_forgotten_after_a_quiet_while_or_a_success() -> None:
    clock = Clock()
    rule = SignIns(clock)
    for _ in range(signins.FREE_FAILURES):
        rule.failed("10.0.0.1", "protocol")
        rule.failed("10.0.0.2", "protocol")
    rule.succeeded("10.0.0.1")
    assert rule.retry_in_s("10.0.0.1", "protocol") == 0
    clock.now_s += signins.FORGET_S + 1
    rule.failed("10.0.0.2", "protocol")  # a new burst: one free failure again
    assert rule.retry_in_s("10.0.0.2", "protocol") == 0


def test_ipv6_counts_by_its_64_and_mapped_ipv4_as_ipv4() -> None:
    rule = SignIns(Clock())
    for i in range(signins.FREE_FAILURES):
        rule.failed(f"2001:db8:1:2::{i + 1}", "protocol")
    assert rule.retry_in_s("2001:db8:1:2:ffff::9", "protocol") > 0
    assert rule.retry_in_s("2001:db8:1:3::1", "protocol") == 0
    for _ in range(signins.FREE_FAILURES):
        rule.failed("::ffff:10.0.0.7", "protocol")
    assert rule.retry_in_s("10.0.0.7", "api") > 0


def test_memory_is_bounded_by_forgetting_the_oldest() -> None:
    rule = SignIns(Clock())
    for i in range(signins.MAX_ADDRESSES + 10):
        rule.failed(f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}", "protocol")
    assert len(rule._by_source) == signins.MAX_ADDRESSES
