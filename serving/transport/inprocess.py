"""In-process shard client: the gateway calls loaded shards' version stores directly, behind the
same seam as HTTP — no URL routing, the typed calls go straight to
:class:`~index_shards.versions.ShardVersions`.

For tests, benchmarks (the "no network" baseline) and single-box embedding. Replica names are
``inproc://<name>``; each holds a ShardVersions, so versions can be staged and unloaded as on a
shard server. One of the places ``serving`` imports ``index_shards``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from index_shards.shard import Shard
from index_shards.versions import ShardVersions
from retrieval.contract import HealthInfo, ReplicaInfo, SearchParams, StageReply, UnloadReply
from retrieval.errors import ShardUnavailable
from retrieval.records import decode_records, decode_snapshot, encode_records, encode_snapshot
from serving.transport.client import ShardClient, ShardReply

SCHEME = "inproc://"


class InProcessShardClient(ShardClient):
    def __init__(self, replicas: dict[str, ShardVersions]) -> None:
        self.replicas = replicas

    @classmethod
    def of(cls, shards: list[Shard], *, data_dir: str | Path | None = None
           ) -> tuple[InProcessShardClient, list[list[str]]]:
        """A client over ``shards`` (one replica each) and the replica names per shard id; with
        ``data_dir`` the replicas take writes (their WALs in ``data_dir/shard-<i>``)."""
        names = {f"{SCHEME}shard-{s.manifest.shard_id}": ShardVersions(
            s, device="cpu", data_dir=Path(data_dir) / f"shard-{s.manifest.shard_id}" if data_dir else None)
            for s in shards}
        ordered = sorted(names, key=lambda n: names[n].shard_id)
        return cls(names), [[name] for name in ordered]

    def _replica(self, replica: str, shard_id: int | None = None) -> ShardVersions:
        versions = self.replicas.get(replica)
        if versions is None:
            raise ShardUnavailable(f"no in-process shard {replica!r}", shard=shard_id)
        return versions

    async def search(self, replica: str, shard_id: int, vectors: np.ndarray, params: SearchParams,
                     timeout_s: float) -> ShardReply:
        started = time.perf_counter()
        reply = self._replica(replica, shard_id).search(vectors, params)
        return ShardReply(shard_id, reply.version, replica, reply.results, (time.perf_counter() - started) * 1000.0,
                          reply.took_ms)

    async def info(self, replica: str, timeout_s: float) -> ReplicaInfo:
        return self._replica(replica).info()

    async def health(self, replica: str, timeout_s: float) -> HealthInfo:
        return self._replica(replica).health()

    async def stage(self, replica: str, version: str, timeout_s: float) -> StageReply:
        return self._replica(replica).stage_reply(version)

    async def unload(self, replica: str, version: str, timeout_s: float) -> UnloadReply:
        return self._replica(replica).unload_reply(version)

    async def write(self, replica: str, shard_id: int, version: str, records: bytes, timeout_s: float) -> int:
        return self._replica(replica, shard_id).write(version, decode_records(records))

    async def writes_after(self, replica: str, version: str, after_seq: int, timeout_s: float) -> bytes:
        return encode_records(self._replica(replica).writes_after(version, after_seq))

    async def snapshot(self, replica: str, version: str, timeout_s: float) -> bytes:
        return encode_snapshot(*self._replica(replica).snapshot(version))

    async def restore(self, replica: str, shard_id: int, version: str, snapshot: bytes, timeout_s: float) -> int:
        return self._replica(replica, shard_id).restore(version, *decode_snapshot(snapshot))

    async def matching_ids(self, replica: str, shard_id: int, version: str, filter_canonical: str, limit: int,
                           timeout_s: float) -> list[str]:
        return self._replica(replica, shard_id).matching_ids(version, filter_canonical, limit)

    async def document(self, replica: str, shard_id: int, version: str, doc_id: str,
                       timeout_s: float) -> dict[str, Any] | None:
        live = self._replica(replica, shard_id).get(version)
        stored = live.get(doc_id)
        if stored is None:
            return None
        return {"id": stored.doc_id, "title": stored.title, "text": stored.text, "metadata": stored.metadata,
                "seq": stored.seq, "shard": shard_id, "version": live.version_id, "applied_seq": live.applied_seq}
