"""The encoder on ONNX Runtime (fp32, int8) vs torch: speed in this process and quality.

    python -m benchmarks.onnx_encoder           # ~10 min on 2 cores (encodes 10k passages twice)

For each runtime — torch (sentence-transformers), ``onnx`` (fp32 export: the same embedding
version), ``onnx-int8`` (dynamic int8: a version of its own) — on 1 thread and on every core:
one query at a time (p50 ms over the 100 real queries, second round), batches of 32 queries
(queries/s), passages in batches of 64 (passages/s over 512 passages). Quality: every corpus
passage and judged query encoded by that runtime, exact search (FAISS Flat, inner product):
nDCG@10 and recall@100 on msmarco and dbpedia; torch's passage vectors come from the embedding
cache. The gateway end to end on ONNX: ``python -m benchmarks.encoder_service --variants
process,process-onnx``. JSON: benchmarks/results/onnx_encoder.json.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import faiss

from benchmarks.common import data_dir, machine_info, percentiles_ms, scratch_dir, write_result
from benchmarks.encoder_service import query_texts
from retrieval.datasets import load_beir
from retrieval.embedding_cache import CachingEncoder, EmbeddingCache, default_cache_dir
from retrieval.encoders import encode_documents, load_encoder
from retrieval.ir_metrics import ndcg_at_k, recall_at_k
from retrieval.onnx_export import export_onnx


def speed(encoder: Any, texts: list[str], passages: list[str], threads: int) -> dict[str, Any]:
    encoder.encode_queries(texts[:32])  # warm up
    single = []
    for round_ in range(2):
        for text in texts:
            began = time.perf_counter()
            encoder.encode_queries([text])
            if round_:
                single.append(time.perf_counter() - began)
    began = time.perf_counter()
    for start in range(0, len(texts), 32):
        encoder.encode_queries(texts[start:start + 32])
    batch_qps = len(texts) / (time.perf_counter() - began)
    began = time.perf_counter()
    encoder.encode_texts(passages)
    return {"threads": threads, "single": percentiles_ms(single), "batch32_qps": batch_qps,
            "passages_per_s": len(passages) / (time.perf_counter() - began)}


def quality(encoder: Any) -> dict[str, dict[str, float]]:
    rows = {}
    for name in ("msmarco", "dbpedia"):
        dataset = load_beir(data_dir() / name)
        vectors = encode_documents(encoder, dataset.corpus, show_progress=True)
        queries = dataset.judged_queries()
        query_ids = sorted(queries)
        index = faiss.IndexFlatIP(vectors.shape[1])
        index.add(vectors)
        _, found = index.search(encoder.encode_queries([queries[q] for q in query_ids]), 100)
        doc_ids = [d.doc_id for d in dataset.corpus]
        rankings = {q: [doc_ids[i] for i in row if i >= 0] for q, row in zip(query_ids, found)}
        rows[name] = {"ndcg@10": ndcg_at_k(rankings, dataset.qrels, 10),
                      "recall@100": recall_at_k(rankings, dataset.qrels, 100)}
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-quality", action="store_true", help="speed only (skips encoding the corpora)")
    args = parser.parse_args()
    work = scratch_dir("shardrag-onnx-bench-")
    exports: dict[str, float] = {}
    for precision in ("fp32", "int8"):
        began = time.perf_counter()
        export_onnx(None, work / precision, int8=precision == "int8")
        exports[precision] = time.perf_counter() - began
    texts = query_texts()
    passages = [f"{d.title} {d.text}" if d.title else d.text for d in load_beir(data_dir() / "msmarco").corpus[:512]]
    sources = {"torch": None, "onnx": str(work / "fp32"), "onnx-int8": str(work / "int8")}
    cores = len(os.sched_getaffinity(0))
    runtimes: dict[str, Any] = {}
    for runtime, model in sources.items():
        rows = []
        for threads in sorted({1, cores}):
            print(f"{runtime}, {threads} thread(s) ...", file=sys.stderr, flush=True)
            encoder = load_encoder(model, device="cpu", threads=threads)
            rows.append(speed(encoder, texts, passages, threads))
        runtimes[runtime] = {"version": encoder.version.id, "speed": rows}
        if not args.no_quality:
            print(f"{runtime}: quality ...", file=sys.stderr, flush=True)
            cached = CachingEncoder(encoder, EmbeddingCache(default_cache_dir())) if runtime == "torch" else encoder
            runtimes[runtime]["quality"] = quality(cached)
    result = {"machine": machine_info(), "export_s": exports, "queries": len(texts), "passages": len(passages),
              "runtimes": runtimes}
    print("\n== query encoder runtimes, in process (all-MiniLM-L6-v2, CPU) ==")
    print(f"export: fp32 {exports['fp32']:.1f} s, int8 {exports['int8']:.1f} s")
    torch_rows = {row["threads"]: row for row in runtimes["torch"]["speed"]}
    for runtime, entry in runtimes.items():
        for row in entry["speed"]:
            base = torch_rows[row["threads"]]
            print(f"{runtime:10} {row['threads']} thr  one query p50 {row['single']['p50_ms']:6.2f} ms "
                  f"(×{base['single']['p50_ms'] / row['single']['p50_ms']:.2f} faster than torch)  batch-32 "
                  f"{row['batch32_qps']:6.0f} q/s (×{row['batch32_qps'] / base['batch32_qps']:.2f})  passages "
                  f"{row['passages_per_s']:5.0f}/s (×{row['passages_per_s'] / base['passages_per_s']:.2f})")
    if not args.no_quality:
        print(f"\n{'runtime':10} {'version':48} {'msmarco nDCG@10':>15} {'dbpedia nDCG@10':>15}  Δ vs torch")
        for runtime, entry in runtimes.items():
            scores = entry["quality"]
            deltas = ", ".join(f"{n} {scores[n]['ndcg@10'] - runtimes['torch']['quality'][n]['ndcg@10']:+.4f}"
                               for n in scores)
            print(f"{runtime:10} {entry['version']:48} {scores['msmarco']['ndcg@10']:15.4f} "
                  f"{scores['dbpedia']['ndcg@10']:15.4f}  {deltas}")
    print(f"\nwrote {write_result('onnx_encoder', result)}")


if __name__ == "__main__":
    main()
