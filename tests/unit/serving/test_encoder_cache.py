"""The query-embedding LRU keyed by (version, text)."""

from __future__ import annotations

import numpy as np

from serving.encoding.cache import EmbeddingLRU


def test_repeated_texts_come_from_the_cache_per_version() -> None:
    """The LRU on its own (no worker): hits, eviction, read-only vectors, dropped with the version."""
    cache = EmbeddingLRU(2)
    cache.put("v1", "a", np.ones(3, dtype=np.float32))
    cache.put("v1", "b", np.zeros(3, dtype=np.float32))
    assert cache.get("v2", "a") is None  # another version never gets v1's vector
    vector = cache.get("v1", "a")
    assert vector is not None and not vector.flags.writeable
    cache.put("v2", "c", np.ones(3, dtype=np.float32))  # evicts the least recently used: ("v1", "b")
    assert cache.get("v1", "b") is None and cache.get("v1", "a") is not None
    cache.drop_version("v1")
    assert len(cache) == 1 and cache.stats()["hits"] == 2
