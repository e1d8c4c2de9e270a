"""In-process shard client: the gateway calls loaded shards' version stores directly, behind the
same seam as HTTP — no URL routing, the typed calls go straight to
:class:`~index_shards.versions.ShardVersions`.

For tests, benchmarks (the "no network" baseline) and single-box embedding. Replica names are
``inproc://<name>``; each is a replica's role over its ShardVersions (``index_shards.role``), so
versions can be staged and unloaded and writes go through the same primary path as on a shard
server (a replica given as a bare ShardVersions is the only replica of its shard, its own
primary). One of the places ``serving`` imports ``index_shards``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from index_shards import live_tuning, snapshots
from index_shards.peers import LocalPeers
from index_shards.primary import decode_unsequenced
from index_shards.role import ShardRole
from index_shards.shard import Shard
from index_shards.versions import ShardVersions
from index_shards.writes import writes_after
from retrieval.bm25 import LexicalQuery
from retrieval.contract import HealthInfo, ReplicaInfo, SearchParams, StageReply, UnloadReply, WriteReply
from retrieval.errors import ShardUnavailable
from retrieval.records import ScanPage, encode_records
from serving.transport.client import ShardClient, ShardReply

SCHEME = "inproc://"


class InProcessShardClient(ShardClient):
    def __init__(self, replicas: Mapping[str, ShardVersions | ShardRole], *,
                 resolve: Callable[[str], ShardRole | None] | None = None) -> None:
        """``resolve``: a replica name this client was not given → its role (an in-process node's
        replicas come and go with the collections placed on it), or None."""
        self.resolve = resolve
        self.roles: dict[str, ShardRole] = {}
        for name, replica in replicas.items():
            if isinstance(replica, ShardVersions):
                replica = ShardRole(replica, name, None, LocalPeers()).start()
            self.roles[name] = replica
        self.replicas = {name: role.versions for name, role in self.roles.items()}

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
        return self._role(replica, shard_id).versions

    def _role(self, replica: str, shard_id: int | None = None) -> ShardRole:
        role = self.roles.get(replica)
        if role is None and self.resolve is not None:
            role = self.resolve(replica)
        if role is None:
            raise ShardUnavailable(f"no in-process shard {replica!r}", shard=shard_id)
        return role

    async def search(self, replica: str, shard_id: int, vectors: np.ndarray, params: SearchParams,
                     timeout_s: float, *, lexical: Sequence[LexicalQuery] = ()) -> ShardReply:
        started = time.perf_counter()
        reply = self._replica(replica, shard_id).search(vectors, params, list(lexical))
        return ShardReply(shard_id, reply.version, replica, reply.results, (time.perf_counter() - started) * 1000.0,
                          reply.took_ms, reply.stats, reply.dense)

    async def info(self, replica: str, timeout_s: float) -> ReplicaInfo:
        return self._replica(replica).info()

    async def health(self, replica: str, timeout_s: float) -> HealthInfo:
        return self._replica(replica).health()

    async def stage(self, replica: str, version: str, timeout_s: float) -> StageReply:
        return self._replica(replica).stage_reply(version)

    async def unload(self, replica: str, version: str, timeout_s: float) -> UnloadReply:
        return self._replica(replica).unload_reply(version)

    async def primary_write(self, replica: str, shard_id: int, version: str, records: bytes, ack: str,
                            generation: int, timeout_s: float) -> WriteReply:
        writer = self._role(replica, shard_id).writer
        # the primary holds a thread lock across its fsync: off the event loop, as on a shard server
        return await asyncio.to_thread(writer.write, version, decode_unsequenced(records), ack, generation)

    async def writes_after(self, replica: str, version: str, after_seq: int, timeout_s: float) -> bytes:
        return encode_records(writes_after(self._replica(replica), version, after_seq))

    async def snapshot(self, replica: str, version: str, timeout_s: float) -> bytes:
        return snapshots.take(self._replica(replica), version).encode()

    async def fence(self, replica: str, generation: int, hold_s: float, timeout_s: float) -> dict[str, Any]:
        return await asyncio.to_thread(self._role(replica).writer.fence, generation, hold_s)

    async def tune_sample(self, replica: str, version: str, count: int, seed: int, timeout_s: float) -> bytes:
        return await asyncio.to_thread(live_tuning.sample, self._replica(replica), version, count, seed)

    async def tune_evaluate(self, replica: str, version: str, queries: bytes, k: int, max_value: int | None,
                            timeout_s: float) -> bytes:
        return await asyncio.to_thread(live_tuning.evaluate, self._replica(replica), version, queries, k, max_value)

    async def set_search_defaults(self, replica: str, version: str, defaults: dict[str, Any],
                                  timeout_s: float) -> dict[str, Any]:
        return await asyncio.to_thread(live_tuning.set_defaults, self._replica(replica), version, defaults)

    async def matching_ids(self, replica: str, shard_id: int, version: str, filter_canonical: str, limit: int,
                           timeout_s: float) -> list[str]:
        return self._replica(replica, shard_id).matching_ids(version, filter_canonical, limit)

    async def scan(self, replica: str, shard_id: int, version: str, filter_canonical: str, after: str, limit: int,
                   timeout_s: float) -> ScanPage:
        return await asyncio.to_thread(self._replica(replica, shard_id).scan, version, filter_canonical, after, limit)

    async def document(self, replica: str, shard_id: int, version: str, doc_id: str,
                       timeout_s: float) -> dict[str, Any] | None:
        return self._replica(replica, shard_id).document(version, doc_id)

    async def close(self) -> None:
        for role in self.roles.values():
            role.stop()
            role.versions.close()
