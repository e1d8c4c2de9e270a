"""What a replica restart costs the lexical leg, built lazily (``--lexical-warm lazy``, the
behaviour before index_shards.lexical_warm) against ahead of the queries (``auto``, the default
once a replica has served a lexical query):

    python -m benchmarks.lexical_warm                    # 100k documents on one shard, ~1.5 min
    python -m benchmarks.lexical_warm --docs 300000

One shard (Flat, 384 dims, FAISS on one thread as a shard server runs it; random unit vectors:
the dense leg's answers are not under test, its latency is) of documents grown from the real
passages as ``benchmarks.lexical_engines`` grows them, a replica with a data dir, in process
(``ShardVersions``: what a shard server runs; a restart here is a new one opened on the same
files and data dir). Per mode, after a restart:

- the first lexical query's latency (the 100 real query texts afterwards, p50);
- dense queries' latency in a closed loop during the first seconds after the restart (as long as
  the index takes to build in process): under ``lazy`` nothing is built beside them; under
  ``auto`` the build runs beside them in a child process (``index_shards.lexical_warm``: what
  every build of a base this size does now); under ``auto-in-process`` the same warm-up builds in
  the serving process — as every build did before, a first lexical query's or a compaction's.

JSON: benchmarks/results/lexical_warm.json.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from benchmarks.common import machine_info, percentiles_ms, scratch_dir, write_result
from benchmarks.lexical_engines import synthesize
from index_shards import lexical_warm
from index_shards.build import BuildConfig, build_collection
from index_shards.layout import resolve_version, shard_dir
from index_shards.shard import Shard
from index_shards.versions import ShardVersions
from retrieval.bm25 import LexicalQuery
from retrieval.contract import SearchParams
from retrieval.types import Document, EmbeddingVersion

DIM = 384
APART_MIN_DOCS = lexical_warm.APART_MIN_DOCS


MODES = ("lazy", "auto", "auto-in-process")


def restart(directory: Path, data_dir: Path, mode: str) -> ShardVersions:
    # the threshold is read at each build: a huge one keeps the build in this process
    lexical_warm.APART_MIN_DOCS = 10**12 if mode == "auto-in-process" else APART_MIN_DOCS
    return ShardVersions(Shard.load(directory, device="cpu"), data_dir=data_dir, lexical_warm=mode.split("-")[0])


def lexical(replica: ShardVersions, text: str) -> float:
    began = time.perf_counter()
    replica.search(np.zeros((0, DIM), np.float32), SearchParams(10, None, lexical=True), [LexicalQuery(text)])
    return time.perf_counter() - began


def dense_loop(replica: ShardVersions, vectors: np.ndarray, seconds: float) -> list[float]:
    latencies: list[float] = []
    stop = time.perf_counter() + seconds
    i = 0
    while time.perf_counter() < stop:
        began = time.perf_counter()
        replica.search(vectors[i % len(vectors)][None, :], SearchParams(10, None))
        latencies.append(time.perf_counter() - began)
        i += 1
    return latencies


def one_mode(directory: Path, data_dir: Path, mode: str, queries: list[str], vectors: np.ndarray,
             window_s: float) -> dict[str, Any]:
    replica = restart(directory, data_dir, mode)
    dense = dense_loop(replica, vectors, window_s)
    if replica.warming is not None:
        replica.warming.join()
    first = lexical(replica, queries[0])
    after = [lexical(replica, q) for q in queries[1:]]
    replica.close()
    return {"mode": mode, "first_lexical_ms": first * 1000, "lexical_after_ms": percentiles_ms(after),
            "dense_during_window_ms": percentiles_ms(dense), "dense_queries": len(dense)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=2, help="restarts per mode, alternating (default 2)")
    args = parser.parse_args()
    faiss.omp_set_num_threads(1)  # as a shard server runs it (--faiss-threads 1): one core for the queries

    texts, queries = synthesize(args.docs)
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((args.docs, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    work = scratch_dir("lexical-warm-")
    documents = [Document(f"d{i}", text) for i, text in enumerate(texts)]
    started = time.perf_counter()
    build_collection(work / "root", documents, vectors, EmbeddingVersion("warm", "0" * 64, DIM),
                     BuildConfig("c", 1, factory="Flat"), show_progress=False)
    print(f"{args.docs:,} documents built into one Flat shard in {time.perf_counter() - started:.0f} s", flush=True)
    directory = shard_dir(resolve_version(work / "root", "c")[0], 0)
    data_dir = work / "data"
    replica = restart(directory, data_dir, "auto-in-process")  # serves a lexical query: the marker is written
    build_s = lexical(replica, queries[0])
    replica.close()
    window_s = max(1.0, build_s)
    print(f"the lexical index builds in {build_s:.1f} s in process; dense queries are timed for {window_s:.1f} s "
          "after each restart", flush=True)
    probe_vectors = vectors[rng.integers(args.docs, size=256)]
    runs: list[dict[str, Any]] = []
    for round_ in range(args.rounds):
        for mode in MODES:
            row = one_mode(directory, data_dir, mode, queries, probe_vectors, window_s)
            row["round"] = round_
            runs.append(row)
            dense = row["dense_during_window_ms"]
            print(f"round {round_} {mode:15}: first lexical query {row['first_lexical_ms']:9.1f} ms, then p50 "
                  f"{row['lexical_after_ms']['p50_ms']:.2f} ms; dense during the window p50 "
                  f"{dense['p50_ms']:.2f} / p99 {dense['p99_ms']:.2f} ms ({row['dense_queries']} queries)", flush=True)
    print("\n÷ lazy, per round (same sitting, modes in turn):")
    for round_ in range(args.rounds):
        row = {r["mode"]: r for r in runs if r["round"] == round_}
        lazy = row["lazy"]
        for mode in MODES[1:]:
            ours, base = row[mode]["dense_during_window_ms"], lazy["dense_during_window_ms"]
            print(f"round {round_} {mode:15}: first lexical query "
                  f"{row[mode]['first_lexical_ms'] / lazy['first_lexical_ms']:.4f}×, dense during the window p50 "
                  f"{ours['p50_ms'] / base['p50_ms']:.2f}×, p99 {ours['p99_ms'] / base['p99_ms']:.2f}×")
    written = write_result("lexical_warm", {"machine": machine_info(), "docs": args.docs, "dim": DIM,
                                            "build_s": build_s, "window_s": window_s, "runs": runs})
    print(f"\nwrote {written}")


if __name__ == "__main__":
    main()
