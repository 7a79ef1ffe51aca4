"""When a failed delivery attempt is tried again: doubling back-off with jitter, capped.

A module of its own, importing nothing of the engine, so that the settings
(``delaywheel.config``, which the CLI loads for every command) take the
defaults from here without loading the delivery code.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

DEFAULT_RETRY_BASE_S = 1.0
DEFAULT_RETRY_CAP_S = 3600.0
# A retry waits base * 2^(attempt-1); past this exponent the cap has long won
# (and 2.0**1024 would overflow).
_MAX_RETRY_EXPONENT = 60


@dataclass(frozen=True)
class RetryPolicy:
    base_s: float = DEFAULT_RETRY_BASE_S
    cap_s: float = DEFAULT_RETRY_CAP_S
    jitter: Callable[[], float] = field(default=random.random)  # in [0, 1)

    def delay_s(self, attempts: int) -> float:
        """How long after failed attempt number ``attempts`` the next one starts:
        the base doubled per attempt, plus up to 10 % jitter, at most the cap."""
        exponent = min(attempts - 1, _MAX_RETRY_EXPONENT)
        return min(self.base_s * 2.0**exponent * (1.0 + 0.1 * self.jitter()), self.cap_s)
