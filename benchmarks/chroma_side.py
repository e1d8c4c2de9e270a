"""The Chroma half of benchmarks/collections_memory.py, run by the interpreter of a virtualenv
holding chromadb==1.5.9 (it imports nothing of shardrag). Prints one JSON line."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def tenant_vectors(tenant: int, per_tenant: int, dim: int) -> np.ndarray:  # as benchmarks.collections_memory
    vectors = np.random.default_rng(tenant).standard_normal((per_tenant, dim)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("--tenants", "--per-tenant", "--dim", "--empties"):
        parser.add_argument(name, type=int, required=True)
    parser.add_argument("--path", required=True)
    parser.add_argument("--settle-s", type=float, default=3.0)
    args = parser.parse_args()
    import chromadb

    client = chromadb.PersistentClient(path=args.path)

    def held() -> int:  # as benchmarks.collections_memory.settled
        deadline = time.monotonic() + 120.0
        previous = rss_bytes()
        while True:
            time.sleep(args.settle_s)
            current = rss_bytes()
            if abs(current - previous) <= 0.01 * max(previous, 1) or time.monotonic() > deadline:
                return current
            previous = current

    probe = tenant_vectors(0, 1, args.dim)
    client.create_collection("warm", embedding_function=None, metadata={"hnsw:space": "ip"}).count()
    before = held()
    for number in range(args.empties):
        empty = client.create_collection(f"empty-{number}", embedding_function=None, metadata={"hnsw:space": "ip"})
        empty.query(query_embeddings=probe, n_results=1)
    empties = held()
    tenants = client.create_collection("tenants", embedding_function=None, metadata={"hnsw:space": "ip"})
    started = time.perf_counter()
    for tenant in range(args.tenants):
        vectors = tenant_vectors(tenant, args.per_tenant, args.dim)
        tenants.add(ids=[f"t{tenant}::d{i}" for i in range(args.per_tenant)], embeddings=vectors,
                    metadatas=[{"tenant": f"t{tenant}"}] * args.per_tenant)
    write_s = time.perf_counter() - started
    full = held()
    latencies, wrong = [], 0
    for tenant in range(0, args.tenants, max(1, args.tenants // 100)):
        query = tenant_vectors(tenant, 1, args.dim)
        began = time.perf_counter()
        found = tenants.query(query_embeddings=query, n_results=10, where={"tenant": f"t{tenant}"})
        latencies.append(time.perf_counter() - began)
        wrong += sum(not i.startswith(f"t{tenant}::") for i in found["ids"][0])
    values = np.asarray(latencies) * 1000.0
    print(json.dumps({"version": chromadb.__version__, "rss_before_bytes": before,
                      "empty_collection_bytes": (empties - before) / args.empties,
                      "tenants_collection_bytes": full - empties, "write_s": write_s,
                      "docs_per_s": args.tenants * args.per_tenant / write_s,
                      "tenant_query_ms": {"p50_ms": float(np.percentile(values, 50)),
                                          "p99_ms": float(np.percentile(values, 99)),
                                          "mean_ms": float(values.mean())},
                      "foreign_hits": wrong}))


if __name__ == "__main__":
    main()
