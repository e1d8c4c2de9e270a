"""What tracing costs: query throughput with ``SHARDRAG_TRACING`` off vs on (no exporter: spans are
made, kept in each process's memory, sent nowhere), in one run (issue 37, acceptance 4: within 3 %).

    python -m benchmarks.tracing_overhead            # ~5 min on 2 cores

The 10k MiniLM passages (msmarco + dbpedia) on 4 Flat shards × 1 replica behind a gateway, twice:
four real local clusters up at once, two started with tracing off and two with it on (it is
chosen when a process starts; idle ones sleep), in the order off, on, on, off. Closed loop
(benchmarks/loadgen.py in its own process), vector queries (no encoder in the way), k=10, at c=1
and c=16, in short segments that alternate off, on, on, off, ... (``--pairs``, ``--duration``
each; pairs 1–2 on the first two clusters, 3–4 on the others, ...), so that the machine's drift
and each cluster's own luck hit both sides alike; each pair's QPS ratio (on ÷ off) is reported, with
their median, worst, and the ratio of all segments' sums. ``--sample``: the share of queries
traced while on (default 0.01, shardrag's default; ``--sample 1``: every query traced). JSON:
benchmarks/results/tracing_overhead[_sample<S>].json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from benchmarks.common import closed_loop, load_corpus, machine_info, write_result
from index_shards.build import BuildConfig, build_collection
from retrieval import env
from serving.gateway.config import GatewayConfig
from serving.local.launcher import LocalCluster

SHARDS = 4
PAIR_ORDERS = (("off", "on"), ("on", "off"))
STARTS = (("off", 0), ("on", 0), ("on", 1), ("off", 1))  # (tracing, which pair of clusters), in start order


@contextmanager
def cluster_with(root: Path, work: Path, tracing: str, sample: str) -> Iterator[LocalCluster]:
    """A local cluster whose processes start with ``SHARDRAG_TRACING=tracing`` (read at start)."""
    saved = {name: env.read(name) for name in ("SHARDRAG_TRACING", "SHARDRAG_TRACING_SAMPLE")}
    os.environ["SHARDRAG_TRACING"] = tracing
    os.environ["SHARDRAG_TRACING_SAMPLE"] = sample
    os.environ.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)  # on = spans made, exported nowhere
    try:
        config = GatewayConfig.from_dict({"encoder": {"load": False}})
        cluster = LocalCluster(root, "bench", replicas=1, gateway=config, workdir=work / f"logs-{tracing}")
        cluster.__enter__()
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    try:
        yield cluster
    finally:
        cluster.__exit__(None, None, None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=3.0, help="measured seconds per segment (default 3)")
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--pairs", type=int, default=10, help="off/on segment pairs per concurrency (default 10)")
    parser.add_argument("--sample", default="0.01",
                        help="SHARDRAG_TRACING_SAMPLE while on (default 0.01, the default; 1: every query traced)")
    args = parser.parse_args()
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    corpus = load_corpus()
    bodies = [{"vector": v.tolist(), "k": 10, "with_text": True} for v in corpus.query_vectors]
    results: dict[str, Any] = {"machine": machine_info(), "shards": SHARDS, "docs": len(corpus.doc_ids),
                               "segment_s": args.duration, "sample": float(args.sample), "segments": {}}
    with tempfile.TemporaryDirectory(prefix="shardrag-tracing-") as tmp, ExitStack() as clusters:
        work = Path(tmp)
        build_collection(work / "root-0", corpus.documents, corpus.vectors, corpus.version,
                         BuildConfig("bench", SHARDS), show_progress=False)
        # two clusters of each kind, started off, on, on, off: a cluster's own luck (where its
        # processes landed, what started before it) falls on both sides, as the pairs' order does
        urls: list[dict[str, str]] = [{}, {}]
        for number, (mode, group) in enumerate(STARTS):
            if number:
                shutil.copytree(work / "root-0", work / f"root-{number}")
            cluster = clusters.enter_context(cluster_with(work / f"root-{number}", work / f"c{number}", mode,
                                                          args.sample))
            urls[group][mode] = cluster.gateway_url
        for group in urls:
            for url in group.values():
                closed_loop(url, bodies, work, 4, 2.0)  # warm every connection and cache
        for c in concurrencies:
            segments: list[tuple[str, float]] = []
            for i in range(args.pairs):
                for mode in PAIR_ORDERS[i % 2]:
                    qps = closed_loop(urls[(i // 2) % 2][mode], bodies, work, c, args.duration)["qps"]
                    segments.append((mode, qps))
                    print(f"c={c} pair {i + 1}/{args.pairs} tracing {mode}: {qps:.0f} QPS", file=sys.stderr,
                          flush=True)
            results["segments"][str(c)] = segments
    pairs: dict[str, list[float]] = {}
    for c in concurrencies:
        qps = results["segments"][str(c)]
        pairs[str(c)] = [(qps[i][1] / qps[i + 1][1]) if qps[i][0] == "on" else (qps[i + 1][1] / qps[i][1])
                         for i in range(0, len(qps), 2)]
    results["ratio_on_over_off"] = {c: {"pairs": r, "median": statistics.median(r), "worst": min(r),
                                        "total": sum(q for m, q in results["segments"][c] if m == "on")
                                        / sum(q for m, q in results["segments"][c] if m == "off")}
                                    for c, r in pairs.items()}
    path = write_result("tracing_overhead" if args.sample == "0.01" else f"tracing_overhead_sample{args.sample}",
                        results)
    print(f"\n{'c':>4}  QPS off / on (means)   on ÷ off per pair   median   worst   all segments")
    for c in concurrencies:
        qps = results["segments"][str(c)]
        means = [statistics.fmean(q for m, q in qps if m == mode) for mode in ("off", "on")]
        ratio = results["ratio_on_over_off"][str(c)]
        print(f"{c:>4}  {means[0]:.0f} / {means[1]:.0f}   {', '.join(f'{r:.3f}' for r in ratio['pairs'])}   "
              f"{ratio['median']:.3f}   {ratio['worst']:.3f}   {ratio['total']:.3f}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
