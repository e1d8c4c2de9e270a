"""Replica choice for a shard call, behind one small interface.

``pick`` chooses among a shard's replicas (never one in ``exclude`` while another exists);
``on_start``/``on_finish`` feed the policy what happened. The policies that use latency and
load arrive with the tail-latency work; round robin is the baseline they are measured against.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Collection, Sequence

from retrieval.errors import ConfigError


class Balancer(ABC):
    @abstractmethod
    def pick(self, shard_id: int, replicas: Sequence[str], exclude: Collection[str] = ()) -> str:
        """One of ``replicas``; avoids ``exclude`` unless nothing else is left."""

    def on_start(self, replica: str) -> None:  # noqa: B027 - optional hook
        """A request to ``replica`` is leaving."""

    def on_finish(self, replica: str, latency_s: float, ok: bool) -> None:  # noqa: B027 - optional hook
        """A request to ``replica`` ended after ``latency_s`` seconds."""


def _candidates(replicas: Sequence[str], exclude: Collection[str]) -> Sequence[str]:
    if not replicas:
        raise ConfigError("a shard has no replicas")
    allowed = [r for r in replicas if r not in exclude]
    return allowed or replicas


class RoundRobinBalancer(Balancer):
    def __init__(self) -> None:
        self._next: dict[int, int] = {}

    def pick(self, shard_id: int, replicas: Sequence[str], exclude: Collection[str] = ()) -> str:
        candidates = _candidates(replicas, exclude)
        position = self._next.get(shard_id, 0)
        self._next[shard_id] = position + 1
        return candidates[position % len(candidates)]


BALANCERS = {"round_robin": RoundRobinBalancer}


def make_balancer(name: str) -> Balancer:
    try:
        return BALANCERS[name]()
    except KeyError:
        raise ConfigError(f"unknown balancer {name!r}; use one of {sorted(BALANCERS)}", field="balancer") from None
