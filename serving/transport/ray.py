"""Ray backend: shard replicas as Ray actors, reached through :class:`RayShardClient`.

The client sits behind the same seam as the HTTP client (:class:`~serving.transport.client.ShardClient`),
so the gateway's balancer, hedging, ejection, batching and version checks are the same code; only
the wire differs (Ray's object transfer instead of HTTP), and the typed calls go straight to the
actor's version store. Each replica is a named, detached-free
actor ``shardrag:<collection>:<shard>:<replica>`` that loads its shard directory (checksums
verified) into a :class:`~index_shards.versions.ShardVersions`, so embedding-version rollouts
work as over HTTP. Actors restart on failure (``max_restarts``) — Ray is the supervisor — and
take a GPU when the cluster has them (FAISS moves the index there when it can).

    cluster = RayShardCluster(root, "docs", replicas=2).start()   # ray.init() or an address
    app = create_app(GatewaySetup(GatewayConfig(), cluster.replica_names, shard_client=cluster.client()))

This module is one of the places ``serving`` imports ``index_shards`` (to launch shards).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from index_shards.layout import local_cluster_state, nodes_dir, replica_data_dir, resolve_version, shard_dir
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
from retrieval.errors import ConfigError, DeadlineExceeded
from retrieval.records import ScanPage
from serving.transport.client import ShardClient, ShardReply
from serving.transport.ray_node import NodeReplicas
from serving.transport.ray_replica import SCHEME, ShardReplica, _ray, _unwrap, actor_for

logger = logging.getLogger(__name__)

class RayShardClient(ShardClient):
    """Replica names are ``ray://<actor name>``; actor handles are looked up once and cached."""

    def __init__(self, namespace: str | None = None) -> None:
        self.namespace = namespace
        self._handles: dict[str, Any] = {}

    def _handle(self, replica: str, shard_id: int | None = None) -> Any:
        handle = self._handles.get(replica)
        if handle is None:
            handle = self._handles[replica] = actor_for(replica, self.namespace, shard_id)
        return handle

    async def _call(self, ref: Any, where: str, shard_id: int | None, timeout_s: float) -> Any:
        ray = _ray()
        try:
            return await asyncio.wait_for(ref, timeout=max(timeout_s, 0.001))
        except TimeoutError as exc:
            raise DeadlineExceeded(f"{where} did not answer in {timeout_s:.3f}s", shard=shard_id) from exc
        except (ray.exceptions.RayError, ray.exceptions.RayActorError) as exc:
            raise _unwrap(exc, where, shard_id) from exc

    async def search(self, replica: str, shard_id: int, vectors: np.ndarray, params: SearchParams,
                     timeout_s: float, *, lexical: Sequence[LexicalQuery] = ()) -> ShardReply:
        started = time.perf_counter()
        ref = self._handle(replica, shard_id).search.remote(np.ascontiguousarray(vectors, dtype=np.float32), params,
                                                             list(lexical))
        reply: SearchReply = await self._call(ref, f"shard {shard_id} ({replica})", shard_id, timeout_s)
        return ShardReply(shard_id, reply.version, replica, reply.results, (time.perf_counter() - started) * 1000.0,
                          reply.took_ms, reply.stats, reply.dense)

    async def info(self, replica: str, timeout_s: float) -> ReplicaInfo:
        info: ReplicaInfo = await self._call(self._handle(replica).info.remote(), f"{replica} info", None, timeout_s)
        return info

    async def health(self, replica: str, timeout_s: float) -> HealthInfo:
        health: HealthInfo = await self._call(self._handle(replica).health.remote(), f"{replica} health", None,
                                              timeout_s)
        return health

    async def stage(self, replica: str, version: str, timeout_s: float) -> StageReply:
        reply: StageReply = await self._call(self._handle(replica).stage.remote(version), f"{replica} stage", None,
                                             timeout_s)
        return reply

    async def primary_write(self, replica: str, shard_id: int, version: str, records: bytes, ack: str,
                            generation: int, timeout_s: float) -> WriteReply:
        ref = self._handle(replica, shard_id).primary_write.remote(version, records, ack, generation)
        reply: WriteReply = await self._call(ref, f"shard {shard_id} ({replica}) write", shard_id, timeout_s)
        return reply

    async def snapshot(self, replica: str, version: str, timeout_s: float) -> bytes:
        data: bytes = await self._call(self._handle(replica).snapshot.remote(version), f"{replica} snapshot", None,
                                       timeout_s)
        return data

    async def fence(self, replica: str, generation: int, hold_s: float, timeout_s: float) -> dict[str, Any]:
        answer: dict[str, Any] = await self._call(self._handle(replica).fence.remote(generation, hold_s),
                                                  f"{replica} fence", None, timeout_s)
        return answer

    async def tune_sample(self, replica: str, version: str, count: int, seed: int, timeout_s: float) -> bytes:
        data: bytes = await self._call(self._handle(replica).tune_sample.remote(version, count, seed),
                                       f"{replica} tune sample", None, timeout_s)
        return data

    async def tune_evaluate(self, replica: str, version: str, queries: bytes, k: int, max_value: int | None,
                            timeout_s: float) -> bytes:
        data: bytes = await self._call(self._handle(replica).tune_evaluate.remote(version, queries, k, max_value),
                                       f"{replica} tune evaluate", None, timeout_s)
        return data

    async def set_search_defaults(self, replica: str, version: str, defaults: dict[str, Any],
                                  timeout_s: float) -> dict[str, Any]:
        answer: dict[str, Any] = await self._call(self._handle(replica).set_search_defaults.remote(version, defaults),
                                                  f"{replica} search defaults", None, timeout_s)
        return answer

    async def writes_after(self, replica: str, version: str, after_seq: int, timeout_s: float) -> bytes:
        records: bytes = await self._call(self._handle(replica).writes_after.remote(version, after_seq),
                                          f"{replica} writes", None, timeout_s)
        return records

    async def matching_ids(self, replica: str, shard_id: int, version: str, filter_canonical: str, limit: int,
                           timeout_s: float) -> list[str]:
        ref = self._handle(replica, shard_id).matching_ids.remote(version, filter_canonical, limit)
        ids: list[str] = await self._call(ref, f"shard {shard_id} ({replica}) ids", shard_id, timeout_s)
        return ids

    async def scan(self, replica: str, shard_id: int, version: str, filter_canonical: str, after: str, limit: int,
                   timeout_s: float) -> ScanPage:
        ref = self._handle(replica, shard_id).scan.remote(version, filter_canonical, after, limit)
        page: bytes = await self._call(ref, f"shard {shard_id} ({replica}) scan", shard_id, timeout_s)
        return ScanPage.decode(page)

    async def document(self, replica: str, shard_id: int, version: str, doc_id: str,
                       timeout_s: float) -> dict[str, Any] | None:
        ref = self._handle(replica, shard_id).document.remote(version, doc_id)
        found: dict[str, Any] | None = await self._call(ref, f"shard {shard_id} ({replica}) document", shard_id,
                                                        timeout_s)
        return found

    async def unload(self, replica: str, version: str, timeout_s: float) -> UnloadReply:
        reply: UnloadReply = await self._call(self._handle(replica).unload.remote(version), f"{replica} unload",
                                              None, timeout_s)
        return reply


