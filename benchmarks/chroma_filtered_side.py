"""The Chroma half of benchmarks/filtered_recall.py, run by the interpreter of a virtualenv holding
chromadb==1.5.9 (it imports nothing of shardrag). Reads the vectors, their metadata, the queries
and each query's filters (already in Chroma's ``where`` form) from ``--work``; adds everything to
one embedded collection (HNSW, inner product, M, construction_ef and search_ef as given);
answers every query
unfiltered and under each filter. Writes ``chroma.json`` there: per filter the ids and latencies."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

BATCH = 5000  # under Chroma's largest add


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", required=True)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--m", type=int, default=32)
    parser.add_argument("--ef-search", type=int, default=256)
    # FAISS's default efConstruction, the one shardrag's HNSW32 shards are built with: like with like
    parser.add_argument("--ef-construction", type=int, default=40)
    args = parser.parse_args()
    import chromadb

    work = Path(args.work)
    vectors = np.load(work / "vectors.npy", mmap_mode="r")
    with np.load(work / "metadata.npz") as meta:  # each meta[key] reads the array again: read them once
        topic, rank, uniform = meta["topic"], meta["rank"], meta["u"]
    queries = np.load(work / "queries.npy")
    plans = json.loads((work / "filters.json").read_text())  # per query: [[label, where], ...]
    client = chromadb.PersistentClient(path=str(work / "chroma"))
    collection = client.create_collection(
        "bench", embedding_function=None,
        metadata={"hnsw:space": "ip", "hnsw:M": args.m, "hnsw:construction_ef": args.ef_construction,
                  "hnsw:search_ef": args.ef_search})
    started = time.perf_counter()
    for start in range(0, len(vectors), BATCH):
        rows = range(start, min(start + BATCH, len(vectors)))
        collection.add(ids=[f"d{i}" for i in rows], embeddings=np.asarray(vectors[start:rows.stop]),
                       metadatas=[{"topic": int(topic[i]), "rank": int(rank[i]), "u": int(uniform[i])}
                                  for i in rows])
        if rows.stop % 100_000 < BATCH:  # an ingest of 1M takes a while: say how far it is
            took = time.perf_counter() - started
            print(f"chroma: {rows.stop:,} / {len(vectors):,} added in {took:.0f} s", flush=True)
    add_s = time.perf_counter() - started
    collection.query(query_embeddings=queries[:1].tolist(), n_results=args.k)  # warm
    answers: dict[str, list[dict[str, object]]] = {}
    for query, plan in zip(queries, plans, strict=True):
        for label, where in plan:
            began = time.perf_counter()
            found = collection.query(query_embeddings=[query.tolist()], n_results=args.k,
                                     **({"where": where} if where else {}))
            answers.setdefault(label, []).append({"ids": found["ids"][0], "s": time.perf_counter() - began})
    (work / "chroma.json").write_text(json.dumps({"add_s": add_s, "answers": answers}))


if __name__ == "__main__":
    main()
