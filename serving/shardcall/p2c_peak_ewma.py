"""Power of two choices over peak-EWMA latency × load (Finagle's/Linkerd's default balancer).

Each replica keeps a latency estimate that jumps to any sample above it (peak) and otherwise
decays toward new samples with time constant ``decay_s``; reading it also decays it toward 0,
so a replica that has not been used for a while looks cheap again and gets re-probed. The cost
of a replica is ``ewma × (outstanding + 1)``; a pick draws two distinct replicas at random and
takes the cheaper. Failures count as ``failure_penalty_s`` of latency.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

from serving.shardcall.balancer import Balancer, Clock


@dataclass(slots=True)
class _Ewma:
    value_s: float
    stamp: float


class PeakEwmaBalancer(Balancer):
    def __init__(self, *, decay_s: float = 10.0, default_latency_s: float = 0.001,
                 failure_penalty_s: float = 1.0, clock: Clock = time.monotonic,
                 rng: random.Random | None = None) -> None:
        super().__init__(clock=clock, rng=rng)
        self.decay_s = decay_s  # how fast old latency fades (Finagle default: 10 s)
        self.default_latency_s = default_latency_s  # estimate for a replica never measured
        self.failure_penalty_s = failure_penalty_s  # a failure costs as much as this latency
        self._ewma: dict[str, _Ewma] = {}

    def _observe(self, replica: str, sample_s: float) -> float:
        now = self.clock()
        state = self._ewma.get(replica)
        if state is None:
            state = self._ewma[replica] = _Ewma(self.default_latency_s, now)
        weight = math.exp(-max(now - state.stamp, 0.0) / self.decay_s)
        state.value_s = sample_s if sample_s > state.value_s else state.value_s * weight + sample_s * (1.0 - weight)
        state.stamp = now
        return state.value_s

    def latency_estimate_s(self, replica: str) -> float:
        return self._observe(replica, 0.0)  # reading decays the estimate with idle time

    def cost(self, replica: str) -> float:
        return self.latency_estimate_s(replica) * (self.outstanding.get(replica, 0) + 1)

    def expected_latency_s(self, replica: str) -> float | None:
        return self.cost(replica)  # its latency × the calls queued ahead of a new one

    def choose(self, shard_id: int, candidates: Sequence[str]) -> str:
        first, second = self.rng.sample(range(len(candidates)), 2)
        a, b = candidates[first], candidates[second]
        return a if self.cost(a) <= self.cost(b) else b

    def on_finish(self, replica: str, latency_s: float, ok: bool) -> None:
        super().on_finish(replica, latency_s, ok)
        self._observe(replica, latency_s if ok else max(latency_s, self.failure_penalty_s))
