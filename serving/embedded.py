"""In-process transport: the gateway calls loaded shards directly, same seam as HTTP.

For tests, benchmarks (the "no network" baseline) and single-box embedding. Replica names are
``inproc://<name>``; each holds a :class:`~index_shards.versions.ShardVersions`, so versions
can be staged and unloaded as on a shard server. This module is one of the places ``serving``
imports ``index_shards``.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from retrieval.errors import InvalidRequest, NotFound, ShardUnavailable

from index_shards.shard import Shard
from index_shards.versions import ShardVersions
from serving.transport import SearchParams, ShardReply, ShardTransport


class InProcessTransport(ShardTransport):
    def __init__(self, replicas: dict[str, ShardVersions]) -> None:
        self._replicas = replicas

    @classmethod
    def of(cls, shards: list[Shard]) -> tuple[InProcessTransport, list[list[str]]]:
        """A transport over ``shards`` (one replica each) and the replica names per shard id."""
        names = {f"inproc://shard-{s.manifest.shard_id}": ShardVersions(s, device="cpu") for s in shards}
        ordered = sorted(names, key=lambda n: names[n].shard_id)
        return cls(names), [[name] for name in ordered]

    def _replica(self, replica: str, shard_id: int) -> ShardVersions:
        versions = self._replicas.get(replica)
        if versions is None:
            raise ShardUnavailable(f"no in-process shard {replica!r}", shard=shard_id)
        return versions

    async def search(
        self, replica: str, shard_id: int, vectors: np.ndarray, params: SearchParams, timeout_s: float
    ) -> ShardReply:
        started = time.perf_counter()
        version, results = search_versions(self._replica(replica, shard_id), vectors, params)
        return ShardReply(shard_id, version, replica, results, (time.perf_counter() - started) * 1000.0)

    async def request_json(self, replica: str, method: str, path: str, body: dict[str, Any] | None,
                           timeout_s: float) -> dict[str, Any]:
        return control_request(self._replica(replica, -1), method, path, body)


def search_versions(versions: ShardVersions, vectors: np.ndarray, params: SearchParams) -> tuple[str, list[dict]]:
    """One search against the version named in ``params`` (409 when this replica does not hold it)."""
    shard = versions.get(params.version)
    hits = shard.search(np.asarray(vectors, dtype=np.float32), params.k, nprobe=params.nprobe,
                        ef_search=params.ef_search, with_text=params.with_text)
    return shard.version_id, [h.to_dict() for h in hits]


def control_request(versions: ShardVersions, method: str, path: str, body: dict[str, Any] | None) -> dict[str, Any]:
    """The shard server's control API (info, health, version load/unload) without HTTP: the
    in-process and Ray transports answer the gateway's control calls with this."""
    if (method, path) == ("GET", "/v1/info"):
        return versions.info()
    if (method, path) == ("GET", "/healthz"):
        return {"status": "ok", "shard_id": versions.shard_id, "versions": versions.ready_ids()}
    if (method, path) == ("POST", "/admin/versions"):
        version = (body or {}).get("version")
        if not isinstance(version, str):
            raise InvalidRequest("give the version id to load", field="version")
        return {"version": versions.stage(version).describe(), "versions": versions.describe()}
    if method == "DELETE" and path.startswith("/admin/versions/"):
        return {"unloaded": versions.unload(path.rsplit("/", 1)[1]), "versions": versions.describe()}
    raise NotFound(f"shard replica has no {method} {path}")
