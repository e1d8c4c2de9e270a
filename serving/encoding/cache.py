"""The query-embedding LRU: (version, text) → vector. Popular questions recur (dashboards,
retries, the same FAQ asked by many users); a hit skips the encoder, a forward pass that costs
more than the whole fan-out. Keyed by version so a rollout never serves V's vector to V+1."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np


class EmbeddingLRU:
    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError("capacity must be >= 0")
        self.capacity = capacity
        self._entries: OrderedDict[tuple[str, str], np.ndarray] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, version: str, text: str) -> np.ndarray | None:
        if not self.capacity:
            return None
        vector = self._entries.get((version, text))
        if vector is None:
            self.misses += 1
            return None
        self._entries.move_to_end((version, text))
        self.hits += 1
        return vector

    def peek(self, version: str, text: str) -> np.ndarray | None:
        """The entry, if held, without counting a hit or a miss or refreshing it."""
        return self._entries.get((version, text)) if self.capacity else None

    def put(self, version: str, text: str, vector: np.ndarray) -> None:
        if not self.capacity:
            return
        vector.flags.writeable = False  # shared by every query that hits it
        self._entries[(version, text)] = vector
        self._entries.move_to_end((version, text))
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def drop_version(self, version: str) -> None:
        for key in [k for k in self._entries if k[0] == version]:
            del self._entries[key]

    def stats(self) -> dict[str, int]:
        return {"entries": len(self._entries), "capacity": self.capacity, "hits": self.hits, "misses": self.misses}
