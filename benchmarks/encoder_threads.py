"""The gateway's encoder on one torch thread (what it got before ``encoder.threads``: the launcher's
OMP_NUM_THREADS=1, meant for FAISS in shard servers) vs one per core (the default now), on text
ingest and text queries, next to the encoder's own batch throughput in this process.

    python -m benchmarks.encoder_threads            # ~4 min on 2 cores
    python -m benchmarks.encoder_threads --quick

Each setting gets a fresh 2-shard cluster (1 replica each) over 1,000 msmarco passages; text
ingest writes 640 other passages in batches of 64 (``write_ack=majority``, fsynced); text
queries are the 100 msmarco/dbpedia queries, closed loop at c=1 and c=8. JSON:
benchmarks/results/encoder_threads.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

from benchmarks.common import REPO, data_dir, load_corpus, machine_info, write_result
from index_shards.build import BuildConfig, build_collection
from retrieval.datasets import load_beir
from retrieval.encoders import format_document, load_default_encoder
from retrieval.types import Document
from serving.gateway.config import GatewayConfig
from serving.local.launcher import LocalCluster

SEED = 1000


def ingest_text(url: str, docs: list[Document], batch: int) -> dict[str, Any]:
    started = time.perf_counter()
    with httpx.Client(base_url=url, timeout=300) as client:
        for start in range(0, len(docs), batch):
            body = orjson.dumps({"documents": [{"id": f"t-{d.doc_id}", "title": d.title, "text": d.text}
                                               for d in docs[start:start + batch]]})
            response = client.post("/v1/documents", content=body, headers={"content-type": "application/json"})
            response.raise_for_status()
    took = time.perf_counter() - started
    return {"docs": len(docs), "seconds": round(took, 3), "docs_per_s": round(len(docs) / took, 1)}


def text_queries(url: str, texts: list[str], work: Path, concurrency: int, duration_s: float) -> dict[str, Any]:
    path = work / "text_bodies.json"
    path.write_text(json.dumps([{"text": t, "k": 10, "with_text": False} for t in texts]))
    output = subprocess.run([sys.executable, "-m", "benchmarks.loadgen", "--url", f"{url}/v1/query", "--bodies",
                             str(path), "--concurrency", str(concurrency), "--duration", str(duration_s),
                             "--warmup", "1"], capture_output=True, text=True, cwd=REPO, check=True)
    summary = json.loads(output.stdout.strip().splitlines()[-1])
    return {k: summary[k] for k in ("qps", "p50_ms", "p99_ms", "errors")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer documents, shorter windows")
    args = parser.parse_args()
    duration = 4.0 if args.quick else 8.0
    corpus = load_corpus(("msmarco",))
    texts = [q for name in ("msmarco", "dbpedia") for q in load_beir(data_dir() / name).queries.values()]
    docs = corpus.documents
    written = docs[SEED:SEED + (192 if args.quick else 640)]
    result: dict[str, Any] = {"machine": machine_info(), "cluster": "2 shards x 1 replica, 1,000 passages"}
    encoder = load_default_encoder(device="cpu")
    batch = [format_document(d, encoder.version.preprocessing) for d in written]
    encoder.encode_texts(batch[:64])
    started = time.perf_counter()
    for start in range(0, len(batch), 64):
        encoder.encode_texts(batch[start:start + 64])
    result["encoder_ceiling_docs_per_s"] = round(len(batch) / (time.perf_counter() - started), 1)
    del encoder
    for threads in (1, 0):
        name = "one_thread" if threads == 1 else "per_core"
        with tempfile.TemporaryDirectory() as scratch:
            work = Path(scratch)
            build_collection(work / "root", docs[:SEED], corpus.vectors[:SEED], corpus.version,
                             BuildConfig("enc", 2), show_progress=False)
            config = GatewayConfig.from_dict({"encoder": {"threads": threads}})
            with LocalCluster(work / "root", "enc", replicas=1, gateway=config, workdir=work / "run") as cluster:
                url = cluster.gateway_url
                text_queries(url, texts[:20], work, 1, 1.0)  # warm the encoder
                row = {"ingest_text": ingest_text(url, written, 64)}
                for concurrency in (1, 8):
                    row[f"text_c{concurrency}"] = text_queries(url, texts, work, concurrency, duration)
            result[name] = row
            print(name, json.dumps(row), flush=True)
    one, per_core = result["one_thread"], result["per_core"]
    ceiling = result["encoder_ceiling_docs_per_s"]
    fast, slow = per_core["ingest_text"]["docs_per_s"], one["ingest_text"]["docs_per_s"]
    lines = [f"text ingest: {fast:.1f} docs/s per-core vs {slow:.1f} one thread (x{fast / slow:.2f}); "
             f"encoder ceiling {ceiling:.1f} (per-core x{fast / ceiling:.2f})"]
    for concurrency in (1, 8):
        a, b = one[f"text_c{concurrency}"], per_core[f"text_c{concurrency}"]
        lines.append(f"text queries c={concurrency}: {b['qps']:.0f} QPS p50 {b['p50_ms']:.1f} ms "
                     f"p99 {b['p99_ms']:.1f} ms per-core vs {a['qps']:.0f} QPS p50 {a['p50_ms']:.1f} ms "
                     f"p99 {a['p99_ms']:.1f} ms one thread "
                     f"(QPS x{b['qps'] / a['qps']:.2f}, p50 x{b['p50_ms'] / a['p50_ms']:.2f})")
    result["summary"] = lines
    print("\n".join(lines))
    print(write_result("encoder_threads", result))


if __name__ == "__main__":
    main()
