"""Hedging policy pieces: when to send a second copy of a shard call, and how many we may send.

* :class:`AdaptiveHedgeDelay` — a rolling percentile (default p95) of one shard's recent call
  latencies, clamped to [floor, cap]; before ``min_samples`` it answers ``cap``. "The Tail at
  Scale": hedge after the latency most requests beat, so few requests are duplicated.
* :class:`HedgeBudget` — a token bucket: each shard call deposits ``ratio`` tokens (up to
  ``burst``), each hedge spends one, so hedges stay under ``ratio`` of calls (+ the burst)
  even when a whole shard turns slow.
"""

from __future__ import annotations

from collections import deque


class AdaptiveHedgeDelay:
    def __init__(self, *, percentile: float = 95.0, window: int = 256, floor_s: float = 0.002,
                 cap_s: float = 0.25, min_samples: int = 20, refresh_every: int = 8) -> None:
        if not 0.0 < percentile < 100.0:
            raise ValueError("percentile must be in (0, 100)")
        if floor_s > cap_s:
            raise ValueError("floor_s must be ≤ cap_s")
        self.percentile = percentile
        self.floor_s = floor_s
        self.cap_s = cap_s
        self.min_samples = min_samples
        self._samples: deque[float] = deque(maxlen=window)
        self._refresh_every = refresh_every
        self._since_refresh = 0
        self._delay_s = cap_s

    def observe(self, latency_s: float) -> None:
        self._samples.append(latency_s)
        self._since_refresh += 1
        if self._since_refresh >= self._refresh_every or len(self._samples) == self.min_samples:
            self._refresh()

    def _refresh(self) -> None:
        self._since_refresh = 0
        if len(self._samples) < self.min_samples:
            self._delay_s = self.cap_s
            return
        ordered = sorted(self._samples)
        # nearest-rank percentile: the smallest sample with at least p% of samples ≤ it
        rank = max(0, min(len(ordered) - 1, -(-len(ordered) * self.percentile // 100) - 1))
        self._delay_s = min(max(ordered[int(rank)], self.floor_s), self.cap_s)

    def delay_s(self) -> float:
        return self._delay_s

    @property
    def samples(self) -> int:
        return len(self._samples)


class HedgeBudget:
    def __init__(self, *, ratio: float = 0.05, burst: float = 10.0) -> None:
        if not 0.0 <= ratio <= 1.0:
            raise ValueError("ratio must be in [0, 1]")
        self.ratio = ratio
        self.burst = burst
        self._tokens = burst
        self.calls = 0
        self.spent = 0
        self.refused = 0

    def on_call(self) -> None:
        self.calls += 1
        self._tokens = min(self.burst, self._tokens + self.ratio)

    def try_spend(self) -> bool:
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            self.spent += 1
            return True
        self.refused += 1
        return False

    @property
    def tokens(self) -> float:
        return self._tokens
