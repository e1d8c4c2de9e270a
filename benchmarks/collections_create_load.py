"""Creating collections does not disturb the ones serving: queries and writes run on one collection
while others are created (and written to) back to back; its latency and errors, against the same
load with nothing being created, in the same run. The writes replace loaded documents, so the busy
collection holds the same documents in every phase.

    python -m benchmarks.collections_create_load [--phase-s 30] [--repeats 2] [--documents 5000]

A local cluster with two nodes; the busy collection (384 dims, 2 shards × 2 replicas, so on both
nodes) holds ``--documents`` documents. Per repeat three phases of ``--phase-s``: quiet, creating,
quiet again; in each, ``--readers`` closed-loop query threads and one write thread (batches of
10) on the busy collection. The creating phase makes collections (16 dims, 1 shard × 2 replicas:
on both nodes, as the busy one) one after another, each written once. Target: 0 errors and the
busy collection's query p99 while creating within 1.2x of quiet (the mean of the two quiet
phases). JSON: benchmarks/results/collections_create_load.json.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from benchmarks.common import machine_info, percentiles_ms, write_result
from index_shards.build import BuildConfig, build_collection
from retrieval.errors import ShardragError
from retrieval.types import Document, EmbeddingVersion
from serving.gateway.config import GatewayConfig
from serving.local.launcher import LocalCluster

DIM = 384


def unit(rng: np.random.Generator, n: int, dim: int = DIM) -> np.ndarray:
    vectors = rng.standard_normal((n, dim)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


class Load:
    """Closed-loop readers and one writer on the busy collection, recording per phase."""

    def __init__(self, url: str, readers: int, documents: int) -> None:
        self.url = url
        self.readers = readers
        self.documents = documents
        self.phase = "warm"
        self.latencies: dict[str, list[float]] = {}
        self.write_latencies: dict[str, list[float]] = {}
        self.errors: dict[str, list[str]] = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for number in range(self.readers):
            self._threads.append(threading.Thread(target=self._read, args=(number,), daemon=True))
        self._threads.append(threading.Thread(target=self._write, daemon=True))
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)

    def _record(self, into: dict[str, list[float]], began: float, error: str | None) -> None:
        phase = self.phase
        if error is not None:
            self.errors.setdefault(phase, []).append(error)
        else:
            into.setdefault(phase, []).append(time.perf_counter() - began)

    def _read(self, number: int) -> None:
        from retrieval.client import ShardragClient

        rng = np.random.default_rng(100 + number)
        with ShardragClient(self.url, timeout_s=30) as client:
            busy = client.collection("busy")
            while not self._stop.is_set():
                probe = unit(rng, 1)[0]
                began = time.perf_counter()
                try:
                    busy.query(vector=probe, k=10, with_text=False)
                    self._record(self.latencies, began, None)
                except ShardragError as exc:
                    self._record(self.latencies, began, f"query: {exc.message}")

    def _write(self) -> None:
        from retrieval.client import ShardragClient

        rng = np.random.default_rng(7)
        with ShardragClient(self.url, timeout_s=30) as client:
            busy = client.collection("busy")
            while not self._stop.is_set():
                # Replacements of loaded documents: the busy collection keeps its size, so every
                # phase queries the same amount of data (new ids would grow it phase after phase).
                ids = rng.choice(self.documents, size=10, replace=False)
                began = time.perf_counter()
                try:
                    busy.upsert([{"id": f"d{i}", "vector": v} for i, v in zip(ids, unit(rng, 10), strict=True)])
                    self._record(self.write_latencies, began, None)
                except ShardragError as exc:
                    self._record(self.write_latencies, began, f"write: {exc.message}")
                time.sleep(0.05)


def cpu_seconds(cluster: LocalCluster) -> dict[str, float]:
    """CPU seconds (user + system) spent so far by each process of the cluster and by this one (the load)."""
    spent = {"load (this process)": sum(psutil.Process().cpu_times()[:2])}
    for child in cluster.children():
        if child.process is not None and child.process.poll() is None:
            try:
                spent[child.name] = sum(psutil.Process(child.process.pid).cpu_times()[:2])
            except psutil.Error:
                continue
    return spent


def one_run(args: argparse.Namespace, scratch: Path, repeat: int) -> dict[str, Any]:
    from retrieval.client import ShardragClient

    root = scratch / f"root-{repeat}"
    version = EmbeddingVersion("bench-base", "0" * 64, 8)
    build_collection(root, [Document(f"b{i}", "", "") for i in range(4)], np.eye(4, 8, dtype=np.float32), version,
                     BuildConfig("base", 1), show_progress=False)
    config = GatewayConfig.from_dict({"encoder": {"load": False}, "writes": {"max_documents": 1000}})
    rng = np.random.default_rng(repeat)
    work = scratch / f"work-{repeat}"
    with LocalCluster(root, "base", replicas=1, gateway=config, nodes=2, workdir=work) as cluster, \
            ShardragClient(cluster.gateway_url, timeout_s=120) as client:
        client.create_collection("busy", dim=DIM, shards=2, replicas=2)
        busy = client.collection("busy")
        for start in range(0, args.documents, 500):
            busy.upsert([{"id": f"d{start + i}", "vector": v} for i, v in enumerate(unit(rng, 500))])
        load = Load(cluster.gateway_url, args.readers, args.documents)
        load.start()
        time.sleep(5)  # warm
        created: list[float] = []
        cpu: dict[str, dict[str, float]] = {}
        for phase in ("quiet", "creating", "quiet-after"):
            load.phase = phase
            before, phase_began = cpu_seconds(cluster), time.monotonic()
            ends = time.monotonic() + args.phase_s
            while time.monotonic() < ends:
                if phase != "creating":
                    time.sleep(0.1)
                    continue
                name = f"new-{len(created)}"
                began = time.perf_counter()
                client.create_collection(name, dim=16, replicas=2)
                client.collection(name).upsert([{"id": "a", "vector": unit(rng, 1, 16)[0]}])
                created.append(time.perf_counter() - began)
            after, took = cpu_seconds(cluster), time.monotonic() - phase_began
            cpu[phase] = {name: round((after[name] - before.get(name, 0.0)) / took, 3) for name in after}
        load.stop()
    quiet = load.latencies.get("quiet", []) + load.latencies.get("quiet-after", [])
    phases = {phase: {"queries": len(load.latencies.get(phase, [])), **percentiles_ms(load.latencies.get(phase, [])),
                      "writes": len(load.write_latencies.get(phase, [])),
                      "write_p99_ms": percentiles_ms(load.write_latencies.get(phase, []))["p99_ms"],
                      "errors": len(load.errors.get(phase, [])), "first_errors": load.errors.get(phase, [])[:3],
                      "cpu_per_s": cpu[phase]}
              for phase in ("quiet", "creating", "quiet-after")}
    quiet_p99 = percentiles_ms(quiet)["p99_ms"]
    return {"phases": phases, "collections_created": len(created), "create_ms": percentiles_ms(created),
            "quiet_p99_ms": quiet_p99, "p99_ratio": phases["creating"]["p99_ms"] / quiet_p99}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--phase-s", type=float, default=30.0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--documents", type=int, default=5000)
    parser.add_argument("--readers", type=int, default=2)
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as scratch:
        for repeat in range(args.repeats):
            run = one_run(args, Path(scratch), repeat)
            runs.append(run)
            phases = run["phases"]
            print(f"run {repeat + 1}: {run['collections_created']} collections created "
                  f"(p50 {run['create_ms']['p50_ms']:.0f} ms)")
            for phase, row in phases.items():
                print(f"  {phase:12s} {row['queries']:6d} queries p50 {row['p50_ms']:6.2f} ms "
                      f"p99 {row['p99_ms']:6.2f} ms  {row['writes']:4d} writes p99 {row['write_p99_ms']:6.1f} ms  "
                      f"errors {row['errors']}")
                print("    CPU-s/s: " + ", ".join(f"{name} {spent:.2f}" for name, spent in row["cpu_per_s"].items()))
            print(f"  busy p99 while creating / quiet: {run['p99_ratio']:.2f}x (target <= 1.2)")
    ratios = sorted(r["p99_ratio"] for r in runs)
    errors = sum(row["errors"] for r in runs for row in r["phases"].values())
    print(f"p99 ratio over {len(runs)} runs: median {float(np.median(ratios)):.2f}x, worst {ratios[-1]:.2f}x; "
          f"errors {errors}")
    path = write_result("collections_create_load", {"machine": machine_info(), "args": vars(args), "runs": runs,
                                                    "p99_ratio_median": float(np.median(ratios)),
                                                    "p99_ratio_worst": ratios[-1], "errors": errors})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
