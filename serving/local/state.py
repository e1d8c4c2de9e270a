"""Where a served collection keeps its state, whatever the backend: the cluster state of the local
coordinator (rollout state, each shard's primary, term and in-sync set) and each replica's data
dir live with the collection, so a restarted cluster — processes or embedded — resumes them. One
process serves a collection at a time: :func:`lock_collection`."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from clusterstate import open_coordinator
from clusterstate.local import LOCAL_STATE_FILE
from clusterstate.state import ClusterState
from index_shards.layout import collection_dir, local_cluster_state, replica_data_dir, resolve_version
from index_shards.manifest import CollectionManifest
from retrieval.atomic import atomic_write_bytes
from retrieval.dirlock import DirLock
from retrieval.errors import ConfigError, ShardragError
from serving.gateway.config import GatewayConfig
from serving.versions.store import read_legacy_rollout

logger = logging.getLogger(__name__)

LEGACY_ROLLOUT_FILE = "rollout.json"  # where releases before the cluster state kept the rollout state


def with_collection_state(gateway: GatewayConfig, root: str | Path, collection: str) -> GatewayConfig:
    """``gateway`` with the collection's local coordinator as its cluster state (unless it names a
    coordinator, e.g. etcd), and a rollout state file of an earlier release to import once."""
    if gateway.cluster.coordinator is None:
        # (deprecated) a rollout.state_path given: the local coordinator lives beside it, as the
        # gateway's own factory places it
        beside = Path(gateway.rollout.state_path).with_name(LOCAL_STATE_FILE) if gateway.rollout.state_path else None
        state_file = beside or local_cluster_state(root, collection)
        gateway = replace(gateway, cluster=replace(gateway.cluster, coordinator=f"file://{state_file.resolve()}"))
    legacy = collection_dir(root, collection) / LEGACY_ROLLOUT_FILE
    if gateway.rollout.state_path is None and legacy.exists():
        gateway = replace(gateway, rollout=replace(gateway.rollout, state_path=str(legacy)))
    return gateway


def lock_collection(root: str | Path, collection: str) -> DirLock:
    """The exclusive lock of the process that serves the collection on this machine: a second
    ``shardrag serve`` of it (any backend) is refused, naming this one."""
    return DirLock(collection_dir(root, collection), f"collection {collection!r}").acquire()


def claim_collection(gateway: GatewayConfig, root: str | Path, collection: str, num_shards: int, replicas: int | None,
                     *, lock: bool = True) -> DirLock | None:
    """Take the collection's lock (with ``lock``) and check that the ``replicas`` replicas to start
    of each shard can hold its acknowledged writes (:func:`refuse_without_in_sync_replicas`; None:
    replicas without data dirs, which take no writes). The lock is released when refused."""
    held = lock_collection(root, collection) if lock else None
    try:
        if replicas is not None:
            refuse_without_in_sync_replicas(gateway, root, collection, num_shards, replicas)
    except BaseException:
        if held is not None:
            held.release()
        raise
    return held


def refuse_without_in_sync_replicas(gateway: GatewayConfig, root: str | Path, collection: str, num_shards: int,
                                    replicas: int) -> None:
    """Refuse to start ``replicas`` replicas of each shard when, for some shard, none of them is in
    the shard's in-sync set: only those hold every acknowledged write, so the shard could never
    elect a primary (writes would wait forever) — or, with one replica and no election, would
    serve and overwrite a history that lacks acknowledged writes. Typical cause: a collection
    served with ``--replicas 2`` whose last primary was replica 1, started again with one."""
    if not gateway.cluster.coordinator:
        return
    try:
        records = ClusterState(open_coordinator(gateway.cluster.coordinator), collection).shards()
    except ShardragError as exc:
        logger.warning("cannot read the shards' in-sync sets (%s); the replicas will wait for them", exc.message)
        return
    for shard_id, record in sorted(records.items()):
        if shard_id >= num_shards or record.term == 0 or not record.in_sync:
            continue
        starting = {replica_data_dir(root, collection, shard_id, r).name for r in range(replicas)}
        if not starting & set(record.in_sync):
            raise ConfigError(
                f"shard {shard_id}: its acknowledged writes are held only by {', '.join(sorted(record.in_sync))} "
                f"(term {record.term}), which is not among the {replicas} replica(s) this start runs; start with "
                f"--replicas {_replicas_needed(record.in_sync, replicas)} so it rejoins and the others catch up "
                "from it",
                field="replicas")


def _replicas_needed(in_sync: tuple[str, ...], replicas: int) -> int:
    numbers = [int(name.rsplit("-r", 1)[1]) for name in in_sync if name.rsplit("-r", 1)[-1].isdigit()]
    return max([replicas - 1, *numbers]) + 1


def launch_version(root: str | Path, collection: str, version: str | None,
                   gateway: GatewayConfig) -> tuple[Path, CollectionManifest]:
    """The version to start on: ``version`` when given, else the one the rollout state says is
    active, else the newest complete one."""
    if version is None:
        version = active_version(collection, gateway)
    return resolve_version(root, collection, version)


def active_version(collection: str, gateway: GatewayConfig) -> str | None:
    """The active version the cluster state records (or an earlier release's rollout file)."""
    try:
        if gateway.cluster.coordinator:
            state = ClusterState(open_coordinator(gateway.cluster.coordinator), collection).rollout()
            if state is not None:
                return state.active
        if gateway.rollout.state_path is not None and Path(gateway.rollout.state_path).exists():
            legacy = read_legacy_rollout(gateway.rollout.state_path)
            return legacy.active if legacy is not None else None
    except ShardragError as exc:
        logger.warning("cannot read the rollout state (%s); starting on the newest version", exc.message)
    return None


def write_api_keys(workdir: Path, keys: list[str]) -> Path:
    """The gateway's API keys in a file only the owner can read (keys passed as a file stay out of
    ``ps`` and the environment); crash-safe like every write. Returns its path."""
    path = workdir / "api-keys"
    atomic_write_bytes(path, ("\n".join(keys) + "\n").encode())
    path.chmod(0o600)
    return path


def wait_for_encoder(gateway_url: str, deadline: float, ca_file: str | None, log_tail: Callable[[], str]) -> None:
    """Block until the gateway's query encoder is loaded (torch import: seconds); LaunchError when
    it failed or the deadline passed."""
    import ssl
    import time

    import httpx

    from serving.local.child import LaunchError

    verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=ca_file) if ca_file else True
    while True:
        state = httpx.get(f"{gateway_url}/healthz", timeout=5, verify=verify).json().get("encoder")
        if state == "ready":
            return
        if state != "loading":
            raise LaunchError(f"the gateway's query encoder is {state}:\n{log_tail()}")
        if time.monotonic() > deadline:
            raise LaunchError("the gateway's query encoder did not load in time")
        time.sleep(0.2)
