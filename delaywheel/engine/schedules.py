"""The engine's side of recurring schedules (docs/schedules.md).

For now the stateless part: ``schedule_next`` for an unsaved spec. Saved
schedules (their store record and the fire-and-chain write) come here too,
beside the task verbs rather than in them.
"""

from __future__ import annotations

from typing import Any

from delaywheel.checks import bad, show
from delaywheel.errors import RequestError
from delaywheel.schedules.planner import render_next
from delaywheel.schedules.spec import check_preview

DEFAULT_NEXT_N = 5


def schedule_next(target: Any, n: Any, now_s: float, tick_s: float) -> dict[str, Any]:
    """The next ``n`` occurrences from now of ``target``: a schedule id, or a spec
    map (``cron`` and ``tz``, or ``every`` and ``anchor``)."""
    if type(target) is str:
        # No schedule can be saved yet: every id names none.
        raise RequestError("not_found", f"no schedule {show(target)}")
    if type(target) is not dict:
        raise bad(f"schedule_next takes a schedule id or a spec map, got {show(target)}")
    preview = check_preview(target, tick_s)
    return render_next(preview, round(now_s * 1000), DEFAULT_NEXT_N if n is None else n)
