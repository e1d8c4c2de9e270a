"""Local cluster: N shards × R replica processes, optional kv-nodes and answer generators, and a
gateway process, on one machine.

Each child binds port 0 and reports its real address with a ``SHARDRAG_READY`` line; the
launcher waits for every line with a deadline and fails fast (with the child's log tail) when
a process exits first. A supervisor thread restarts a crashed child on its old port with
exponential back-off. :meth:`LocalCluster.stop` terminates, waits, then kills.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from index_shards.layout import nodes_dir, replica_data_dir, resolve_version, shard_dir
from index_shards.placement import BuiltCollection
from retrieval.atomic import atomic_write_bytes
from retrieval.dirlock import DirLock
from retrieval.errors import ConfigError
from serving.gateway.config import ClusterSpec, GatewayConfig
from serving.local.answer_path import start_answer_path
from serving.local.child import Child, LaunchError, stop_all
from serving.local.nodes import start_nodes
from serving.local.state import (
    active_version,
    claim_collection,
    launch_version,
    wait_for_encoder,
    with_collection_state,
    write_api_keys,
)

logger = logging.getLogger(__name__)

__all__ = ["Child", "LaunchError", "LocalCluster", "write_json"]


class LocalCluster:
    def __init__(
        self,
        root: str | Path,
        collection: str,
        *,
        version: str | None = None,
        replicas: int = 2,
        host: str = "127.0.0.1",
        gateway_port: int = 0,
        gateway_port_fallback: bool = False,
        gateway: GatewayConfig | None = None,
        workdir: str | Path | None = None,
        faiss_threads: int = 1,
        ready_timeout_s: float = 120.0,
        python: str = sys.executable,
        kv_nodes: int = 0,
        kv_node_budget_mb: float = 512.0,
        generators: int = 0,
        generator_model: str = "smollm2",
        generator_args: tuple[str, ...] = (),
        shard_args: tuple[str, ...] = (),
        api_keys: list[str] | None = None,
        internal_token: str | None = None,
        tls: tuple[str, str, str] | None = None,
        lock: bool = True,
        placement: Callable[[str], tuple[str, list[str]]] | None = None,
        nodes: int = 0,
        layout: str = "processes",
    ) -> None:
        """``api_keys`` ("read:<key>", "admin:<key>"): the gateway requires them (None: open).
        ``internal_token``: shard servers, kv-nodes and generators accept only calls that carry it
        (the gateway and generators are given it); None: no internal auth. ``tls`` (cert, key, CA):
        every process serves HTTPS with that certificate and verifies the others against the CA.
        ``gateway_port_fallback``: when ``gateway_port`` is busy the gateway takes any free port
        (read :attr:`gateway_url`). ``lock``: hold the collection's exclusive lock while running
        (a second cluster of the same collection on this machine is refused, naming this one).
        The shard servers coordinate through ``gateway.cluster.coordinator`` (default: the
        collection's local coordinator file). ``placement``: child name → (address it binds, command
        prefix that runs it there), e.g. a host of ``serving.local.netns``; default: ``host``, here.
        ``nodes``: node processes (``python -m index_shards node``) that host the collections created
        at run time (``PUT /v1/collections/{name}``), each keeping its files under
        ``<root>/<collection>/nodes/node-<i>``. ``layout``: ``processes`` (one process per replica of
        the launched collection) or ``nodes`` (the nodes host it too, replica r of shard i on node
        (i + r) mod N, N = max(nodes, replicas): no per-replica processes)."""
        if replicas < 1:
            raise ConfigError("replicas must be ≥ 1", field="replicas")
        if layout not in ("processes", "nodes"):
            raise ConfigError(f"layout must be processes or nodes, not {layout!r}", field="layout")
        if kv_nodes < 0 or generators < 0:
            raise ConfigError("kv_nodes and generators must be ≥ 0", field="kv_nodes" if kv_nodes < 0 else "generators")
        if kv_nodes and not generators:
            raise ConfigError("kv-nodes are only used by generators: add generators", field="kv_nodes")
        gateway = with_collection_state(gateway or GatewayConfig(), root, collection)
        # the version first: a collection or version that is not there leaves no temporary dir behind
        self.version_dir, self.manifest = launch_version(root, collection, version, gateway)
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="shardrag-cluster-"))
        if gateway.supervision_path is None:
            gateway = replace(gateway, supervision_path=str(self.workdir / "supervision.json"))
        self.lock = lock
        self._collection_lock: DirLock | None = None
        self.root = Path(root)
        self._shards_launched = False
        self.collection = collection
        self.replicas = replicas
        self.host = host
        self.place = placement or (lambda name: (host, []))
        self.gateway_port = gateway_port
        self.gateway_port_fallback = gateway_port_fallback
        self.gateway_config = gateway
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.faiss_threads = faiss_threads
        self.ready_timeout_s = ready_timeout_s
        self.python = python
        self.api_keys = list(api_keys) if api_keys else None
        self.kv_node_count = kv_nodes
        self.kv_node_budget_mb = kv_node_budget_mb
        self.generator_count = generators
        self.generator_model = generator_model
        self.generator_args = tuple(generator_args)
        self.shard_args = tuple(shard_args)  # extra flags of every `python -m index_shards serve`
        self.shards: list[list[Child]] = []
        self.node_count = max(nodes, replicas) if layout == "nodes" else nodes
        self.built = BuiltCollection(self.root, collection, self.manifest.num_shards, replicas, self.node_count,
                                     version=self.manifest.embedding_version.id) if layout == "nodes" else None
        self._started = False
        self.nodes: list[Child] = []
        self.kv_nodes: list[Child] = []
        self.generators: list[Child] = []
        self.gateway: Child | None = None
        self._stopping = threading.Event()
        self._supervisor: threading.Thread | None = None
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(faiss_threads)}
        for name in ("SHARDRAG_API_KEYS", "SHARDRAG_API_KEYS_FILE", "SHARDRAG_INTERNAL_TOKEN",
                     "SHARDRAG_INTERNAL_TOKEN_FILE"):
            self.env.pop(name, None)  # only what this cluster is given, never an ambient secret
        if internal_token:
            self.env["SHARDRAG_INTERNAL_TOKEN"] = internal_token
        for name in ("SHARDRAG_TLS_CERT", "SHARDRAG_TLS_KEY", "SHARDRAG_TLS_CA"):
            self.env.pop(name, None)
        self.tls = tls
        if tls:
            self.env.update(SHARDRAG_TLS_CERT=tls[0], SHARDRAG_TLS_KEY=tls[1], SHARDRAG_TLS_CA=tls[2])
        self.gateway_env = dict(self.env)
        if api_keys:
            keys_path = write_api_keys(self.workdir, api_keys)
            self.gateway_env["SHARDRAG_API_KEYS_FILE"] = str(keys_path)  # a file: keys stay out of `ps`

    # -- start -------------------------------------------------------------------------------
    def start(self) -> LocalCluster:
        if self._started or self._stopping.is_set():
            raise LaunchError("this LocalCluster was already started; make a new one")
        self._started = True
        try:
            self._collection_lock = claim_collection(self.gateway_config, self.root, self.collection,
                                                     self.manifest.num_shards, self.replicas, lock=self.lock)
            if self.built is None:
                self._start_shards()
            self.nodes = start_nodes(self.node_count, nodes_dir(self.root, self.collection), self.gateway_config,
                                     self.place, self.python, self.faiss_threads, self.workdir, self.env,
                                     self.ready_timeout_s, built=self.built, server_args=self.shard_args)
            self._start_answer_path()
            self._start_gateway()
        except BaseException:
            self.stop()
            raise
        self._write_supervision()
        self._supervisor = threading.Thread(target=self._supervise, daemon=True, name="supervisor")
        self._supervisor.start()
        return self

    def _start_shards(self) -> None:
        for shard_id in range(self.manifest.num_shards):
            group = []
            for replica in range(self.replicas):
                name = f"shard-{shard_id}-r{replica}"

                def argv(port: int, shard_id: int = shard_id, replica: int = replica) -> list[str]:
                    # A restarted replica comes back with the version active *now*, so it serves at
                    # once instead of waiting for the gateways to reconcile it after a rollout.
                    directory = shard_dir(self._active_version_dir(), shard_id)
                    address, prefix = self.place(f"shard-{shard_id}-r{replica}")
                    return [*prefix, self.python, "-m", "index_shards", "serve", "--dir", str(directory),
                            "--host", address, "--port", str(port), "--faiss-threads", str(self.faiss_threads),
                            "--data-dir", str(self.replica_data_dir(shard_id, replica)),
                            "--coordinator", str(self.gateway_config.cluster.coordinator),
                            "--replicas", str(self.replicas), *self.shard_args]

                child = Child(name, argv, self.workdir / f"{name}.log")
                child.start(self.env)
                group.append(child)
            self.shards.append(group)
        deadline = time.monotonic() + self.ready_timeout_s
        for group in self.shards:
            for child in group:
                child.wait_ready(deadline)
        self._shards_launched = True
        logger.info("%d shard replicas ready", sum(len(g) for g in self.shards))

    def replica_data_dir(self, shard_id: int, replica: int) -> Path:
        return replica_data_dir(self.root, self.collection, shard_id, replica)

    def _active_version_dir(self) -> Path:
        """The directory of the version the rollout state says is active (the launch version
        before any rollout, or when the state cannot be read)."""
        if not self._shards_launched:  # first start: the version asked for
            return self.version_dir
        try:
            active = active_version(self.collection, self.gateway_config)
            if active:
                return resolve_version(self.root, self.collection, active)[0]
        except Exception as exc:  # noqa: BLE001 - a restart must not fail on the state
            logger.warning("cannot read the rollout state (%s); restarting on the launch version", exc)
        return self.version_dir

    def _start_answer_path(self) -> None:
        self.kv_nodes, self.generators = start_answer_path(
            self.kv_node_count, self.kv_node_budget_mb, self.generator_count, self.generator_model,
            self.generator_args, self.place, self.python, self.workdir, self.env, self.ready_timeout_s)

    def _start_gateway(self) -> None:
        spec = ClusterSpec(self.collection, tuple(tuple(group) for group in self.shard_urls), self.gateway_config,
                           generators=tuple(str(c.ready["url"]) for c in self.generators))  # type: ignore[index]
        spec_path = self.workdir / "cluster.json"
        atomic_write_bytes(spec_path, spec.to_json())

        def argv(port: int) -> list[str]:
            fallback = ["--port-fallback"] if self.gateway_port_fallback else []
            address, prefix = self.place("gateway")
            return [*prefix, self.python, "-m", "serving", "gateway", "--cluster", str(spec_path), "--host", address,
                    "--port", str(port), *fallback]

        self.gateway = Child("gateway", argv, self.workdir / "gateway.log", port=self.gateway_port)
        self.gateway.start(self.gateway_env)
        deadline = time.monotonic() + self.ready_timeout_s
        self.gateway.wait_ready(deadline)
        if self.gateway_config.encoder.load:  # text queries work once the gateway's encoder is loaded
            wait_for_encoder(self.gateway_url, deadline, self.tls[2] if self.tls else None, self.gateway.log_tail)

    # -- state -------------------------------------------------------------------------------
    @property
    def gateway_url(self) -> str:
        assert self.gateway is not None and self.gateway.ready is not None
        return str(self.gateway.ready["url"])

    @property
    def shard_urls(self) -> list[list[str]]:
        """Each shard's replica URLs (in the nodes layout: on the nodes, ``<node>/c/<name>/<shard>``)."""
        if self.built is not None:
            return self.built.replica_urls([str(c.url) for c in self.nodes])
        return [[str(c.ready["url"]) for c in group if c.ready] for group in self.shards]

    @property
    def kv_node_urls(self) -> list[str]:
        return [str(c.ready["url"]) for c in self.kv_nodes if c.ready]

    @property
    def generator_urls(self) -> list[str]:
        return [str(c.ready["url"]) for c in self.generators if c.ready]

    def children(self) -> list[Child]:
        return ([c for group in self.shards for c in group] + self.nodes + self.kv_nodes + self.generators
                + ([self.gateway] if self.gateway else []))

    def status(self) -> list[dict[str, Any]]:
        # the URL a child had before its restart: the supervision file is written at the restart,
        # before the new process is ready, and the gateway matches replicas to it by URL
        return [{"name": c.name, "url": c.ready.get("url") if c.ready else c.url,
                 "pid": c.process.pid if c.process else None, "port": c.port,
                 "alive": bool(c.process and c.process.poll() is None), "restarts": c.restarts,
                 "last_exit_code": c.last_exit_code, "last_restart_at": c.last_restart_at}
                for c in self.children()]

    def _write_supervision(self) -> None:
        """The restart log the gateway shows in /v1/cluster (atomic: it may read at any time)."""
        path = self.gateway_config.supervision_path
        if path:
            write_json(Path(path), {"updated_at": time.time(), "children": self.status()})

    # -- supervision -------------------------------------------------------------------------
    def _supervise(self) -> None:
        while not self._stopping.wait(0.25):
            for child in self.children():
                process = child.process
                if process is None or process.poll() is None:
                    if process is not None and time.monotonic() - child.last_start > 60:
                        child.backoff_s = 1.0  # stayed up a minute: forgive earlier crashes
                    continue
                if self._stopping.is_set():
                    return
                if time.monotonic() - child.last_start < child.backoff_s:
                    continue
                logger.warning("%s exited with code %s; restarting on port %d (restart %d)\n%s", child.name,
                               process.returncode, child.port, child.restarts + 1, child.log_tail(5))
                child.restarts += 1
                child.last_exit_code = process.returncode
                child.last_restart_at = time.time()
                child.backoff_s = min(child.backoff_s * 2, 30.0)
                child.start(self.gateway_env if child is self.gateway else self.env)
                self._write_supervision()

    def wait(self) -> None:
        """Block until :meth:`stop` (or Ctrl-C in the caller)."""
        while not self._stopping.wait(0.5):
            pass

    # -- stop --------------------------------------------------------------------------------
    def stop(self) -> None:
        self._stopping.set()
        if self.gateway is not None:
            self.gateway.stop()
        # the gateway first (no query reaches a stopping shard), then everything else at once
        stop_all([*self.generators, *self.kv_nodes, *self.nodes, *(c for group in self.shards for c in group)])
        if self._collection_lock is not None:
            self._collection_lock.release()
            self._collection_lock = None
        if self._own_workdir:
            with contextlib.suppress(OSError):  # only when empty (a refused start): a run's logs stay
                self.workdir.rmdir()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def describe(self) -> dict[str, Any]:
        described: dict[str, Any] = {"gateway": self.gateway_url, "shards": self.shard_urls,
                                     "version": self.manifest.embedding_version.id, "workdir": str(self.workdir)}
        if self.generators:
            described.update(generators=self.generator_urls, kv_nodes=self.kv_node_urls)
        return described


def write_json(path: Path, payload: dict[str, Any]) -> None:
    atomic_write_bytes(path, json.dumps(payload, indent=1).encode())
