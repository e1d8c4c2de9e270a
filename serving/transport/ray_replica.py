"""The Ray backend's actor: one replica of one shard (``ShardReplica``), and the peer protocol
between replica actors (``RayPeers``), so a shard's primary replicates to its replicas through
Ray as a shard server does over HTTP. ``serving.transport.ray`` launches these actors and reaches
them with its ``RayShardClient``.

This module is one of the places ``serving`` imports ``index_shards`` (the actor holds a shard).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from index_shards.peers import PeerClient
from retrieval.bm25 import LexicalQuery
from retrieval.contract import (
    HealthInfo,
    ReplicaInfo,
    SearchParams,
    SearchReply,
    StageReply,
    UnloadReply,
    WriteReply,
)
from retrieval.errors import ConfigError, DeadlineExceeded, ShardragError, ShardUnavailable
from retrieval.records import Snapshot, decode_records, encode_records

SCHEME = "ray://"


class ShardReplica:
    """The actor's body: one replica of one shard slot (all versions it holds) and its role in the
    shard's write ordering. With a data dir it takes writes; with a coordinator (the cluster state)
    its shard's replicas elect a primary that replicates to the others through their actors
    (:class:`RayPeers`); without one it is its shard's only replica."""

    def __init__(self, directory: str, device: str = "auto", max_versions: int = 2, faiss_threads: int = 1,
                 data_dir: str | None = None, name: str = "", coordinator: str | None = None,
                 namespace: str | None = None, lease_s: float = 3.0, replication: int = 0) -> None:
        """``name``: the actor's ``ray://`` name, which peers reach it by; its id in the shard's
        in-sync set is its data dir's name, the same as the process backend's replica there."""
        import faiss

        from index_shards.role import ShardRole
        from index_shards.shard import Shard
        from index_shards.versions import ShardVersions

        faiss.omp_set_num_threads(max(1, faiss_threads))
        self.versions = ShardVersions(Shard.load(directory, device=device), max_versions=max_versions, device=device,
                                      data_dir=data_dir)
        state = None
        if coordinator:
            from clusterstate import open_coordinator
            from clusterstate.state import ClusterState

            state = ClusterState(open_coordinator(coordinator), self.versions.collection)
        replica_id = Path(data_dir).name if data_dir else name
        self.role = ShardRole(self.versions, replica_id, state, RayPeers(namespace), url=name, replication=replication,
                              lease_s=lease_s).start(name)

    @classmethod
    def over(cls, versions: Any, role: Any) -> ShardReplica:
        """The same calls over a replica someone else opened (one a Ray node actor hosts)."""
        replica = cls.__new__(cls)
        replica.versions, replica.role = versions, role
        return replica

    def ready(self) -> dict[str, Any]:
        import ray

        return {"shard_id": self.versions.shard_id, "versions": self.versions.ready_ids(),
                "node_ip": ray.util.get_node_ip_address()}

    def search(self, vectors: np.ndarray, params: SearchParams,
               lexical: list[LexicalQuery] | None = None) -> SearchReply:
        return self.versions.search(vectors, params, lexical or [])

    def info(self) -> ReplicaInfo:
        return self.versions.info()

    def health(self) -> HealthInfo:
        return self.versions.health()

    def stage(self, version: str) -> StageReply:
        return self.versions.stage_reply(version)

    def unload(self, version: str) -> UnloadReply:
        return self.versions.unload_reply(version)

    def primary_write(self, version: str, records: bytes, ack: str, generation: int) -> WriteReply:
        from index_shards.primary import decode_unsequenced

        return self.role.writer.write(version, decode_unsequenced(records), ack, generation)

    def replicate(self, version: str, term: int, prev: tuple[int, int, int] | None, payload: bytes) -> int:
        from index_shards.replica_log import Mark
        from index_shards.writes import accept

        return accept(self.versions, version, term, Mark(*prev) if prev else None, decode_records(payload))

    def writes_after(self, version: str, after_seq: int) -> bytes:
        from index_shards.writes import writes_after

        return encode_records(writes_after(self.versions, version, after_seq))

    def snapshot(self, version: str) -> bytes:
        from index_shards import snapshots

        return snapshots.take(self.versions, version).encode()

    def restore(self, version: str, term: int, snapshot: bytes, force: bool) -> int:
        from index_shards import snapshots

        return snapshots.restore_from(self.versions, version, term, Snapshot.decode(snapshot), force=force)

    def fence(self, generation: int, hold_s: float) -> dict[str, Any]:
        return self.role.writer.fence(generation, hold_s)

    def tune_sample(self, version: str, count: int, seed: int) -> bytes:
        from index_shards import live_tuning

        return live_tuning.sample(self.versions, version, count, seed)

    def tune_evaluate(self, version: str, queries: bytes, k: int, max_value: int | None) -> bytes:
        from index_shards import live_tuning

        return live_tuning.evaluate(self.versions, version, queries, k, max_value)

    def set_search_defaults(self, version: str, defaults: dict[str, Any]) -> dict[str, Any]:
        from index_shards import live_tuning

        return live_tuning.set_defaults(self.versions, version, defaults)

    def matching_ids(self, version: str, filter_canonical: str, limit: int) -> list[str]:
        return self.versions.matching_ids(version, filter_canonical, limit)

    def document(self, version: str, doc_id: str) -> dict[str, Any] | None:
        return self.versions.document(version, doc_id)

    def scan(self, version: str, filter_canonical: str, after: str, limit: int) -> bytes:
        return self.versions.scan(version, filter_canonical, after, limit).encode()


