"""CPU a write costs the cluster: batches of 10 vector documents written one after another through
the gateway of a local cluster (4 shards × 2 replicas by default), and the CPU seconds every
process of the cluster used per batch (``/proc/<pid>/stat``), with the write latency.

    python -m benchmarks.write_cost [--shards 4] [--batches 300]

Run it on two commits in one sitting to compare write paths (the same script, each tree's own
code). JSON: benchmarks/results/write_cost.json.
"""

from __future__ import annotations

import argparse
import http.client
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import orjson

from benchmarks.common import load_corpus, machine_info, process_cpu_s, write_result
from index_shards.build import BuildConfig, build_collection
from serving.gateway.config import GatewayConfig
from serving.local.launcher import LocalCluster


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--batches", type=int, default=300)
    args = parser.parse_args()
    corpus = load_corpus(("msmarco",))
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch) / "root"
        build_collection(root, corpus.documents, corpus.vectors, corpus.version, BuildConfig("cost", args.shards),
                         show_progress=False)
        config = GatewayConfig.from_dict({"encoder": {"load": False}})
        with LocalCluster(root, "cost", replicas=2, gateway=config, workdir=Path(scratch) / "run") as cluster:
            address = urlsplit(cluster.gateway_url)
            connection = http.client.HTTPConnection(address.hostname, address.port, timeout=60)

            def batch(n: int) -> None:
                vectors = rng.standard_normal((10, corpus.vectors.shape[1])).astype(np.float32)
                vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
                documents = [{"id": f"cost-{n}-{i}", "vector": v} for i, v in enumerate(vectors)]
                body = orjson.dumps({"documents": documents}, option=orjson.OPT_SERIALIZE_NUMPY)
                connection.request("POST", "/v1/documents", body=body, headers={"content-type": "application/json"})
                response = connection.getresponse()
                response.read()
                if response.status != 200:
                    raise RuntimeError(f"write refused: {response.status}")

            for n in range(30):  # warm: connections, and the first election of each shard
                batch(n)
            time.sleep(3)
            children = {c.name: c.process.pid for c in cluster.children() if c.process is not None}
            before = {name: process_cpu_s(pid) for name, pid in children.items()}
            started = time.perf_counter()
            for n in range(100, 100 + args.batches):
                batch(n)
            took = time.perf_counter() - started
            used = {name: process_cpu_s(pid) - before[name] for name, pid in children.items()}
    per_batch_ms = {name: round(seconds / args.batches * 1000, 3) for name, seconds in used.items()}
    result: dict[str, Any] = {
        "machine": machine_info(), "shards": args.shards, "replicas": 2, "batches": args.batches,
        "latency_ms_per_batch": round(took / args.batches * 1000, 3),
        "cluster_cpu_ms_per_batch": round(sum(used.values()) / args.batches * 1000, 3),
        "gateway_cpu_ms_per_batch": per_batch_ms.get("gateway"), "per_process_cpu_ms_per_batch": per_batch_ms}
    print(f"{args.batches} batches of 10 over {args.shards} shards x 2: {result['latency_ms_per_batch']} ms each, "
          f"cluster CPU {result['cluster_cpu_ms_per_batch']} ms per batch "
          f"(gateway {result['gateway_cpu_ms_per_batch']})")
    print(write_result("write_cost", result))


if __name__ == "__main__":
    main()
