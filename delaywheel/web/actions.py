"""Changes from the dashboard: the engine's own verbs, answered once durable.

Every action calls the same validated, journaled verb a protocol request
would (``delete``, ``update``, ``kick_task``), then waits for the store
write holding it, as a connection holds its reply. Bulk actions run as a
``BulkJob`` on the server: ``BATCH`` ids at a time, each batch made durable
before the next, yielding to the loop between batches, with progress the
job page shows. Every action is one log line: who, what, how many.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from delaywheel.engine.topics import PAUSED_FOR_EVER_S
from delaywheel.errors import RequestError
from delaywheel.net.calls import durable

if TYPE_CHECKING:
    from delaywheel.net.server import Server

log = logging.getLogger("delaywheel.web")  # pinned: docs/dashboard.md names it

BATCH = 500
CONFIRM_TOPIC_OVER = 1000  # past this many tasks, the topic's name is typed to confirm
MAX_JOBS_KEPT = 100


def verbs(server: Server) -> dict[str, Callable[[str], Any]]:
    """What each action does to one task, through the engine's verbs."""
    engine = server.engine
    return {
        "delete": engine.delete,
        "kick": lambda task_id: engine.kick_task(task_id, time.time()),
        "run": lambda task_id: engine.update(task_id, {"delay": 0}, time.time()),
    }


def schedule_verbs(server: Server) -> dict[str, Callable[[str], Any]]:
    """What each action does to one schedule, through the engine's verbs."""
    engine = server.engine
    return {
        "pause": lambda schedule_id: engine.schedule_pause(schedule_id, None),
        "resume": lambda schedule_id: engine.schedule_resume(schedule_id, time.time()),
        "trigger": lambda schedule_id: engine.schedule_trigger(schedule_id, time.time()),
    }


def topic_verbs(server: Server) -> dict[str, Callable[[str], Any]]:
    """What each action does to one topic's settings, through the engine's verbs:
    a pause with no end (resumed by hand), and resume."""
    engine = server.engine
    return {
        "pause": lambda topic: engine.topic_set(
            topic, {"paused_until": PAUSED_FOR_EVER_S}, time.time()
        ),
        "resume": lambda topic: engine.topic_set(topic, {"paused_until": None}, time.time()),
    }


async def one(
    server: Server, who: str, what: str, call: Callable[[], Any], of: str = "task"
) -> Any:
    """One action on one task (or schedule): the verb, then durable, then the log line."""
    result = await server.engine.through_store(call)
    await durable(server.engine)
    server.rearm()  # it may have moved the next timer, as a request's change may
    log.info("web %s: %s, 1 %s", who, what, of, extra={"who": who, "action": what, "tasks": 1})
    return result


@dataclass
class BulkJob:
    number: int
    who: str
    what: str  # kick or delete
    description: str
    total: int
    done: int = 0
    skipped: int = 0  # gone or no longer dead by the time its batch ran
    error: str | None = None
    finished: bool = False


class Jobs:
    def __init__(self, server: Server) -> None:
        self._server = server
        self._numbers = itertools.count(1)
        self.by_number: dict[int, BulkJob] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self, who: str, what: str, description: str, ids: list[str]) -> BulkJob:
        job = BulkJob(next(self._numbers), who, what, description, len(ids))
        self.by_number[job.number] = job
        while len(self.by_number) > MAX_JOBS_KEPT:
            del self.by_number[next(iter(self.by_number))]
        task = asyncio.get_running_loop().create_task(self._run(job, ids))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return job

    async def _run(self, job: BulkJob, ids: list[str]) -> None:
        verb = verbs(self._server)[job.what]
        try:
            for start in range(0, len(ids), BATCH):
                changed = 0
                for task_id in ids[start : start + BATCH]:
                    try:
                        done = await self._server.engine.through_store(partial(verb, task_id))
                        if done is False:  # delete of one already gone
                            job.skipped += 1
                        else:
                            changed += 1
                    except RequestError:  # gone, or not dead any more
                        job.skipped += 1
                await durable(self._server.engine)
                self._server.rearm()
                job.done += changed
                await asyncio.sleep(0)  # the loop serves everyone else between batches
        except RequestError as exc:
            job.error = exc.message
        finally:
            job.finished = True
            log.info(
                "web %s: %s %s, %d tasks (%d skipped)%s",
                *(job.who, job.what, job.description, job.done, job.skipped),
                "" if job.error is None else f", stopped: {job.error}",
                extra={"who": job.who, "action": job.what, "tasks": job.done},
            )

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks))
