"""Replica choice for a shard call: one small interface, one small class per policy.

``pick`` chooses among a shard's replicas, never one in ``exclude`` while another exists;
``on_start``/``on_finish`` tell the policy what happened (outstanding requests, latency,
failures). Time and randomness are injected (``clock``, ``rng``) so unit tests are exact.

Policies: ``round_robin`` (the baseline), ``random``, ``least_outstanding`` (here) and
``p2c_peak_ewma`` (the default, in ``p2c_peak_ewma``); ``policies.make_balancer(name)`` is the
registry that knows them all (so no policy module imports another).
"""

from __future__ import annotations

import random
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Sequence

from retrieval.errors import ConfigError

Clock = Callable[[], float]


class Balancer(ABC):
    def __init__(self, *, clock: Clock = time.monotonic, rng: random.Random | None = None) -> None:
        self.clock = clock
        self.rng = rng or random.Random()
        self.outstanding: dict[str, int] = {}

    @abstractmethod
    def choose(self, shard_id: int, candidates: Sequence[str]) -> str:
        """One of ``candidates`` (never empty)."""

    def pick(self, shard_id: int, replicas: Sequence[str], exclude: Collection[str] = ()) -> str:
        if not replicas:
            raise ConfigError(f"shard {shard_id} has no replicas")
        allowed = [r for r in replicas if r not in exclude] or list(replicas)
        return allowed[0] if len(allowed) == 1 else self.choose(shard_id, allowed)

    def expected_latency_s(self, replica: str) -> float | None:
        """When a call sent to ``replica`` now would likely finish, or None when the policy
        keeps no latency estimate (hedging then takes any untried replica)."""
        return None

    def on_start(self, replica: str) -> None:
        self.outstanding[replica] = self.outstanding.get(replica, 0) + 1

    def on_finish(self, replica: str, latency_s: float, ok: bool) -> None:
        self.outstanding[replica] = max(0, self.outstanding.get(replica, 0) - 1)


class RoundRobinBalancer(Balancer):
    def __init__(self, *, clock: Clock = time.monotonic, rng: random.Random | None = None) -> None:
        super().__init__(clock=clock, rng=rng)
        self._next: dict[int, int] = {}

    def choose(self, shard_id: int, candidates: Sequence[str]) -> str:
        position = self._next.get(shard_id, 0)
        self._next[shard_id] = position + 1
        return candidates[position % len(candidates)]


class RandomBalancer(Balancer):
    def choose(self, shard_id: int, candidates: Sequence[str]) -> str:
        return candidates[self.rng.randrange(len(candidates))]


class LeastOutstandingBalancer(Balancer):
    """Fewest requests in flight; ties broken at random so load spreads."""

    def choose(self, shard_id: int, candidates: Sequence[str]) -> str:
        fewest = min(self.outstanding.get(r, 0) for r in candidates)
        tied = [r for r in candidates if self.outstanding.get(r, 0) == fewest]
        return tied[0] if len(tied) == 1 else tied[self.rng.randrange(len(tied))]
