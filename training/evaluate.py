"""Retrieval quality through the sharded index: the query is embedded with the version's
encoder, every shard of the version is searched (index_shards.Shard, the same search the shard
servers run) and the per-shard top-k lists are merged exactly as the gateway merges them
(retrieval.merge). nDCG@10, recall@10, recall@100 and MRR@10 over the judged queries."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from index_shards.layout import resolve_version, shard_dir
from index_shards.shard import Shard
from retrieval.datasets import BeirDataset
from retrieval.encoders import Encoder
from retrieval.merge import merge_topk_columns
from retrieval.search_quality import metrics_of


def evaluate_version(root: str | Path, collection: str, version_id: str, encoder: Encoder, dataset: BeirDataset, *,
                     depth: int = 100, with_rankings: bool = False) -> dict[str, Any]:
    """The metrics of one version (``with_rankings``: also each judged query's ranked doc ids)."""
    if encoder.version.id != version_id:
        raise ValueError(f"encoder is {encoder.version.id}, the collection version is {version_id}")
    directory, manifest = resolve_version(root, collection, version_id)
    shards = [Shard.load(shard_dir(directory, s), device="auto") for s in range(manifest.num_shards)]
    queries = dataset.judged_queries()
    query_ids = sorted(queries)
    vectors = np.ascontiguousarray(encoder.encode_queries([queries[q] for q in query_ids]), dtype=np.float32)
    per_shard = [shard.search(vectors, depth, with_text=False) for shard in shards]
    rankings = {}
    for row, query_id in enumerate(query_ids):
        columns = [(hits[row]["doc_ids"], hits[row]["scores"]) for hits in per_shard]
        rankings[query_id] = [columns[s][0][i] for s, i in merge_topk_columns(columns, depth)]
    return {
        **({"rankings": rankings} if with_rankings else {}),
        "version": version_id, "queries": len(query_ids), **metrics_of(rankings, dataset.qrels),
    }
