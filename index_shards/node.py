"""A node: one shard-server process that hosts replicas of any (collection, shard) the cluster
state places on it, loading and dropping them at run time.

    /c/<collection>@<uid>/<shard>/...   that replica's shard server (every route of index_shards.server)
    GET /v1/node                        the node's id and the replicas it hosts
    GET /healthz                        liveness

A replica's URL is the node's URL plus ``/c/<collection>@<uid>/<shard>`` (``/c/<collection>/<shard>``
for the launched collection), so the gateways' shard client and the replicas' peer calls reach it
exactly as they reach a one-shard process. The incarnation in it matters: a collection dropped and
created again under its name, before this node has reconciled, must not be answered by the
dropped one's replica (its reads would show the dropped documents, its writes would be lost with
it) — the node answers 404 until it hosts the new one.

The node registers itself (``/shardrag-meta/nodes/<id>``, on a lease) and reconciles whenever the
cluster state's revision moves (looked at every ``reconcile_s``): a new collection's replica is
created empty (an empty build of its dimension, metric and FAISS factory, then a write-ahead
log), a dropped collection's replica is stopped and its files removed. Its replicas share the
node's lease (one renewal keeps them all). Only a successful read of the cluster state drives a
drop — a coordinator that does not answer changes nothing. On disk::

    <data dir>/collections/<uid>/<name>/<version>/shard-<i>/       the (empty) base build
    <data dir>/collections/<uid>/<name>/replicas/shard-<i>-<node>/ the replica's WAL and compactions
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from clusterstate.collections import (
    Collections,
    CollectionSpec,
    node_replica_url,
    replica_target,
    spec_version,
    spec_versions,
)
from clusterstate.kv import KV
from clusterstate.lease import LeaseKeeper
from clusterstate.state import ClusterState, RolloutStoreOnKV
from httpkit.asgi import Receive, Scope, Send
from httpkit.auth import guard_from_env, internal_policy
from index_shards.build import BuildConfig, build_collection
from index_shards.fetch import fetch_shard
from index_shards.layout import replica_data_dir, resolve_version, shard_dir, version_dir
from index_shards.peers import PeerClient
from index_shards.placement import BuiltCollection
from index_shards.server import ShardServer, ShardServerConfig, create_server
from index_shards.shard import Shard
from retrieval.dirlock import DirLock
from retrieval.errors import NotFound, ShardragError
from retrieval.types import EmbeddingVersion

logger = logging.getLogger(__name__)

SlotKey = tuple[str, int]  # (collection, shard)
FULL_RECONCILE_S = 5.0


@dataclass(slots=True)
class Slot:
    spec: CollectionSpec | None  # None: a replica of the launched collection (placed at launch)
    shard_id: int
    server: ShardServer


class Node:
    """The replicas a node hosts, kept equal to what the cluster state places on it."""

    def __init__(self, kv: KV, node_id: str, data_dir: str | Path, server_config: ShardServerConfig,
                 *, reconcile_s: float = 0.1, built: tuple[BuiltCollection, int] | None = None,
                 peers: PeerClient | None = None) -> None:
        """``built``: the launched collection and this node's index among its nodes: the replicas
        placement gives this node are opened here (before the node serves) and kept for its life.
        ``peers``: how its replicas reach their shard's other replicas (default HTTP; the Ray
        backend's node actors call each other through Ray)."""
        self.kv = kv
        self.node_id = node_id
        self.collections = Collections(kv)
        Path(data_dir).mkdir(parents=True, exist_ok=True)
        # One process per node folder: a second one would reconcile (and remove) the same files.
        self._dir_lock = DirLock(data_dir, f"node {node_id}").acquire()
        self.root = Path(data_dir) / "collections"
        self.root.mkdir(parents=True, exist_ok=True)
        self.server_config = server_config
        self.peers = peers
        self.reconcile_s = reconcile_s
        self.url = ""
        self.slots: dict[SlotKey, Slot] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # One lease for the node and every replica on it: one renewal a third of a TTL keeps them all.
        self._lease = LeaseKeeper(kv, server_config.lease_s, name=f"node-{node_id}",
                                  on_new_lease=lambda lease: self.collections.register_node(node_id, self.url, lease))
        self.built_slots: frozenset[SlotKey] = frozenset()
        if built is not None:
            try:
                self._host_built(*built)
            except BaseException:
                for key in list(self.slots):
                    self._unload(key)
                self._dir_lock.release()
                raise

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self, url: str) -> Node:
        self.url = url
        self._lease.start()
        self.collections.register_node(self.node_id, url, self._lease.lease)
        for name, shard_id in self.built_slots:
            self.slots[(name, shard_id)].server.role.start(self.replica_url(name, shard_id))
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"node-{self.node_id}")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with self._lock:
            for key in list(self.slots):
                self._unload(key)
        self._lease.stop()
        self._dir_lock.release()

    def _run(self) -> None:
        seen, reconciled_at = -1, 0.0
        while not self._stop.is_set():
            try:
                # A cheap look at the store's revision every tick; a full reconcile when it moved
                # (a collection created or dropped shows within a tick) and every few seconds anyway.
                revision = self.kv.revision()
                if revision != seen or time.monotonic() - reconciled_at > FULL_RECONCILE_S:
                    self.reconcile()
                    seen, reconciled_at = revision, time.monotonic()
            except ShardragError as exc:
                logger.warning("node %s: reconcile failed: %s", self.node_id, exc.message)
            except Exception:  # noqa: BLE001 - the loop must keep the node in step
                logger.exception("node %s: reconcile failed", self.node_id)
            self._stop.wait(self.reconcile_s)

    # -- reconcile ------------------------------------------------------------------------------
    def wanted(self, specs: list[CollectionSpec]) -> dict[SlotKey, CollectionSpec]:
        return {(spec.name, shard_id): spec for spec in specs
                for shard_id, nodes in enumerate(spec.placement) if self.node_id in nodes}

    def reconcile(self) -> None:
        """Host what the placements give this node, drop the rest (files included)."""
        wanted = self.wanted(self.collections.list())  # raises when the state cannot be read: nothing changes
        with self._lock:
            for key, slot in list(self.slots.items()):
                if key in self.built_slots:  # the launched collection's: placed at launch, not by the state
                    continue
                spec = wanted.get(key)
                assert slot.spec is not None
                if spec is None or spec.uid != slot.spec.uid:
                    self._unload(key)
                elif (spec.versions, spec.retired) != (slot.spec.versions, slot.spec.retired):  # a rollout's step
                    try:
                        self._ensure_bases(spec)
                        slot.spec = spec
                    except ShardragError as exc:
                        logger.error("node %s: cannot build the new version of %s: %s", self.node_id, key[0],
                                     exc.message)
            for key, spec in wanted.items():
                if key not in self.slots and not self._stop.is_set():
                    try:
                        self._host(spec, key[1])
                    except ShardragError as exc:
                        logger.error("node %s: cannot host %s shard %d: %s", self.node_id, key[0], key[1], exc.message)
            for spec in {spec.uid: spec for spec in wanted.values()}.values():
                self._remove_retired(spec)
            keep = {spec.uid for spec in wanted.values()}
            for directory in self.root.iterdir():
                if directory.name not in keep and not directory.name.startswith("."):
                    logger.warning("node %s: removing %s (its collection was dropped)", self.node_id, directory)
                    shutil.rmtree(directory, ignore_errors=True)

    def _ensure_bases(self, spec: CollectionSpec) -> None:
        """An empty base build of every version the collection's spec names (a rollout fills a
        staged one through the write path; a replica that starts later catches up from its primary)."""
        root = self.root / spec.uid
        for version in spec_versions(spec):
            try:
                resolve_version(root, spec.name, version.id)
            except NotFound:
                build_collection(root, [], np.zeros((0, version.dim), dtype=np.float32), version,
                                 BuildConfig(spec.name, num_shards=spec.shards, partitioner=spec.partitioner,
                                             factory=spec.factory, metric=spec.metric,
                                             partition_field=spec.tenant_field,
                                             lexical_language=spec.lexical_language,
                                             ef_construction=spec.ef_construction), show_progress=False)

    def _remove_retired(self, spec: CollectionSpec) -> None:
        """The files of the versions a rollout retired, once no replica here holds them (the
        gateways' reconcile unloads them first)."""
        if not spec.retired:
            return
        held = {v.id for (name, _), slot in self.slots.items() if name == spec.name
                for v in slot.server.versions.describe()}
        collection = self.root / spec.uid / spec.name
        for version_id in set(spec.retired) - held:
            for directory in (collection / version_id, *(collection / "replicas").glob(f"shard-*-{self.node_id}/"
                                                                                      f"{version_id}")):
                if directory.is_dir():
                    logger.warning("node %s: removing %s (version retired)", self.node_id, directory)
                    shutil.rmtree(directory, ignore_errors=True)

    def _first_version(self, spec: CollectionSpec) -> EmbeddingVersion:
        """The version a replica starts with: the collection's active one (a rollout may have
        moved it), else its first; the gateways' reconcile stages the others the rollout holds."""
        versions = {v.id: v for v in spec_versions(spec)}
        try:
            rollout = RolloutStoreOnKV(ClusterState(self.kv, spec.state_name)).load()
        except ShardragError as exc:
            logger.warning("node %s: rollout state of %s unreadable (%s): starting with its first version",
                           self.node_id, spec.name, exc.message)
            rollout = None
        if rollout is not None and rollout.active in versions:
            return versions[rollout.active]
        return next(iter(versions.values()), spec_version(spec))

    def _host(self, spec: CollectionSpec, shard_id: int) -> None:
        root = self.root / spec.uid
        self._ensure_bases(spec)
        version_directory, _ = resolve_version(root, spec.name, self._first_version(spec).id)
        config = self.server_config
        shard = Shard.load(shard_dir(version_directory, shard_id), device=config.device, mmap=config.mmap)
        data_dir = root / spec.name / "replicas" / f"shard-{shard_id}-{self.node_id}"
        server = create_server(shard, replace(config, data_dir=str(data_dir), replica_id=self.node_id,
                                              replication=spec.replicas), state=ClusterState(self.kv, spec.state_name),
                               peers=self.peers, lease=self._lease)
        server.role.start(self.replica_url(spec.name, shard_id, spec.uid))
        self.slots = {**self.slots, (spec.name, shard_id): Slot(spec, shard_id, server)}
        logger.info("node %s: hosting %s shard %d", self.node_id, spec.name, shard_id)

    def _host_built(self, built: BuiltCollection, node_index: int) -> None:
        """Open the launched collection's replicas placement gives this node, on the version the
        rollout state says is active (else the launch one): each keeps the data folder and replica
        id it has in the one-process-per-replica layout."""
        config, state = self.server_config, ClusterState(self.kv, built.name)
        rollout = state.rollout()  # a coordinator that does not answer: the node does not start
        version = rollout.active if rollout is not None and rollout.active else built.version
        for shard_id, replica in built.slots_on(node_index):
            if version is None:
                version = resolve_version(built.root, built.name, None)[0].name
            directory = shard_dir(version_dir(built.root, built.name, version), shard_id)
            if built.index_url and not directory.is_dir():
                fetch_shard(f"{built.index_url.rstrip('/')}/shard-{shard_id}.tar.gz", directory)
            shard = Shard.load(directory, device=config.device, mmap=config.mmap)
            data_dir = replica_data_dir(built.data_root or built.root, built.name, shard_id, replica)
            server = create_server(shard, replace(config, data_dir=str(data_dir), replication=built.replicas),
                                   state=state, peers=self.peers, lease=self._lease)
            self.slots = {**self.slots, (built.name, shard_id): Slot(None, shard_id, server)}
            self.built_slots = self.built_slots | {(built.name, shard_id)}
            logger.info("node %s: hosting %s shard %d (replica %d of the launched collection)", self.node_id,
                        built.name, shard_id, replica)

    def _unload(self, key: SlotKey) -> None:
        slot = self.slots[key]
        self.slots = {k: v for k, v in self.slots.items() if k != key}
        slot.server.role.stop()
        slot.server.versions.close()
        logger.info("node %s: dropped %s shard %d", self.node_id, key[0], key[1])

    def replica_url(self, collection: str, shard_id: int, uid: str = "") -> str:
        return node_replica_url(self.url, collection, shard_id, uid)

    def slot_for(self, target: str, shard_id: int) -> Any:
        """The slot a request for ``target`` (``name@uid`` or ``name``, as in a replica URL) reaches,
        or None — also when this node hosts another incarnation of the collection (dropped and
        created again; the node has not caught up yet)."""
        name, uid = replica_target(target)
        slot = self.slots.get((name, shard_id))
        if slot is None or uid != (slot.spec.uid if slot.spec is not None else ""):
            return None
        return slot

    def describe(self) -> dict[str, Any]:
        return {"node_id": self.node_id, "url": self.url,
                "replicas": [{"collection": name, "shard": shard_id, "uid": slot.spec.uid if slot.spec else None,
                              "url": self.replica_url(name, shard_id, slot.spec.uid if slot.spec else "")}
                             for (name, shard_id), slot in sorted(self.slots.items())]}


