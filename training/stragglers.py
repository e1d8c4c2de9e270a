"""Straggler detection: each step every rank reports its local compute time (before the first
collective, so waiting for others does not hide who is slow); a rank whose mean over the last
``window`` steps is ≥ ``factor`` × the median of the *other* ranks' means is a straggler (the
median of all ranks would include the slow rank itself: with 2 ranks it is their average, and a
rank had to be 3× slower than its peer to reach 1.5× of it)."""

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
        slow = []
        for rank, mean in enumerate(means):
            others = median(means[:rank] + means[rank + 1:])
            if others > 0 and mean >= self.factor * others:
                slow.append(rank)
        return slow

    def means_s(self) -> list[float]:
        return [sum(t) / len(t) if t else 0.0 for t in self._times]


def summarise_spread(rank_step_s: Sequence[Sequence[float]], straggler_events: int = 0,
                     skip: int = 2) -> dict[str, object]:
    """Per-rank local step times of a run (``rank_step_s[step][rank]``), summarised: each rank's
    median and p95, the slowest rank's median over the fastest's, and the median per-step spread
    (slowest rank / fastest rank that step). The first ``skip`` steps (warm-up) are left out."""
    steps = [list(row) for row in rank_step_s[skip:] if row] or [list(row) for row in rank_step_s if row]
    if not steps:
        return {}
    world = len(steps[0])
    per_rank = [sorted(step[rank] for step in steps) for rank in range(world)]
    medians = [median(times) for times in per_rank]
    p95 = [times[min(len(times) - 1, int(0.95 * len(times)))] for times in per_rank]
    per_step = [max(step) / min(step) for step in steps if min(step) > 0]
    return {"steps": len(steps), "median_s": [round(m, 4) for m in medians], "p95_s": [round(p, 4) for p in p95],
            "slowest_over_fastest": round(max(medians) / min(medians), 3) if min(medians) > 0 else None,
            "median_step_spread": round(median(per_step), 3) if per_step else None,
            "straggler_events": straggler_events}
