"""shardrag next to a peer on the same vectors, queries, machine and load generator: Chroma's server.

    python -m venv /tmp/chroma && /tmp/chroma/bin/pip install chromadb==1.5.9   # once: an extra venv
    python -m benchmarks.peers --chroma /tmp/chroma/bin                          # ~4 min on 2 cores

Chroma is not a dependency of shardrag: it runs from its own virtual environment (``--chroma``,
the folder holding its ``chroma`` and ``python``), so it never touches shardrag's environment. Data: the
10k real MiniLM passage vectors (msmarco + dbpedia, through the embedding cache) and the 100
real queries; k = 10.

Vector path: shardrag 4 shards × 1 replica (Flat and HNSW32, vector queries through the gateway),
and the same 4 shards loaded in the gateway's own process (``shardrag serve --backend embedded``:
one process, no shard hops), against Chroma's server (default HNSW, and HNSW M32 / ef 400), each driven by
benchmarks/loadgen.py (closed loop, c = 1 and 32) with the engine's own JSON query body; recall@10
against exact search. Text path, c = 1: shardrag embeds the text in the gateway (its encoder
service, its query-embedding cache off since every text is sent --text-rounds times); for Chroma
the client embeds with the same MiniLM (sentence-transformers, in this process) and sends the
vector — what a Chroma user does. Ratios: shardrag / Chroma default.
JSON: benchmarks/results/peers.json (``--name``).
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks.common import data_dir, load_corpus, machine_info, percentiles_ms, scratch_dir, write_result
from benchmarks.query_latency import VECTORS_ONLY, exact_top10, run_load
from httpkit.serve import parse_ready_line
from index_shards.build import BuildConfig, build_collection
from retrieval.datasets import load_beir
from serving.encoding.settings import EncoderSettings
from serving.gateway.config import GatewayConfig
from serving.local.launcher import LocalCluster

CHROMA_SETUP = """
import json, sys
import chromadb
import numpy as np
port, vectors_path, ids_path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
client = chromadb.HttpClient(host="127.0.0.1", port=port)
vectors = np.load(vectors_path)
ids = json.load(open(ids_path))
out = {}
for name, config in (("default", None), ("m32_ef400", {"hnsw": {"max_neighbors": 32, "ef_construction": 400,
                                                               "ef_search": 400}})):
    collection = client.create_collection(name, configuration=config) if config else client.create_collection(name)
    for start in range(0, len(ids), 2000):
        collection.add(ids=ids[start:start + 2000], embeddings=vectors[start:start + 2000])
    out[name] = str(collection.id)