class RayPeers(PeerClient):
    """The peer protocol between replica actors (``index_shards.peers``): calls to the other
    replicas' actors by name, from the primary's replication threads."""

    def __init__(self, namespace: str | None) -> None:
        self.namespace = namespace
        self._handles: dict[str, Any] = {}

    def _call(self, peer: str, method: str, timeout_s: float, *args: Any) -> Any:
        ray = _ray()
        handle = self._handles.get(peer)
        if handle is None:
            handle = self._handles[peer] = actor_for(peer, self.namespace)
        try:
            return ray.get(getattr(handle, method).remote(*args), timeout=timeout_s)
        except ray.exceptions.GetTimeoutError as exc:
            raise DeadlineExceeded(f"{peer} did not answer {method} in {timeout_s:.1f} s") from exc
        except (ray.exceptions.RayError, ray.exceptions.RayActorError) as exc:
            raise _unwrap(exc, f"{peer} {method}", None) from exc

    def replicate(self, peer: str, version: str, term: int, prev: Any, payload: bytes, timeout_s: float) -> int:
        args = (prev.seq, prev.term, prev.checksum) if prev is not None else None
        return int(self._call(peer, "replicate", timeout_s, version, term, args, payload))

    def info(self, peer: str, timeout_s: float) -> ReplicaInfo:
        info: ReplicaInfo = self._call(peer, "info", timeout_s)
        return info

    def snapshot(self, peer: str, version: str, timeout_s: float) -> Snapshot:
        return Snapshot.decode(self._call(peer, "snapshot", timeout_s, version))

    def restore(self, peer: str, version: str, term: int, snapshot: Snapshot, force: bool, timeout_s: float) -> int:
        return int(self._call(peer, "restore", timeout_s, version, term, snapshot.encode(), force))


def actor_for(replica: str, namespace: str | None, shard_id: int | None = None) -> Any:
    """The handle a replica's calls go to: ``ray://<actor>`` is a replica actor;
    ``ray://<actor>/c/<collection>/<shard>`` is a replica that node actor hosts, called the same way
    (``handle.search.remote(...)``) through :class:`NodeTarget`."""
    if not replica.startswith(SCHEME):
        raise ShardUnavailable(f"{replica!r} is not a Ray replica ({SCHEME}<actor>)", shard=shard_id)
    name, _, hosted = replica[len(SCHEME):].partition("/")
    try:
        handle = _ray().get_actor(name, namespace=namespace)
    except ValueError as exc:
        raise ShardUnavailable(f"no Ray actor {name!r}", shard=shard_id) from exc
    if not hosted:
        return handle
    prefix, collection, shard = (hosted.split("/") + ["", ""])[:3]
    if prefix != "c" or not collection or not shard.isdigit():
        raise ShardUnavailable(f"{replica!r} names no replica (ray://<node actor>/c/<collection>/<shard>)",
                               shard=shard_id)
    return NodeTarget(handle, collection, int(shard))


class NodeTarget:
    """One replica a node actor hosts, with a replica actor's call shape: ``target.search.remote(
    *args)`` is ``node.call.remote(collection, shard, "search", *args)``."""

    def __init__(self, node: Any, collection: str, shard_id: int) -> None:
        self.node, self.collection, self.shard_id = node, collection, shard_id

    def __getattr__(self, method: str) -> Any:
        node, collection, shard_id = self.node, self.collection, self.shard_id

        class _Method:
            @staticmethod
            def remote(*args: Any) -> Any:
                return node.call.remote(collection, shard_id, method, *args)

        return _Method


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:  # pragma: no cover - ray is in the dev and ray extras
        raise ConfigError("the Ray backend needs `pip install 'shardrag[ray]'`", field="backend") from exc
    return ray


def _unwrap(exc: BaseException, where: str, shard_id: int | None) -> Exception:
    """Ray's errors → the gateway's: a shard's own error passes through, a dead or restarting
    actor is an unavailable replica (the balancer ejects it and fails over)."""
    ray = _ray()
    if isinstance(exc, ray.exceptions.RayTaskError):
        cause = getattr(exc, "cause", None)
        if isinstance(cause, ShardragError):
            return cause
        return ShardUnavailable(f"{where} failed: {cause or exc}", shard=shard_id)
    return ShardUnavailable(f"{where} unavailable: {type(exc).__name__}", shard=shard_id)


