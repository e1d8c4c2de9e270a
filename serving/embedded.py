"""In-process transport: the gateway calls loaded shards directly, same seam as HTTP.

For tests, benchmarks (the "no network" baseline) and single-box embedding. Replica names are
``inproc://<name>``. This module is one of the two places ``serving`` imports ``index_shards``.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from retrieval.errors import ShardUnavailable, VersionConflict

from index_shards.shard import Shard
from serving.transport import SearchParams, ShardReply, ShardTransport


class InProcessTransport(ShardTransport):
    def __init__(self, shards: dict[str, Shard]) -> None:
        self._shards = shards

    @classmethod
    def of(cls, shards: list[Shard]) -> tuple[InProcessTransport, list[list[str]]]:
        """A transport over ``shards`` (one replica each) and the replica names per shard id."""
        names = {f"inproc://shard-{s.manifest.shard_id}": s for s in shards}
        return cls(names), [[name] for name in sorted(names, key=lambda n: names[n].manifest.shard_id)]

    def _shard(self, replica: str, shard_id: int) -> Shard:
        shard = self._shards.get(replica)
        if shard is None:
            raise ShardUnavailable(f"no in-process shard {replica!r}", shard=shard_id)
        return shard

    async def search(
        self, replica: str, shard_id: int, vectors: np.ndarray, params: SearchParams, timeout_s: float
    ) -> ShardReply:
        started = time.perf_counter()
        shard = self._shard(replica, shard_id)
        if params.version != shard.version_id:
            raise VersionConflict(f"shard {shard_id} holds {shard.version_id!r}, not {params.version!r}",
                                  field="version", shard=shard_id)
        hits = shard.search(np.asarray(vectors, dtype=np.float32), params.k, nprobe=params.nprobe,
                            ef_search=params.ef_search, with_text=params.with_text)
        return ShardReply(shard_id, shard.version_id, replica, [h.to_dict() for h in hits],
                          (time.perf_counter() - started) * 1000.0)

    async def get_json(self, replica: str, path: str, timeout_s: float) -> dict[str, Any]:
        shard = self._shard(replica, -1)
        if path == "/v1/info":
            return shard.info()
        if path == "/healthz":
            return {"status": "ok", "shard_id": shard.manifest.shard_id, "version": shard.version_id}
        raise ShardUnavailable(f"in-process shard has no {path}")
