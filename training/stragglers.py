"""Straggler detection: each step every rank reports its local compute time (before the first
collective, so waiting for others does not hide who is slow); a rank whose mean over the last
``window`` steps is ≥ ``factor`` × the median of all ranks' means is a straggler."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from statistics import median


class StragglerDetector:
    def __init__(self, world_size: int, *, factor: float = 1.5, window: int = 10) -> None:
        self.factor = factor
        self.window = window
        self._times: list[deque[float]] = [deque(maxlen=window) for _ in range(world_size)]

    def record(self, step_times_s: Sequence[float]) -> list[int]:
        """Add one step's per-rank times; return the ranks that are stragglers now."""
        for rank, seconds in enumerate(step_times_s):
            self._times[rank].append(seconds)
        if len(self._times) < 2 or len(self._times[0]) < self.window:
            return []
        means = [sum(times) / len(times) for times in self._times]
        middle = median(means)
        return [rank for rank, mean in enumerate(means) if middle > 0 and mean >= self.factor * middle]

    def means_s(self) -> list[float]:
        return [sum(t) / len(t) if t else 0.0 for t in self._times]
