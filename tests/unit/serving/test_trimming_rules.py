"""Which FAISS factories per-shard top-k trimming may run on, measured on real indexes of the real
MiniLM vectors (msmarco + dbpedia, 10k): trimming is exact only where a shard's top k′ is the
first k′ of its top k, up to the order of equal scores and which of the hits tied at the last
score it keeps (the merge orders by score then id, and a shard whose last hit ties the merged k-th
is asked again). That holds for Flat, IVF-Flat, PQ (8-bit and 4-bit fast-scan), SQ and HNSW with
an ef_search ≥ k (the rule the fan-out applies); on refined indexes it does not, and
``trimming_blocker`` names them, so the fan-out never trims their shards."""

from __future__ import annotations

import faiss
import numpy as np
import pytest

from index_shards.faiss_index import skip_polysemous_training
from serving.shardcall.fanout import trimmed_k, trimming_blocker

K = 100
SHARDS = 4
ALLOWED = ["Flat", "IVF64,Flat", "IVF64,PQ16", "IVF64,SQ8", "PQ16", "HNSW32", "IVF64,PQ16x4fs", "PQ16x4fs"]
BLOCKED = ["IVF64,PQ16x4fs,RFlat", "IVF64,PQ16,Refine(SQ8)", "PQ16x4fs,RFlat"]


@pytest.fixture(scope="module")
def shard_and_queries(msmarco, dbpedia):
    vectors = np.concatenate([msmarco.vectors, dbpedia.vectors]).astype(np.float32)
    queries = np.concatenate([msmarco.query_vectors, dbpedia.query_vectors]).astype(np.float32)[:200]
    return vectors[:: SHARDS], queries  # one hash-like quarter: what one of 4 shards holds


@pytest.fixture(autouse=True)
def one_faiss_thread():
    """One FAISS thread while a test here trains and searches, the process's setting afterwards."""
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    yield
    faiss.omp_set_num_threads(before)


def not_a_prefix(factory: str, shard: np.ndarray, queries: np.ndarray) -> int:
    """Queries whose top trimmed_k(K, 4) on this index is not the first hits of its top K, up to
    the order of equal scores (the merge orders by score, then id) and to which of several hits tied
    at the trimmed list's last score it kept (such a shard is asked again for the full k)."""
    index = faiss.index_factory(shard.shape[1], factory, faiss.METRIC_INNER_PRODUCT)
    skip_polysemous_training(index)  # as the shards' builds do (index_shards.faiss_index.build_index)
    index.train(shard)
    index.add(shard)
    if factory.startswith("HNSW"):
        faiss.ParameterSpace().set_index_parameter(index, "efSearch", K)  # the fan-out's rule: ef_search ≥ k
    if "IVF" in factory:
        faiss.ParameterSpace().set_index_parameter(index, "nprobe", 8)
    small = trimmed_k(K, SHARDS, 0.9999)
    full_scores, full = index.search(queries, K)
    trimmed_scores, trimmed = index.search(queries, small)
    differing = 0
    for i in range(len(queries)):
        boundary = trimmed_scores[i, -1]
        above_full = {int(d) for d, s in zip(full[i, :small], full_scores[i, :small], strict=True) if s > boundary}
        above_trimmed = {int(d) for d, s in zip(trimmed[i], trimmed_scores[i], strict=True) if s > boundary}
        same_scores = np.array_equal(np.sort(full_scores[i, :small]), np.sort(trimmed_scores[i]))
        differing += int(above_full != above_trimmed or not same_scores)
    return differing


@pytest.mark.parametrize("factory", ALLOWED)
def test_trimming_is_exact_on_the_factories_it_runs_on(shard_and_queries, factory):
    assert trimming_blocker(factory) is None
    assert not_a_prefix(factory, *shard_and_queries) == 0


@pytest.mark.parametrize("factory", BLOCKED)
def test_the_blocked_factories_really_break_the_prefix(shard_and_queries, factory):
    assert trimming_blocker(factory) is not None and factory in trimming_blocker(factory)
    assert not_a_prefix(factory, *shard_and_queries) > 0  # measured, not guessed: else the block is not needed


def test_factory_names_are_read_case_blind_and_only_where_they_stand():
    assert trimming_blocker("ivf256,pq32x4fs,rflat") and trimming_blocker("HNSW32,Flat") is None
    assert trimming_blocker("OPQ16_64,IVF256,PQ16x4fs,Refine(SQ8)") and trimming_blocker("IVF256,PQ32x4fs") is None
