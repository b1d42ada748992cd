"""Retry delays: exponential with jitter, a pure function of the attempt number."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    """``base_ms * factor ** (attempt - 1)``, capped at ``max_ms``, then spread by ``±jitter``."""

    base_ms: int = 2_000
    factor: float = 2.0
    max_ms: int = 3_600_000
    jitter: float = 0.2

    def delay_ms(self, attempt: int, rng: random.Random | None = None) -> int:
        """The wait after failed attempt number ``attempt`` (1-based)."""
        nominal = min(float(self.max_ms), self.base_ms * self.factor ** max(0, attempt - 1))
        spread = nominal * self.jitter
        draw = (rng or random).uniform(-spread, spread)
        return max(0, round(nominal + draw))

    def bounds_ms(self, attempt: int) -> tuple[int, int]:
        """The smallest and largest delay ``delay_ms`` can return for this attempt."""
        nominal = min(float(self.max_ms), self.base_ms * self.factor ** max(0, attempt - 1))
        return max(0, int(nominal * (1 - self.jitter))), round(nominal * (1 + self.jitter)) + 1
