"""A byte-budgeted block pool with LRU eviction, leaves first.

Used twice: in each generator process (the local tier) and in each kv-node (the remote tier).
A block whose child is cached is never evicted before that child — a cached child without its
parent is unreachable, since lookups walk the chain from the root — so eviction takes the least
recently used block among the leaves. Thread-safe (the generator's write-back runs in a thread).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass


@dataclass(slots=True)
class _Entry:
    payload: bytes
    parent: bytes | None
    children: int = 0


class BlockPool:
    def __init__(self, budget_bytes: int) -> None:
        if budget_bytes < 0:
            raise ValueError("budget_bytes must be ≥ 0")
        self.budget_bytes = budget_bytes
        self.used_bytes = 0
        self.evictions = 0
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: bytes) -> bool:
        return key in self._entries

    def get(self, key: bytes) -> bytes | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry.payload

    def prefix(self, keys: list[bytes]) -> list[bytes]:
        """Payloads of the longest run of ``keys`` held, from the first one."""
        found = []
        with self._lock:
            for key in keys:
                entry = self._entries.get(key)
                if entry is None:
                    break
                self._entries.move_to_end(key)
                found.append(entry.payload)
        return found

    def put(self, key: bytes, payload: bytes, parent: bytes | None) -> bool:
        """Store a block (its parent key, or None for a first block). False if it cannot fit."""
        size = len(payload)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                if entry.payload != payload:  # a recomputed block replaces a damaged one
                    self.used_bytes += size - len(entry.payload)
                    entry.payload = payload
                return True
            if size > self.budget_bytes:
                return False
            while self.used_bytes + size > self.budget_bytes:
                if not self._evict_one():
                    return False
            self._entries[key] = _Entry(payload, parent)
            self.used_bytes += size
            if parent is not None and parent in self._entries:
                self._entries[parent].children += 1
            return True

    def _evict_one(self) -> bool:
        for key, entry in self._entries.items():  # oldest first
            if entry.children == 0:
                del self._entries[key]
                self.used_bytes -= len(entry.payload)
                self.evictions += 1
                if entry.parent is not None and entry.parent in self._entries:
                    self._entries[entry.parent].children -= 1
                return True
        return False

    def stats(self) -> dict[str, int]:
        return {"blocks": len(self._entries), "used_bytes": self.used_bytes, "budget_bytes": self.budget_bytes,
                "evictions": self.evictions}
