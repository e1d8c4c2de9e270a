"""Read-your-writes for a client: the session floors its own writes set.

Every write reply names, per shard it touched, the ``seq`` it got and the primary ``term`` it was
made in. A query that sends them back (``min_seq`` / ``min_term``, ``consistency: session``) is
answered only by replicas that hold those writes, so a client sees what it wrote however many
replicas and gateways there are. :class:`SessionFloors` keeps the highest of each per shard, safe to
share between threads and tasks.

    floors = SessionFloors()
    floors.note(client.upsert(documents))
    client.query(vector=v, **floors.query_args())
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any


class SessionFloors:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seq: dict[str, int] = {}
        self._term: dict[str, int] = {}

    def note(self, reply: Mapping[str, Any]) -> None:
        """Remember a write reply's ``seq`` and ``term`` (per shard; a missing one is skipped)."""
        seqs: Mapping[str, int] = reply.get("seq") or {}
        terms: Mapping[str, int] = reply.get("term") or {}
        with self._lock:
            for shard, seq in seqs.items():
                self._seq[shard] = max(self._seq.get(shard, 0), int(seq))
            for shard, term in terms.items():
                self._term[shard] = max(self._term.get(shard, 0), int(term))

    def query_args(self) -> dict[str, dict[str, int]]:
        """``min_seq`` and ``min_term`` for a client's ``query`` (empty before the first write)."""
        with self._lock:
            if not self._seq:
                return {}
            return {"min_seq": dict(self._seq), "min_term": dict(self._term)}

    def reset(self) -> None:
        """Forget every floor (the collection was dropped and made anew)."""
        with self._lock:
            self._seq.clear()
            self._term.clear()
