"""nDCG@10 of dense, lexical and hybrid search through the REST API of a sharded cluster (issue 36,
acceptance 4), and how the weighted fusion's default weights were chosen.

    python -m benchmarks.hybrid_quality          # ~3 min on 2 cores

Per dataset (msmarco, dbpedia): the corpus (MiniLM vectors from the embedding cache) on 3 shards,
real shard processes, the judged queries as text through ``POST /v1/query``. Modes: dense, lexical
(BM25 under the collection's statistics), hybrid rrf (k=60) and hybrid weighted.

The weights are chosen on **msmarco only**: every (dense weight w, lexical 1 − w) for w in 0.05 …
0.95 in steps of 0.05; the best nDCG@10 wins (a tie: the larger dense weight) and is applied
unchanged to dbpedia. ``retrieval.fusion.DEFAULT_WEIGHTS`` holds the result. A weighted hybrid
is the exact top k of the fused score over every document, so ``candidates`` changes only its
cost, not its answer (docs/hybrid.md) and is not part of the choice. JSON:
benchmarks/results/hybrid_quality.json.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import data_dir, machine_info, write_result
from index_shards.build import BuildConfig, build_collection
from retrieval.client import ShardragClient
from retrieval.datasets import BeirDataset, load_beir
from retrieval.embedding_cache import CachingEncoder, EmbeddingCache, default_cache_dir
from retrieval.encoders import encode_documents, load_default_encoder
from retrieval.fusion import DEFAULT_WEIGHTS, DENSE
from retrieval.ir_metrics import ndcg_at_k
from retrieval.search_quality import SearchSetting, rankings_of, settings_for
from serving.local.launcher import LocalCluster

SHARDS = 3
GRID = [round(0.05 * i, 2) for i in range(1, 20)]


def ndcg(client: ShardragClient, dataset: BeirDataset, setting: SearchSetting) -> float:
    """nDCG@10 of the judged queries through ``/v1/query`` at k=10 (``retrieval.search_quality``,
    what ``shardrag eval --url`` runs)."""
    return ndcg_at_k(rankings_of(client, dataset.judged_queries(), setting), dataset.qrels, 10)


def main() -> None:
    encoder = CachingEncoder(load_default_encoder(device="cpu"), EmbeddingCache(default_cache_dir()))
    results: dict[str, Any] = {"machine": machine_info(), "shards": SHARDS, "datasets": {}}
    for name in ("msmarco", "dbpedia"):
        dataset = load_beir(data_dir() / name)
        vectors = encode_documents(encoder, dataset.corpus, show_progress=True)
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp) / "root"
            build_collection(root, dataset.corpus, vectors, encoder.version, BuildConfig(name, SHARDS),
                             show_progress=False)
            with LocalCluster(root, name, replicas=1, workdir=Path(tmp) / "logs") as cluster, \
                    ShardragClient(cluster.gateway_url, timeout_s=120) as client:
                modes = {setting.label: ndcg(client, dataset, setting)
                         for setting in settings_for(("dense", "lexical", "rrf", "weighted"))}
                grid = {f"w={setting.dense_weight}": ndcg(client, dataset, setting)
                        for setting in settings_for((), GRID)}
        results["datasets"][name] = {"modes": modes, "weighted_grid": grid}
        print(f"\n{name}: " + ", ".join(f"{mode} {value:.4f}" for mode, value in modes.items()), flush=True)
    grid = results["datasets"]["msmarco"]["weighted_grid"]
    chosen = max(grid.items(), key=lambda item: (item[1], float(item[0][2:])))
    results["chosen_on_msmarco"] = chosen[0]
    default = f"w={DEFAULT_WEIGHTS[DENSE]}"
    results["default"] = default
    print(f"\nbest weighted fusion on msmarco: {chosen[0]} ({chosen[1]:.4f}); the default is {default}"
          + ("" if chosen[0] == default else "  ← DIFFERS: update retrieval.fusion"))
    print(f"\n{'dataset':8} {'dense':>7} {'lexical':>7} {'rrf':>7} {'weighted':>8}  hybrid ≥ both legs  "
          "best hybrid − dense")
    for name, data in results["datasets"].items():
        modes = data["modes"]
        best_leg = max(modes["dense"], modes["lexical"])
        hybrids = {"rrf": modes["hybrid rrf"], "weighted": modes["hybrid weighted"]}
        print(f"{name:8} {modes['dense']:7.4f} {modes['lexical']:7.4f} {modes['hybrid rrf']:7.4f} "
              f"{modes['hybrid weighted']:8.4f}  "
              + ", ".join(f"{k} {'yes' if v >= best_leg else 'NO'}" for k, v in hybrids.items())
              + f"  {max(hybrids.values()) - modes['dense']:+.4f}")
    written = write_result("hybrid_quality", results)
    print(f"\nwrote {written}")


if __name__ == "__main__":
    main()
