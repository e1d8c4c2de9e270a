"""Where a served collection keeps its state, whatever the backend: the rollout state, the write
sequence numbers and each replica's write-ahead logs live with the collection, so a restarted
cluster — processes or embedded — resumes them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from index_shards.layout import collection_dir, resolve_version
from index_shards.manifest import CollectionManifest
from retrieval.atomic import atomic_write_bytes
from serving.gateway.config import GatewayConfig
from serving.versions.store import FileRolloutStore


def with_collection_state(gateway: GatewayConfig, root: str | Path, collection: str) -> GatewayConfig:
    """``gateway`` with its rollout state and write sequence numbers kept with the collection (where
    not set), so a restarted cluster, on any backend, resumes them."""
    if gateway.rollout.state_path is None:
        gateway = replace(gateway, rollout=replace(
            gateway.rollout, state_path=str(collection_dir(root, collection) / "rollout.json")))
    if gateway.writes.state_path is None:
        gateway = replace(gateway, writes=replace(
            gateway.writes, state_path=str(collection_dir(root, collection) / "writes.sqlite")))
    return gateway


def launch_version(root: str | Path, collection: str, version: str | None,
                   gateway: GatewayConfig) -> tuple[Path, CollectionManifest]:
    """The version to start on: ``version`` when given, else the one the rollout state says is
    active, else the newest complete one."""
    if version is None and gateway.rollout.state_path is not None:
        state = FileRolloutStore(gateway.rollout.state_path).load()
        version = state.active if state is not None else None
    return resolve_version(root, collection, version)


def replica_data_dir(root: str | Path, collection: str, shard_id: int, replica: int) -> Path:
    """A replica's own state (its write-ahead logs): with the collection, so it outlives the cluster."""
    return collection_dir(root, collection) / "replicas" / f"shard-{shard_id}-r{replica}"


def write_api_keys(workdir: Path, keys: list[str]) -> Path:
    """The gateway's API keys in a file only the owner can read (keys passed as a file stay out of
    ``ps`` and the environment); crash-safe like every write. Returns its path."""
    path = workdir / "api-keys"
    atomic_write_bytes(path, ("\n".join(keys) + "\n").encode())
    path.chmod(0o600)
    return path
