"""Memory per collection and per tenant: shardrag's collections API against Chroma 1.5.9, doing
the same in the same run.

    python -m benchmarks.collections_memory [--tenants 1000] [--per-tenant 100] [--dim 384]
        [--chroma-python .venv-chroma/bin/python]

Chroma runs in its own virtualenv (it pins its own dependencies), made once with
``python -m venv .venv-chroma && .venv-chroma/bin/pip install chromadb==1.5.9 numpy``; the
script drives it in a subprocess (benchmarks/chroma_side.py), embedded (PersistentClient), with
the vectors given (no embedding function).

Measured, for both: the resident memory (RSS) an empty collection adds (the mean over
``--empties`` of them), then one collection holding ``--tenants`` × ``--per-tenant`` documents
(random unit vectors, a ``tenant`` payload field), written in one batch per tenant — the RSS it
adds (measured once RSS stops moving; for shardrag also after compacting the write segment into
the sealed base) and the latency of a query confined to one tenant. shardrag's figure is every process that
holds state: the node hosting the collections and the gateway serving them (the launched
collection's shard process is the same before and after). JSON:
benchmarks/results/collections_memory.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import machine_info, percentiles_ms, write_result
from index_shards.build import BuildConfig, build_collection
from retrieval.types import Document, EmbeddingVersion
from serving.gateway.config import GatewayConfig
from serving.local.launcher import LocalCluster

SETTLE_S = 3.0


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def settled(measure: Callable[[], int], *, calm: float = 0.01, timeout_s: float = 120.0) -> int:
    """RSS once it stopped moving (two samples 3 s apart within ``calm``), so a compaction or a
    flush in flight is not what gets measured."""
    deadline = time.monotonic() + timeout_s
    previous = measure()
    while True:
        time.sleep(SETTLE_S)
        current = measure()
        if abs(current - previous) <= calm * max(previous, 1) or time.monotonic() > deadline:
            return current
        previous = current


def tenant_vectors(tenant: int, per_tenant: int, dim: int) -> np.ndarray:
    vectors = np.random.default_rng(tenant).standard_normal((per_tenant, dim)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def ours(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    import httpx

    from retrieval.client import ShardragClient

    root = scratch / "root"
    base = np.eye(4, args.dim, dtype=np.float32)
    version = EmbeddingVersion("bench-base", "0" * 64, args.dim)
    build_collection(root, [Document(f"b{i}", "", "") for i in range(4)], base, version, BuildConfig("base", 1),
                     show_progress=False)
    config = GatewayConfig.from_dict({"encoder": {"load": False}, "writes": {"max_documents": 1000}})
    with LocalCluster(root, "base", replicas=1, gateway=config, nodes=1, workdir=scratch / "work") as cluster, \
            ShardragClient(cluster.gateway_url, timeout_s=120) as client:
        pids = {c.name: c.process.pid for c in cluster.children() if c.process is not None and c.name != "shard-0-r0"}

        def held() -> int:
            return settled(lambda: sum(rss_bytes(pid) for pid in pids.values()))

        before = held()
        for number in range(args.empties):
            client.create_collection(f"empty-{number}", dim=args.dim)
            client.collection(f"empty-{number}").query(vector=base[0], k=1)  # served: its stack is built
        empties = held()
        client.create_collection("tenants", dim=args.dim, tenant_field="tenant")
        tenants = client.collection("tenants")
        started = time.perf_counter()
        for tenant in range(args.tenants):
            vectors = tenant_vectors(tenant, args.per_tenant, args.dim)
            tenants.upsert([{"id": f"d{i}", "vector": v, "metadata": {"tenant": f"t{tenant}"}}
                            for i, v in enumerate(vectors)], write_ack="one")
        write_s = time.perf_counter() - started
        full = held()  # its last 20,000 documents in the write segment, the rest compacted
        for node in cluster.nodes:  # everything folded into the sealed base, as Chroma indexes all it holds
            for replica in httpx.get(f"{node.ready['url']}/v1/node", timeout=30).json()["replicas"]:
                if replica["collection"] == "tenants":
                    httpx.post(f"{replica['url']}/admin/compact", timeout=600).raise_for_status()
        compacted = held()
        latencies, wrong = [], 0
        for tenant in range(0, args.tenants, max(1, args.tenants // 100)):
            probe = tenant_vectors(tenant, 1, args.dim)[0]
            filter_ = {"must": [{"key": "tenant", "match": {"value": f"t{tenant}"}}]}
            began = time.perf_counter()
            hits = tenants.query(vector=probe, k=10, filter=filter_, with_text=False)["hits"]
            latencies.append(time.perf_counter() - began)
            wrong += sum(not h["doc_id"].startswith(f"t{tenant}::") for h in hits)
        return {"processes": sorted(pids), "rss_before_bytes": before,
                "empty_collection_bytes": (empties - before) / args.empties,
                "tenants_collection_bytes": full - empties, "tenants_compacted_bytes": compacted - empties,
                "write_s": write_s,
                "docs_per_s": args.tenants * args.per_tenant / write_s,
                "tenant_query_ms": percentiles_ms(latencies), "foreign_hits": wrong}


def chroma(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    side = Path(__file__).with_name("chroma_side.py")
    command = [args.chroma_python, str(side), "--path", str(scratch / "chroma"), "--tenants", str(args.tenants),
               "--per-tenant", str(args.per_tenant), "--dim", str(args.dim), "--empties", str(args.empties),
               "--settle-s", str(SETTLE_S)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=7200, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the Chroma side failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tenants", type=int, default=1000)
    parser.add_argument("--per-tenant", type=int, default=100)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--empties", type=int, default=20, help="empty collections whose mean cost is reported")
    parser.add_argument("--chroma-python", default=".venv-chroma/bin/python",
                        help="the interpreter of a virtualenv holding chromadb==1.5.9")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        shardrag = ours(args, Path(scratch))
        other = chroma(args, Path(scratch))
    mib = 2**20
    rows = [("RSS per empty collection (MiB)", shardrag["empty_collection_bytes"] / mib,
             other["empty_collection_bytes"] / mib),
            (f"RSS of {args.tenants} tenants x {args.per_tenant} docs (MiB)",
             shardrag["tenants_collection_bytes"] / mib, other["tenants_collection_bytes"] / mib),
            ("  the same, shardrag compacted (MiB)", shardrag["tenants_compacted_bytes"] / mib,
             other["tenants_collection_bytes"] / mib),
            ("write rate (docs/s)", shardrag["docs_per_s"], other["docs_per_s"]),
            ("tenant query p50 (ms)", shardrag["tenant_query_ms"]["p50_ms"], other["tenant_query_ms"]["p50_ms"]),
            ("tenant query p99 (ms)", shardrag["tenant_query_ms"]["p99_ms"], other["tenant_query_ms"]["p99_ms"])]
    print(f"{'':44s} {'shardrag':>10s} {'chroma 1.5.9':>13s} {'ratio':>7s}")
    for label, mine, theirs in rows:
        print(f"{label:44s} {mine:10.2f} {theirs:13.2f} {mine / theirs if theirs else float('nan'):7.2f}")
    print(f"foreign hits in tenant queries: shardrag {shardrag['foreign_hits']}, chroma {other['foreign_hits']}")
    path = write_result("collections_memory", {"machine": machine_info(), "args": vars(args), "shardrag": shardrag,
                                               "chroma": other})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