print(json.dumps(out))
"""
CHROMA_QUERY = "/api/v2/tenants/default_tenant/databases/default_database/collections/{id}/query"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_chroma(chroma_bin: Path, work: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    process = subprocess.Popen([str(chroma_bin / "chroma"), "run", "--path", str(work / "chroma-db"), "--host",
                                "127.0.0.1", "--port", str(port)], stdout=subprocess.DEVNULL,
                               stderr=open(work / "chroma.log", "wb"))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/api/v2/heartbeat", timeout=1).status_code == 200:
                return process, port
        except httpx.HTTPError:
            time.sleep(0.3)
    process.kill()
    raise RuntimeError(f"chroma did not start; see {work / 'chroma.log'}")


def recall_of(found: list[list[str]], exact: list[list[str]]) -> float:
    return float(np.mean([len(set(f) & set(e)) / 10 for f, e in zip(found, exact, strict=True)]))


def chroma_answers(url: str, vectors: np.ndarray) -> list[list[str]]:
    with httpx.Client(timeout=30) as client:
        return [client.post(url, json={"query_embeddings": [v.tolist()], "n_results": 10,
                                       "include": ["distances"]}).json()["ids"][0] for v in vectors]


def gateway_answers(url: str, vectors: np.ndarray) -> list[list[str]]:
    with httpx.Client(timeout=30) as client:
        return [[h["doc_id"] for h in client.post(f"{url}/v1/query", json={"vector": v.tolist(), "k": 10}).json()
                 ["hits"]] for v in vectors]


def loads(url: str, bodies: list[dict[str, Any]], work: Path, name: str, duration: float,
          pids: dict[str, int]) -> dict[int, dict[str, Any]]:
    path = work / f"{name}-bodies.json"
    path.write_text(json.dumps(bodies))
    out = {}
    for concurrency in (1, 32):
        print(f"{name}: c={concurrency} ...", file=sys.stderr, flush=True)
        load = run_load(url, path, concurrency, duration, pids)
        out[concurrency] = {"qps": load["qps"], "p50_ms": load["p50_ms"], "p99_ms": load["p99_ms"],
                            "errors": load["errors"]["count"]}
    return out


def start_embedded(root: Path, collection: str, workdir: Path) -> tuple[subprocess.Popen[str], str]:
    """``shardrag serve --backend embedded`` as a user runs it (vector queries, no keys): (process, URL)."""
    serve = subprocess.Popen([sys.executable, "-m", "serving", "serve", "--backend", "embedded", "--collection",
                              collection, "--root", str(root), "--port", "0", "--no-encoder", "--open",
                              "--workdir", str(workdir)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = serve.stdout.readline() if serve.stdout else ""
        ready = parse_ready_line(line)
        if ready:
            return serve, str(ready["url"])
        if not line and serve.poll() is not None:
            break
    serve.kill()
    raise RuntimeError(f"shardrag serve --backend embedded did not start (exit {serve.poll()})")


def text_c1(send: Any, texts: list[str], rounds: int) -> dict[str, float]:
    for text in texts[:10]:  # warm-up
        send(text)
    latencies = []
    for _ in range(rounds):
        for text in texts:
            started = time.perf_counter()
            send(text)
            latencies.append(time.perf_counter() - started)
    return {"qps": len(latencies) / sum(latencies), **percentiles_ms(latencies)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chroma", type=Path, required=True, help="folder with chroma's `chroma` and `python`")
    parser.add_argument("--duration", type=float, default=6.0, help="measured seconds per load point (default 6)")
    parser.add_argument("--name", default="peers", help="results name under benchmarks/results (default peers)")
    parser.add_argument("--text-rounds", type=int, default=2, help="passes over the 100 texts, c=1 (default 2)")
    args = parser.parse_args()
    if not (args.chroma / "chroma").exists():
        sys.exit(f"--chroma {args.chroma}: no `chroma` there; install it into its own venv first (see --help)")
    corpus = load_corpus()
    exact = exact_top10(corpus)
    texts = [load_beir(data_dir() / n).queries[q] for n in ("msmarco", "dbpedia")
             for q in sorted(load_beir(data_dir() / n).queries)]
    work = scratch_dir("shardrag-peers-")
    results: dict[str, Any] = {"machine": machine_info(), "docs": len(corpus.doc_ids),
                               "queries": len(corpus.query_vectors), "engines": {}, "text_c1": {}}

    chroma, port = start_chroma(args.chroma, work)
    try:
        np.save(work / "vectors.npy", corpus.vectors)
        (work / "ids.json").write_text(json.dumps(corpus.doc_ids))
        setup = subprocess.run([str(args.chroma / "python"), "-c", CHROMA_SETUP, str(port), str(work / "vectors.npy"),
                                str(work / "ids.json")], capture_output=True, text=True, check=True)
        collections = json.loads(setup.stdout.strip().splitlines()[-1])
        for name, collection_id in collections.items():
            url = f"http://127.0.0.1:{port}{CHROMA_QUERY.format(id=collection_id)}"
            bodies = [{"query_embeddings": [v.tolist()], "n_results": 10, "include": ["distances"]}
                      for v in corpus.query_vectors]
            results["engines"][f"chroma {name}"] = {
                "recall_at_10": recall_of(chroma_answers(url, corpus.query_vectors), exact),
                "load": loads(url, bodies, work, f"chroma-{name}", args.duration, {"chroma": chroma.pid})}
        from retrieval.encoders import load_default_encoder

        encoder = load_default_encoder(device="cpu")
        url = f"http://127.0.0.1:{port}{CHROMA_QUERY.format(id=collections['default'])}"
        with httpx.Client(timeout=30) as client:
            def chroma_text(text: str) -> None:
                vector = encoder.encode_queries([text])[0]
                client.post(url, json={"query_embeddings": [vector.tolist()], "n_results": 10,
                                       "include": ["distances"]}).raise_for_status()
            print("chroma text c=1 ...", file=sys.stderr, flush=True)
            results["text_c1"]["chroma default + client-side MiniLM"] = text_c1(chroma_text, texts, args.text_rounds)
    finally:
        chroma.kill()
        chroma.wait()

    for factory in ("Flat", "HNSW32"):
        collection = f"peers-{factory}"
        build_collection(work / "root", corpus.documents, corpus.vectors, corpus.version,
                         BuildConfig(collection, 4, "hash", factory), show_progress=False)
        # the text path on one of them, its embedding cache off: each text is sent more than once
        gateway = GatewayConfig(encoder=EncoderSettings(cache_size=0)) if factory == "Flat" else VECTORS_ONLY
        with LocalCluster(work / "root", collection, replicas=1, gateway=gateway,
                          workdir=work / f"{collection}-logs") as cluster:
            pids = {c.name: c.process.pid for c in cluster.children() if c.process}
            bodies = [{"vector": v.tolist(), "k": 10} for v in corpus.query_vectors]
            results["engines"][f"shardrag 4 shards {factory}"] = {
                "recall_at_10": recall_of(gateway_answers(cluster.gateway_url, corpus.query_vectors), exact),
                "load": loads(f"{cluster.gateway_url}/v1/query", bodies, work, f"shardrag-{factory}", args.duration,
                              pids)}
            embedded, url = start_embedded(work / "root", collection, work / f"{collection}-embedded")
            try:
                results["engines"][f"shardrag 4 shards {factory}, embedded"] = {
                    "recall_at_10": recall_of(gateway_answers(url, corpus.query_vectors), exact),
                    "load": loads(f"{url}/v1/query", bodies, work, f"shardrag-{factory}-embedded", args.duration,
                                  {"gateway": embedded.pid})}
            finally:
                embedded.send_signal(signal.SIGINT)
                embedded.wait(60)
            if factory == "Flat":
                with httpx.Client(timeout=30) as client:
                    def shardrag_text(text: str, url: str = cluster.gateway_url) -> None:
                        client.post(f"{url}/v1/query", json={"text": text, "k": 10}).raise_for_status()
                    print("shardrag text c=1 ...", file=sys.stderr, flush=True)
                    results["text_c1"]["shardrag 4 shards Flat (gateway embeds)"] = text_c1(shardrag_text, texts,
                                                                                           args.text_rounds)
    written = write_result(args.name, results)
    report(results)
    print(f"\nwrote {written}")


def report(results: dict[str, Any]) -> None:
    base = results["engines"]["chroma default"]["load"]
    print(f"\n{'engine':38} {'c=1 QPS':>8} {'p50 ms':>7} {'c=32 QPS':>8} {'p99 ms':>7} {'recall':>6}   "
          "vs chroma default: c=1 p50, c=32 QPS")
    for name, row in results["engines"].items():
        one, many = row["load"].get(1) or row["load"]["1"], row["load"].get(32) or row["load"]["32"]
        b1, b32 = base.get(1) or base["1"], base.get(32) or base["32"]
        print(f"{name:38} {one['qps']:8.0f} {one['p50_ms']:7.2f} {many['qps']:8.0f} {many['p99_ms']:7.1f} "
              f"{row['recall_at_10']:6.3f}   ×{one['p50_ms'] / b1['p50_ms']:.2f}, ×{many['qps'] / b32['qps']:.2f}")
    print("\ntext queries, c=1:")
    for name, row in results["text_c1"].items():
        print(f"  {name:45} {row['qps']:6.1f} QPS, p50 {row['p50_ms']:.2f} ms, p99 {row['p99_ms']:.2f} ms")


if __name__ == "__main__":
    main()
