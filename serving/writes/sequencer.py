"""Sequence numbers per (shard, version), and the replies of idempotent requests, in one SQLite
file next to the collection (``writes.sqlite``): every gateway of the collection shares it, so
two gateways never hand out the same number. A number is taken (committed, synchronous=FULL)
before its write is sent, so a crashed gateway never reuses one; a number taken but never
written is filled with a no-op by :meth:`WriteService.fill_holes`.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS seqs (shard INTEGER NOT NULL, version TEXT NOT NULL, last INTEGER NOT NULL, "
    "PRIMARY KEY (shard, version))",
    "CREATE TABLE IF NOT EXISTS replies (key TEXT PRIMARY KEY, reply TEXT NOT NULL)",
)


class Sequencer:
    def __init__(self, path: str | Path | None) -> None:
        """``path`` None: in memory (one gateway, tests)."""
        self.path = str(path) if path is not None else ":memory:"
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL" if path is not None else "PRAGMA journal_mode=MEMORY")
        self._db.execute("PRAGMA synchronous=FULL")
        for statement in _SCHEMA:
            self._db.execute(statement)
        self._lock = threading.Lock()

    def take(self, shard: int, version: str, count: int) -> int:
        """Reserve ``count`` consecutive numbers; the first of them."""
        return self.take_many([(shard, version, count)])[0]

    def take_many(self, wanted: list[tuple[int, str, int]]) -> list[int]:
        """Reserve numbers for several (shard, version, count) at once, in one transaction (one
        commit and one fsync for a write that touches every shard); the first number of each."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                firsts = []
                for shard, version, count in wanted:
                    row = self._db.execute("SELECT last FROM seqs WHERE shard = ? AND version = ?",
                                           (shard, version)).fetchone()
                    last = int(row[0]) if row else 0
                    self._db.execute("INSERT OR REPLACE INTO seqs (shard, version, last) VALUES (?, ?, ?)",
                                     (shard, version, last + count))
                    firsts.append(last + 1)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            return firsts

    def last(self, shard: int, version: str) -> int:
        row = self._db.execute("SELECT last FROM seqs WHERE shard = ? AND version = ?", (shard, version)).fetchone()
        return int(row[0]) if row else 0

    def recall(self, key: str) -> dict[str, Any] | None:
        row = self._db.execute("SELECT reply FROM replies WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else None

    def remember(self, key: str, reply: dict[str, Any]) -> None:
        with self._lock:
            self._db.execute("INSERT OR IGNORE INTO replies (key, reply) VALUES (?, ?)", (key, json.dumps(reply)))

    def close(self) -> None:
        self._db.close()