class RayShardCluster:
    """N shards × R replica actors on a local Ray (``ray.init()``) or an existing cluster."""

    def __init__(self, root: str | Path, collection: str, *, version: str | None = None, replicas: int = 2,
                 address: str | None = None, namespace: str = "shardrag", cpus_per_replica: float = 0.25,
                 gpus_per_replica: float | None = None, max_restarts: int = 3, faiss_threads: int = 1,
                 max_versions: int = 2, ray_init: dict[str, Any] | None = None, coordinator: str | None = None,
                 writable: bool = True, lease_s: float = 3.0, nodes: int = 0) -> None:
        """``coordinator``: the cluster state the replicas of a shard elect their primary through
        (default: the local coordinator file with the collection, which every actor on this machine
        shares; give etcd://... when actors run on several hosts). ``writable``: each replica keeps
        a data dir (``<collection>/replicas/shard-<i>-r<j>`` on the node it runs on) and takes writes.
        ``nodes``: node actors (``serving.transport.ray_node``) that host the collections created at
        run time, each with its files under ``<collection>/nodes/node-<i>`` as a process node's."""
        if nodes < 0:
            raise ConfigError("nodes must be ≥ 0", field="nodes")
        if replicas < 1:
            raise ConfigError("replicas must be ≥ 1", field="replicas")
        self.root = Path(root)
        self.version_dir, self.manifest = resolve_version(root, collection, version)
        self.coordinator = coordinator
        self.writable = writable
        self.lease_s = lease_s
        self.collection = collection
        self.replicas = replicas
        self.address = address
        self.namespace = namespace
        self.cpus_per_replica = cpus_per_replica
        self.gpus_per_replica = gpus_per_replica
        self.max_restarts = max_restarts
        self.faiss_threads = faiss_threads
        self.max_versions = max_versions
        self.ray_init = ray_init or {}
        self.node_count = nodes
        self.node_actors: list[Any] = []
        self.actors: list[list[Any]] = []
        self.nodes: list[list[str]] = []  # shard → the node address each replica actor runs on
        self.placement_groups: list[Any] = []
        self._started_ray = False

    def actor_name(self, shard_id: int, replica: int) -> str:
        return f"shardrag:{self.collection}:{shard_id}:{replica}"

    def node_actor_name(self, index: int) -> str:
        return f"shardrag:{self.collection}:node-{index}"

    @property
    def replica_names(self) -> tuple[tuple[str, ...], ...]:
        return tuple(tuple(f"{SCHEME}{self.actor_name(s, r)}" for r in range(self.replicas))
                     for s in range(self.manifest.num_shards))

    def start(self, ready_timeout_s: float = 300.0) -> RayShardCluster:
        ray = _ray()
        if not ray.is_initialized():
            ray.init(address=self.address, namespace=self.namespace, include_dashboard=False,
                     log_to_driver=False, **self.ray_init)
            self._started_ray = True
        gpus = self.gpus_per_replica
        if gpus is None:  # a GPU per replica when the cluster has enough of them, else none
            total = ray.cluster_resources().get("GPU", 0)
            gpus = 1.0 if total >= self.manifest.num_shards * self.replicas else 0.0
        actor_class = ray.remote(ShardReplica)
        pending = []
        for shard_id in range(self.manifest.num_shards):
            group = []
            spread = self._spread(ray, gpus)
            for replica in range(self.replicas):
                actor = actor_class.options(
                    name=self.actor_name(shard_id, replica), namespace=self.namespace, num_cpus=self.cpus_per_replica,
                    num_gpus=gpus, max_restarts=self.max_restarts, max_task_retries=0, max_concurrency=4,
                    get_if_exists=False, scheduling_strategy=spread(replica),
                ).remote(str(shard_dir(self.version_dir, shard_id)), "auto" if gpus else "cpu", self.max_versions,
                         self.faiss_threads, self._data_dir(shard_id, replica),
                         f"{SCHEME}{self.actor_name(shard_id, replica)}", self._coordinator(), self.namespace,
                         self.lease_s, self.replicas)
                group.append(actor)
                pending.append(actor.ready.remote())
            self.actors.append(group)
        node_class = ray.remote(NodeReplicas)
        for index in range(self.node_count):
            name = self.node_actor_name(index)
            node = node_class.options(
                name=name, namespace=self.namespace, num_cpus=self.cpus_per_replica, max_restarts=self.max_restarts,
                max_task_retries=0, max_concurrency=8, get_if_exists=False, scheduling_strategy="SPREAD",
            ).remote(self.state_coordinator(), f"node-{index}",
                     str(nodes_dir(self.root, self.manifest.collection) / f"node-{index}"), f"{SCHEME}{name}",
                     self.namespace, self.faiss_threads, self.lease_s, "auto" if gpus else "cpu")
            self.node_actors.append(node)
        try:
            ready = ray.get(pending + [node.ready.remote() for node in self.node_actors], timeout=ready_timeout_s)
        except Exception:
            self.stop()
            raise
        self.nodes = [[str(r.get("node_ip")) for r in ready[s * self.replicas:(s + 1) * self.replicas]]
                      for s in range(self.manifest.num_shards)]
        logger.info("%d shard replica actors ready (%s GPU each)", len(pending), gpus)
        return self

    def _spread(self, ray: Any, gpus: float) -> Any:
        """Where replica i of the next shard goes: with at least as many live nodes as replicas, a
        placement group of one bundle per replica on distinct nodes (STRICT_SPREAD: losing a node
        costs each shard one replica at most); else Ray's best-effort SPREAD."""
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        if len(nodes) < max(2, self.replicas):
            return lambda replica: "SPREAD"
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        bundle = {"CPU": self.cpus_per_replica, **({"GPU": gpus} if gpus else {})}
        group = ray.util.placement_group([dict(bundle) for _ in range(self.replicas)], strategy="STRICT_SPREAD")
        self.placement_groups.append(group)
        return lambda replica: PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=replica)

    def _data_dir(self, shard_id: int, replica: int) -> str | None:
        if not self.writable:
            return None
        return str(replica_data_dir(self.root, self.manifest.collection, shard_id, replica))

    def _coordinator(self) -> str | None:
        if not self.writable:
            return None
        if self.replicas == 1 and not self.coordinator:
            return None  # the only replica of each shard is its own primary
        return self.state_coordinator()

    def state_coordinator(self) -> str:
        """The cluster state: the one given, else the collection's local coordinator file."""
        return self.coordinator or f"file://{local_cluster_state(self.root, self.manifest.collection).resolve()}"

    def client(self) -> RayShardClient:
        return RayShardClient(self.namespace)

    def kill(self, shard_id: int, replica: int, *, restart: bool = False) -> None:
        """Kill one replica actor (chaos tests); with ``restart`` Ray brings it back."""
        _ray().kill(self.actors[shard_id][replica], no_restart=not restart)

    def stop(self) -> None:
        ray = _ray()
        for group in [*self.actors, self.node_actors]:
            for actor in group:
                try:
                    ray.kill(actor, no_restart=True)
                except Exception:  # noqa: BLE001 - already gone
                    pass
        self.actors, self.node_actors = [], []
        for group in self.placement_groups:
            try:
                ray.util.remove_placement_group(group)
            except Exception:  # noqa: BLE001 - the cluster may be gone
                pass
        self.placement_groups = []
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False

    def __enter__(self) -> RayShardCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
