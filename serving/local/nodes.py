"""The local launcher's node processes: ``python -m index_shards node``, each hosting replicas of
the collections created at run time (clusterstate.collections) and, in the nodes layout, its
share of the launched collection (index_shards.placement), all coordinating through one cluster
state."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from index_shards.placement import BuiltCollection
from serving.gateway.config import GatewayConfig
from serving.local.child import Child


def built_args(built: BuiltCollection | None, index: int, server_args: tuple[str, ...]) -> list[str]:
    """A node's flags for its share of the launched collection (none without one), then the
    replicas' own flags (those of ``python -m index_shards serve``: faults, compaction, ...)."""
    if built is None:
        return list(server_args)
    version = ["--version", built.version] if built.version else []
    return ["--collection", built.name, "--root", str(built.root), *version, "--shards", str(built.shards),
            "--replicas", str(built.replicas), "--nodes", str(built.nodes), "--node-index", str(index),
            *server_args]


def start_nodes(count: int, nodes_dir: Path, gateway: GatewayConfig, place: Callable[[str], tuple[str, list[str]]],
                python: str, faiss_threads: int, workdir: Path, env: dict[str, str],
                ready_timeout_s: float, *, built: BuiltCollection | None = None,
                server_args: tuple[str, ...] = ()) -> list[Child]:
    """Start ``count`` nodes (``node-<i>``, files under ``nodes_dir/node-<i>``) and wait until each
    reports ready; a restarted node comes back on its old port and with its old files. ``built``:
    the launched collection, which the nodes then host too (each its share, opened before it
    reports ready)."""
    children = []
    for index in range(count):
        def argv(port: int, name: str = f"node-{index}", index: int = index) -> list[str]:
            address, prefix = place(name)
            return [*prefix, python, "-m", "index_shards", "node", "--data-dir", str(nodes_dir / name),
                    "--host", address, "--port", str(port), "--coordinator", str(gateway.cluster.coordinator),
                    "--faiss-threads", str(faiss_threads), *built_args(built, index, server_args)]

        child = Child(f"node-{index}", argv, workdir / f"node-{index}.log")
        child.start(env)
        children.append(child)
    deadline = time.monotonic() + ready_timeout_s
    for child in children:
        child.wait_ready(deadline)
    return children
