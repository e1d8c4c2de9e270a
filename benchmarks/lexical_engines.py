"""The lexical leg's engine: shardrag's own inverted index against bm25s on the same documents
(issue 36: ingest rate, memory and query time per million documents; why our own index).

    python -m benchmarks.lexical_engines                    # 1M documents, ~6 min on 2 cores
    python -m benchmarks.lexical_engines --docs 200000      # quicker
    python -m benchmarks.lexical_engines --no-bm25s         # ours only

Documents: grown from the 10k real passages of msmarco + dbpedia (each synthetic document joins
the first half of one real passage's words to the second half of another's, seeded), so their
lengths and vocabulary are real text's. Queries: the 100 real query texts, k=10, one thread.

Measured for ours (``index_shards.lexical``): building a base's index (``BaseLexicon.build``:
analysis + CSR postings), its memory (the arrays, and the resident memory the build left,
vocabulary included), a query (the shard's statistics and its BM25 top 10, as a one-shard
collection answers), and the write path's share (``SegmentLexicon.add`` per written document).
For bm25s (``benchmarks/bm25s_side.py`` in ``.venv-bm25s``: ``python -m venv .venv-bm25s &&
.venv-bm25s/bin/pip install bm25s==0.3.16 PyStemmer==3.1.0``): its index and query on the same
texts, with its own stop words and the same stemmer. The top-10 overlap between the two says how
alike the rankings are (the analyzers differ in stop words and tokenization).
JSON: benchmarks/results/lexical_engines.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import REPO, data_dir, machine_info, percentiles_ms, write_result
from index_shards.lexical import BaseLexicon, SegmentLexicon, query_terms, score
from retrieval.datasets import load_beir


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def synthesize(count: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """``count`` texts grown from the real passages, and the real query texts."""
    passages, queries = [], []
    for name in ("msmarco", "dbpedia"):
        dataset = load_beir(data_dir() / name)
        passages.extend(f"{d.title} {d.text}".split() for d in dataset.corpus)
        queries.extend(dataset.queries[q] for q in sorted(dataset.queries))
    rng = np.random.default_rng(seed)
    firsts, seconds = rng.integers(len(passages), size=count), rng.integers(len(passages), size=count)
    texts = []
    for a, b in zip(firsts.tolist(), seconds.tolist(), strict=True):
        head, tail = passages[a], passages[b]
        texts.append(" ".join(head[: len(head) // 2] + tail[len(tail) // 2:]))
    return texts, queries


def ours(texts: list[str], queries: list[str], k: int) -> dict[str, Any]:
    gc.collect()
    before = rss_bytes()
    started = time.perf_counter()
    lexicon = BaseLexicon.build((i, "", text) for i, text in enumerate(texts))
    build_s = time.perf_counter() - started
    gc.collect()
    memory = rss_bytes() - before
    latencies, answers = [], []
    nothing_hidden = np.zeros(0, dtype=np.int64)
    for query in queries:
        began = time.perf_counter()
        terms = query_terms(query)
        stats = lexicon.stats([t for t, _ in terms], nothing_hidden)
        postings = []
        for term, count in terms:
            rows, tfs = lexicon.postings(term)
            weight = stats.idf(term) * count
            if weight > 0 and rows.size:
                postings.append((weight, rows, tfs))
        scored = score(postings, lexicon.lengths, stats.average_length, lexicon.count)
        top = scored.rows[np.argsort(-scored.scores, kind="stable")[:k]]
        latencies.append(time.perf_counter() - began)
        answers.append(top.tolist())
    segment = SegmentLexicon()
    sample = texts[:20_000]
    began = time.perf_counter()
    for i, text in enumerate(sample):
        segment.add(f"w{i}", "", text)
    segment_rate = len(sample) / (time.perf_counter() - began)
    return {"build_s": build_s, "docs_per_s": len(texts) / build_s, "array_bytes": lexicon.nbytes,
            "rss_added_bytes": memory, "terms": len(lexicon.vocabulary), "postings": int(lexicon.rows.size),
            "latencies_s": latencies, "answers": answers, "segment_adds_per_s": segment_rate}


def bm25s_side(texts: list[str], queries: list[str], k: int, python: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        with (work / "docs.jsonl").open("w") as out:
            for text in texts:
                out.write(json.dumps({"text": text}) + "\n")
        (work / "queries.json").write_text(json.dumps(queries))
        subprocess.run([python, str(Path(__file__).with_name("bm25s_side.py")), "--work", str(work), "--k", str(k)],
                       check=True, cwd=REPO)
        result: dict[str, Any] = json.loads((work / "bm25s.json").read_text())
    result["docs_per_s"] = len(texts) / result["index_s"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=1_000_000)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--bm25s-python", default=".venv-bm25s/bin/python")
    parser.add_argument("--no-bm25s", action="store_true")
    args = parser.parse_args()
    texts, queries = synthesize(args.docs)
    print(f"{len(texts):,} documents, {len(queries)} queries", flush=True)
    results: dict[str, Any] = {"machine": machine_info(), "docs": len(texts), "queries": len(queries),
                               "ours": ours(texts, queries, args.k)}
    if not args.no_bm25s:
        python = str(REPO / args.bm25s_python) if not Path(args.bm25s_python).is_absolute() else args.bm25s_python
        if not Path(python).exists():
            raise SystemExit(f"{python} not found: python -m venv .venv-bm25s && .venv-bm25s/bin/pip install "
                             "bm25s==0.3.16 PyStemmer==3.1.0 (or --no-bm25s)")
        results["bm25s"] = bm25s_side(texts, queries, args.k, python)
    per_million = 1_000_000 / len(texts)
    print(f"\n{'engine':8} {'build s/1M':>10} {'docs/s':>9} {'MiB/1M (RSS)':>12} {'arrays MiB/1M':>13} "
          f"{'query p50 ms':>12} {'p99 ms':>8}")
    for name in ("ours", "bm25s"):
        if name not in results:
            continue
        row = results[name]
        build_s = row.get("build_s", row.get("index_s"))
        timing = percentiles_ms(row["latencies_s"])
        row["latency"] = timing
        print(f"{name:8} {build_s * per_million:10.1f} {row['docs_per_s']:9.0f} "
              f"{row.get('rss_added_bytes', row.get('memory_bytes', 0)) * per_million / 2**20:12.0f} "
              f"{row.get('array_bytes', 0) * per_million / 2**20:13.0f} "
              f"{timing['p50_ms']:12.2f} {timing['p99_ms']:8.2f}")
    mine = results["ours"]
    print(f"ours: {mine['terms']:,} terms, {mine['postings']:,} postings, "
          f"arrays {mine['array_bytes'] / 2**20:.0f} MiB; "
          f"the write path's analysis: {mine['segment_adds_per_s']:.0f} documents/s")
    if "bm25s" in results:
        theirs = results["bm25s"]
        overlap = [len(set(a) & set(b)) / max(len(a), 1) for a, b in zip(mine["answers"], theirs["answers"],
                                                                          strict=True)]
        results["top10_overlap_mean"] = statistics.mean(overlap)
        print(f"ours ÷ bm25s: build {mine['build_s'] / theirs['index_s']:.2f}×, memory (RSS) "
              f"{mine['rss_added_bytes'] / max(theirs['memory_bytes'], 1):.2f}×, arrays "
              f"{mine['array_bytes'] / max(theirs.get('array_bytes', 0), 1):.2f}×, query p50 "
              f"{mine['latency']['p50_ms'] / theirs['latency']['p50_ms']:.2f}×; top-10 overlap "
              f"{results['top10_overlap_mean']:.2f}")
    for name in ("ours", "bm25s"):  # the raw lists are long: keep the summary only
        if name in results:
            results[name].pop("answers", None)
            results[name].pop("latencies_s", None)
    written = write_result("lexical_engines", results)
    print(f"\nwrote {written}")


if __name__ == "__main__":
    main()
