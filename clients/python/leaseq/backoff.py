"""Client-side retry delays for messages whose handler failed (optional: by
default the queue's own retry ladder decides)."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

MAX_DELAY = 43_200  # the longest visibility timeout the service accepts (12 hours)


@dataclass(frozen=True)
class Backoff:
    """Delay before a failed message is visible again, growing with its receive count:
    `initial * multiplier ** (receive_count - 1)`, capped at `maximum`, spread by
    ±`jitter` (a fraction), in whole seconds. The default (`initial=0`) retries at once.

    A worker without one leaves the delay to the queue's retry ladder
    (`retry_backoff`, applied by the service to a release that names no delay).
    A worker given one computes the delay here and sends it with the release,
    which overrides the queue's ladder.
    """

    initial: float = 0.0
    multiplier: float = 2.0
    maximum: float = 900.0
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if self.initial < 0 or self.maximum < 0:
            raise ValueError("backoff delays must not be negative")
        if self.multiplier < 1:
            raise ValueError("the backoff multiplier must be at least 1")
        if not 0 <= self.jitter <= 1:
            raise ValueError("jitter is a fraction between 0 and 1")

    def delay(self, receive_count: int, rng: Callable[[], float] = random.random) -> int:
        """Seconds to wait before the next attempt after attempt `receive_count` failed."""
        if self.initial <= 0:
            return 0
        exponent = max(receive_count - 1, 0)
        base = self.maximum
        if exponent < 64:  # beyond that the cap has long been reached
            base = min(self.maximum, self.initial * self.multiplier**exponent)
        spread = 1.0 + self.jitter * (2.0 * rng() - 1.0)
        return max(0, min(MAX_DELAY, round(base * spread)))
