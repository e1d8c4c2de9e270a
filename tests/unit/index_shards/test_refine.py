"""A refine stage on real FAISS shards: 4-bit IVF-PQ codes whose best k_factor·k candidates are
re-ranked on fuller vectors — ids kept through the id map, k_factor a knob (built in, tunable in
search.json), much higher recall than the codes alone, and the tuner can decode it."""

from __future__ import annotations

import numpy as np
import pytest

from index_shards.build import BuildConfig, build_collection
from index_shards.faiss_index import REFINE_K_FACTOR, build_index, native_search_params
from index_shards.ids import doc_int_ids
from index_shards.layout import resolve_version, shard_dir
from index_shards.search_defaults import SearchDefaults, write_search_defaults
from index_shards.shard import Shard
from index_shards.tuning import ShardTask, evaluate_shard, sample_queries
from retrieval.errors import IndexIntegrityError
from retrieval.tuning_choice import is_lossy
from retrieval.types import Document, EmbeddingVersion

N, DIM, K = 6000, 64, 10
REFINED = "IVF32,PQ16x4fs,Refine(SQ8)"


def clustered(seed: int = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((40, DIM))
    vectors = centres[rng.integers(0, 40, N)] + 0.6 * rng.standard_normal((N, DIM))
    return (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    vectors = clustered()
    documents = [Document(f"d{i}", f"text {i}") for i in range(N)]
    version = EmbeddingVersion("refine", "r" * 64, DIM)
    roots = {}
    for factory in ("IVF32,PQ16x4fs", REFINED, "IVF32,PQ16x4fs,RFlat"):
        root = tmp_path_factory.mktemp("root")
        build_collection(root, documents, vectors, version, BuildConfig("c", 1, factory=factory), show_progress=False)
        roots[factory] = resolve_version(root, "c")[0]
    return vectors, roots


def recall(shard: Shard, vectors: np.ndarray, queries: np.ndarray, **knobs: int) -> float:
    exact = np.argsort(-(queries @ vectors.T), axis=1)[:, :K]
    rows = shard.search(queries, K, with_text=False, **knobs)
    return float(np.mean([len({f"d{j}" for j in want} & set(row["doc_ids"])) / K
                          for want, row in zip(exact, rows, strict=True)]))


def test_the_refine_stage_keeps_ids_and_carries_its_k_factor_in_the_file(built):
    vectors, roots = built
    index = build_index(vectors[:2000], np.arange(5000, 7000, dtype=np.int64), REFINED)
    assert native_search_params(index) == {"nprobe": 1, "k_factor": REFINE_K_FACTOR}
    _, ids = index.search(vectors[:3], 1)
    assert ids[:, 0].tolist() == [5000, 5001, 5002]  # the ids given, not positions
    for mmap in (False, True):
        shard = Shard.load(shard_dir(roots[REFINED], 0), device="cpu", mmap=mmap)
        assert shard.index.native == {"nprobe": 1, "k_factor": REFINE_K_FACTOR}


def test_re_ranking_lifts_recall_far_above_the_codes_alone(built):
    vectors, roots = built
    queries = vectors[:60] + 0.05 * np.random.default_rng(1).standard_normal((60, DIM)).astype(np.float32)
    codes_only = recall(Shard.load(shard_dir(roots["IVF32,PQ16x4fs"], 0), device="cpu"), vectors, queries, nprobe=8)
    refined = recall(Shard.load(shard_dir(roots[REFINED], 0), device="cpu"), vectors, queries, nprobe=8)
    exact_refine = recall(Shard.load(shard_dir(roots["IVF32,PQ16x4fs,RFlat"], 0), device="cpu"), vectors, queries,
                          nprobe=8)
    assert codes_only < 0.8 and refined >= 0.9 and exact_refine >= 0.9, (codes_only, refined, exact_refine)
    assert refined - codes_only > 0.15


def test_k_factor_from_search_json_is_used_and_a_flat_index_refuses_it(built, tmp_path):
    vectors, roots = built
    queries = vectors[:60] + 0.05 * np.random.default_rng(2).standard_normal((60, DIM)).astype(np.float32)
    directory = roots[REFINED]
    wide = recall(Shard.load(shard_dir(directory, 0), device="cpu"), vectors, queries, nprobe=8)
    write_search_defaults(directory, SearchDefaults(k_factor=1))
    try:
        shard = Shard.load(shard_dir(directory, 0), device="cpu")
        assert shard.index.defaults == {"k_factor": 1}
        narrow = recall(shard, vectors, queries, nprobe=8)
    finally:
        (directory / "search.json").unlink()
    assert narrow < wide - 0.1, (narrow, wide)  # one candidate per hit: the codes' order, barely re-ranked
    flat_root = tmp_path / "flat"
    build_collection(flat_root, [Document(f"d{i}", "t") for i in range(50)], vectors[:50],
                     EmbeddingVersion("refine", "r" * 64, DIM), BuildConfig("c", 1), show_progress=False)
    flat_dir = resolve_version(flat_root, "c")[0]
    write_search_defaults(flat_dir, SearchDefaults(k_factor=8))
    with pytest.raises(IndexIntegrityError, match="k_factor"):
        Shard.load(shard_dir(flat_dir, 0), device="cpu")


def test_the_tuner_decodes_a_refined_shard_and_tunes_its_nprobe(built):
    vectors, roots = built
    directory = str(shard_dir(roots["IVF32,PQ16x4fs,RFlat"], 0))
    queries, own_ids = sample_queries(directory, 30, seed=0)  # fast-scan codes alone would refuse this
    result = evaluate_shard(ShardTask(directory, queries, own_ids, K, max_value=8))
    assert result.knob == "nprobe" and result.values == [1, 2, 3, 4, 6, 8]
    # exact answers come from the refine stage's full vectors: each pseudo-query's truth is exact
    int_ids = doc_int_ids(f"d{i}" for i in range(N))
    exact_top = int_ids[np.argsort(-(queries @ vectors.T), axis=1)[:, :K + 1]]
    for row, own in enumerate(own_ids):
        want = [int(j) for j in exact_top[row] if int(j) != int(own)][:K]
        assert sorted(result.exact_ids[row].tolist()) == sorted(want)
    assert not is_lossy("IVF32,PQ16x4fs,RFlat") and not is_lossy("IVF32,PQ16x4fs,Refine(Flat)")
    assert is_lossy(REFINED) and is_lossy("IVF32,PQ16x4fs")
