"""`shardrag tune --rebuild` on a shard of real size: does linking an HNSW graph wider pay?

    python -m benchmarks.tune_rebuild                          # 100k vectors, one HNSW32 shard
    python -m benchmarks.tune_rebuild --size 20000 --shards 2  # quicker
    python -m benchmarks.tune_rebuild --pseudo                 # stored vectors as the tuning queries

A collection of ``--size`` vectors (the 10k real MiniLM passages of msmarco + dbpedia, grown by
``index_shards.synthetic.synthesize`` as ``benchmarks.scale`` grows them) is built as ``--factory``
(FAISS's efConstruction 40) and tuned by the real command, ``shardrag tune --rebuild --recall R``,
on the 100 real query texts embedded by MiniLM (a third held out) or, with ``--pseudo``, on
stored vectors. Every HNSW candidate is built twice — at the published breadth and wider
(``index_shards.tuning.breadth_candidates``) — and each is tuned against the same exact answers.

Printed and written (``benchmarks/results/<out>.json``): per structure its build time, chosen
knob value, recall and QPS at c=1 (one query at a time, the slowest shard's rate); the winner;
and, from the same measurements, the winner had ``--rebuild`` tried the published breadth only
(the command before breadths were compared): the QPS ratio at the target, and the build seconds
the wider candidates added (their slowest shard's each, on one core; the workers build side by
side).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import load_corpus, machine_info, query_texts, write_result
from index_shards.build import BuildConfig, build_collection
from index_shards.synthetic import synthesize
from retrieval.types import Document
from serving.cli.parser import build_parser


def best(structures: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The structure ``--rebuild`` chooses among ``structures`` (the most QPS at the target; a
    wider breadth only where it needs a smaller knob value than the narrower one)."""
    def narrower_as_good(s: dict[str, Any]) -> bool:
        return any(o["factory"] == s["factory"] and (o["ef_construction"] or 40) < (s["ef_construction"] or 40)
                   and o["chosen"] is not None and o["chosen"]["value"] <= s["chosen"]["value"] for o in structures)
    meeting = [s for s in structures if s["chosen"] is not None and not narrower_as_good(s)]
    return max(meeting, key=lambda s: s["chosen"]["qps"]) if meeting else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=100_000, help="vectors in the collection (default 100000)")
    parser.add_argument("--shards", type=int, default=1, help="shards (default 1: the size is one shard's)")
    parser.add_argument("--factory", default="HNSW32", help="the published structure (default HNSW32)")
    parser.add_argument("--recall", type=float, default=0.95, help="recall@10 target (default 0.95)")
    parser.add_argument("--pseudo", action="store_true", help="tune on 600 stored vectors instead of real queries")
    parser.add_argument("--out", default="tune_rebuild", help="results name under benchmarks/results")
    args = parser.parse_args()
    corpus = load_corpus()
    vectors = synthesize(np.ascontiguousarray(corpus.vectors, dtype=np.float32), args.size)
    documents = list(corpus.documents[:args.size]) + [Document(f"syn-{i}", f"synthetic passage {i}")
                                                      for i in range(len(corpus.documents), args.size)]
    with tempfile.TemporaryDirectory(prefix="shardrag-tune-rebuild-") as work:
        root = Path(work)
        started = time.perf_counter()
        build_collection(root, documents, vectors, corpus.version,
                         BuildConfig("c", args.shards, "hash", args.factory), show_progress=True)
        build_s = time.perf_counter() - started
        command = ["tune", "--collection", "c", "--root", str(root), "--rebuild", "--recall", str(args.recall),
                   "--json", str(root / "report.json")]
        if not args.pseudo:
            (root / "queries.txt").write_text("\n".join(query_texts()) + "\n")
            command += ["--queries", str(root / "queries.txt")]
        parsed = build_parser().parse_args(command)
        started = time.perf_counter()
        code = int(parsed.func(parsed))
        tune_s = time.perf_counter() - started
        report = json.loads((root / "report.json").read_text())
    structures = report["structures"]
    for s in structures:  # a report of the command before breadths were compared names neither
        s.setdefault("label", s["factory"])
        s.setdefault("ef_construction", None)
    published = structures[0]["ef_construction"]
    now, before = best(structures), best([s for s in structures if s["ef_construction"] == published])
    wider_build_s = sum(s["build_s"] for s in structures if s["ef_construction"] != published)
    result = {"machine": machine_info(), "size": args.size, "shards": args.shards, "factory": args.factory,
              "target": args.recall, "queries": "pseudo (600 stored vectors)" if args.pseudo else "100 real",
              "build_s": build_s, "tune_s": tune_s, "exit": code, "wider_build_s": wider_build_s,
              "structures": [{k: s[k] for k in ("label", "factory", "ef_construction", "build_s", "index_bytes",
                                                "chosen")} for s in structures],
              "chosen": now and now["label"], "chosen_published_breadth_only": before and before["label"],
              "qps_ratio": (now["chosen"]["qps"] / before["chosen"]["qps"]) if now and before else None}
    path = write_result(args.out, result)
    print(f"\n{args.size:,} vectors over {args.shards} shard(s), {args.factory}; tune --rebuild {tune_s:.1f} s "
          f"(build of the collection {build_s:.1f} s), exit {code}")
    for s in structures:
        c = s["chosen"]
        shown = (f"{s['knob']}={c['value']:<5} recall {c['recall']:.4f} (low {c['recall_low']:.4f}) "
                 f"{c['qps']:8.0f} QPS") if c else "misses the target"
        print(f"  {s['label']:18} build {s['build_s']:6.1f} s  {shown}")
    print(f"chosen: {result['chosen']}; with the published breadth only: {result['chosen_published_breadth_only']}"
          + (f"; QPS at the target ×{result['qps_ratio']:.2f}" if result["qps_ratio"] else "")
          + f"; the wider builds added {wider_build_s:.1f} s of build")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