def create_node_app(node: Node) -> Any:
    """The node's ASGI app: ``/c/<collection>/<shard>/…`` to that replica's server, the rest here."""

    async def send_json(send: Send, status: int, payload: Any) -> None:
        body = orjson.dumps(payload)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def own(scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if path == "/healthz":
            await send_json(send, 200, {"status": "ok", "node_id": node.node_id, "replicas": len(node.slots)})
        elif path == "/v1/node":
            await send_json(send, 200, node.describe())
        else:
            await send_json(send, 404, NotFound(f"no route {path}", field="path").to_dict())

    guarded_own = guard_from_env(own, internal_policy)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:  # the node's replicas start and stop with the node itself, not here
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        path: str = scope.get("path", "")
        if scope["type"] == "http" and path.startswith("/c/"):
            name, _, rest = path[3:].partition("/")
            shard, _, tail = rest.partition("/")
            slot = node.slot_for(name, int(shard)) if shard.isdigit() else None
            if slot is None:
                error = NotFound(f"node {node.node_id} hosts no replica of {name!r} shard {shard} (of this "
                                 "incarnation)", field="collection")
                await send_json(send, 404, error.to_dict())
                return
            # The replica's server routes on the path below the prefix (its fast path matches
            # exact paths), as if it ran on its own.
            inner = dict(scope, path="/" + tail, raw_path=("/" + tail).encode())
            await slot.server.app(inner, receive, send)
            return
        await guarded_own(scope, receive, send)

    return app
