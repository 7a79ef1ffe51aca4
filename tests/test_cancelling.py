"""cancel_and_wait (delaywheel/cancelling.py): a task that swallows a cancel,
as a redis-py command does when the cancel lands while it is being sent,
still ends; one that never ends is left after the bound, not waited for."""

from __future__ import annotations

import asyncio
import contextlib
import time

from delaywheel.cancelling import cancel_and_wait


async def _swallows_first_cancel(swallowed: list[bool]) -> None:
    try:
        await asyncio.sleep(60)  # the send
    except asyncio.CancelledError:
        swallowed.append(True)  # redis-py's wait_for returned the finished send instead
    await asyncio.sleep(60)  # the reply, from a paused Redis


async def _ignores_cancels(until: asyncio.Event) -> None:
    while not until.is_set():
        with contextlib.suppress(asyncio.CancelledError):
            await until.wait()


def test_a_task_that_swallowed_its_cancel_ends_at_the_next_one() -> None:
    async def run() -> tuple[set[asyncio.Task[None]], bool, list[bool], float]:
        swallowed: list[bool] = []
        task = asyncio.get_running_loop().create_task(_swallows_first_cancel(swallowed))
        await asyncio.sleep(0)  # in its first sleep
        started_s = time.monotonic()
        left = await cancel_and_wait({task}, 10.0)
        return left, task.cancelled(), swallowed, time.monotonic() - started_s

    left, cancelled, swallowed, took_s = asyncio.run(run())
    assert left == set() and cancelled and swallowed == [True]
    assert took_s < 1.0  # a cancel or two later, not the 60 s of its reply


def test_a_task_that_does_not_end_is_left_after_the_bound() -> None:
    async def run() -> tuple[bool, bool, float]:
        until = asyncio.Event()
        task = asyncio.get_running_loop().create_task(_ignores_cancels(until))
        await asyncio.sleep(0)
        started_s = time.monotonic()
        left = await cancel_and_wait({task}, 0.3)
        took_s = time.monotonic() - started_s
        still_running = task in left and not task.done()
        until.set()
        await task
        return still_running, task.cancelled(), took_s

    still_running, cancelled, took_s = asyncio.run(run())
    assert still_running and not cancelled
    assert 0.3 <= took_s < 1.0


def test_tasks_already_done_and_failed_ones_are_fine() -> None:
    async def fails() -> None:
        raise ValueError("boom")

    async def run() -> set[asyncio.Task[None]]:
        loop = asyncio.get_running_loop()
        failing = loop.create_task(fails())
        await asyncio.sleep(0)
        sleeping = loop.create_task(asyncio.sleep(60))
        return await cancel_and_wait([failing, sleeping], 1.0)

    assert asyncio.run(run()) == set()
