"""Which generator answers: the one most likely to hold the request's KV, unless it is busy.

Affinity: every passage has an owner among the generators (rendezvous hashing on its doc id, so
adding or losing a generator moves only its passages); a request prefers the generator that
owns most of its passages, ties broken by the owner of its first passage — the one that decides
the prefix chain in prefix mode. Other generators follow in rendezvous order of the first
passage, so a request spills to the same second choice every time.

Load (bounded-load consistent hashing, Mirrokni et al.): a generator takes a request only while
its calls in flight are under ``ceil(load_factor × (all in flight + 1) / live generators)``;
otherwise the request goes to the next one in its order. A generator that failed a call is
skipped for ``down_for_s`` (it is still tried when every one is down).
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from retrieval.errors import ConfigError


def _weight(generator: str, key: str) -> bytes:
    return hashlib.blake2b(f"{generator}\0{key}".encode(), digest_size=8).digest()


def owner_of(key: str, generators: Sequence[str]) -> str:
    return max(generators, key=lambda g: _weight(g, key))


@dataclass
class RouterStats:
    routed: int = 0
    spilled: int = 0  # the preferred generator was over its load bound
    failed_over: int = 0  # the preferred generator was down or failed
    per_generator: dict[str, int] = field(default_factory=dict)


class AffinityRouter:
    def __init__(self, generators: Sequence[str], *, load_factor: float = 1.25, down_for_s: float = 5.0,
                 affinity: bool = True) -> None:
        if load_factor < 1.0:
            raise ConfigError("answer.load_factor must be ≥ 1", field="answer.load_factor")
        self.generators = list(generators)
        self.load_factor = load_factor
        self.down_for_s = down_for_s
        self.affinity = affinity  # False: round robin (the baseline the benchmark compares with)
        self.stats = RouterStats()
        self._in_flight = dict.fromkeys(self.generators, 0)
        self._down_until = dict.fromkeys(self.generators, 0.0)
        self._turn = 0
        self._lock = threading.Lock()

    def preference(self, doc_ids: Sequence[str]) -> list[str]:
        """All generators, most preferred first (load not considered)."""
        if not self.affinity or not doc_ids:
            with self._lock:
                self._turn += 1
                start = self._turn % max(len(self.generators), 1)
            return self.generators[start:] + self.generators[:start]
        votes: dict[str, int] = {}
        for doc_id in doc_ids:
            owner = owner_of(doc_id, self.generators)
            votes[owner] = votes.get(owner, 0) + 1
        first = doc_ids[0]
        return sorted(self.generators, key=lambda g: (votes.get(g, 0), _weight(g, first)), reverse=True)

    def order(self, doc_ids: Sequence[str]) -> tuple[list[str], str]:
        """(the generators to try, in order; the preferred one). Live ones under their load bound
        come first in preference order, then live ones over it, then those marked down."""
        preferred = self.preference(doc_ids)
        now = time.monotonic()
        with self._lock:
            live = [g for g in preferred if self._down_until[g] <= now]
            bound = math.ceil(self.load_factor * (sum(self._in_flight.values()) + 1) / max(len(live), 1))
            under = [g for g in live if self._in_flight[g] < bound]
        over = [g for g in live if g not in under]
        down = [g for g in preferred if g not in live]
        return under + over + down, preferred[0]

    @contextmanager
    def call(self, generator: str, preferred: str) -> Iterator[None]:
        """Count a call in flight on ``generator`` while the block runs."""
        with self._lock:
            self._in_flight[generator] += 1
            self.stats.routed += 1
            self.stats.per_generator[generator] = self.stats.per_generator.get(generator, 0) + 1
            if generator != preferred:
                if self._down_until[preferred] > time.monotonic():
                    self.stats.failed_over += 1
                else:
                    self.stats.spilled += 1
        try:
            yield
        finally:
            with self._lock:
                self._in_flight[generator] -= 1

    def mark_down(self, generator: str) -> None:
        with self._lock:
            self._down_until[generator] = time.monotonic() + self.down_for_s

    def snapshot(self) -> dict[str, object]:
        now = time.monotonic()
        with self._lock:
            return {"in_flight": dict(self._in_flight), "down": [g for g, t in self._down_until.items() if t > now],
                    "routed": self.stats.routed, "spilled": self.stats.spilled, "failed_over": self.stats.failed_over,
                    "per_generator": dict(self.stats.per_generator), "load_factor": self.load_factor}
