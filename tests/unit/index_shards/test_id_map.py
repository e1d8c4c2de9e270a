"""The id map over Flat / HNSW / refine indexes: a plain ``IndexIDMap`` (no per-replica hash
table id → position built at load), reads by id through ``IdPositions``, and files written with
``IndexIDMap2`` before still load and read by id."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import faiss
import numpy as np
import pytest

from index_shards.faiss_index import (
    IdPositions,
    SearchableIndex,
    build_index,
    id_positions,
    read_index,
    reconstruct_ids,
    write_index,
)
from index_shards.filtered import FilteredSearcher
from index_shards.tuning import stored_ids, stored_vectors
from retrieval.errors import IndexIntegrityError


def _vectors(n: int, dim: int, seed: int = 5) -> np.ndarray:
    vectors = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def _shuffled_ids(n: int, seed: int = 6) -> np.ndarray:
    return np.random.default_rng(seed).permutation(np.arange(10 * n, 11 * n, dtype=np.int64))


@pytest.mark.parametrize("factory", ["Flat", "HNSW16", "IVF16,PQ8x4fs,Refine(SQ8)"])
def test_vectors_read_back_by_id_through_the_plain_map(tmp_path, factory):
    vectors, ids = _vectors(3000, 32), _shuffled_ids(3000)
    index = build_index(vectors, ids, factory)
    assert type(index) is faiss.IndexIDMap  # not IndexIDMap2: no hash table in every replica
    write_index(index, tmp_path / "index.faiss")
    loaded = read_index(tmp_path / "index.faiss", mmap=True)
    wanted = ids[[5, 2999, 0, 1234, 5]]  # any order, repeats allowed
    expected = vectors[[5, 2999, 0, 1234, 5]]
    searcher = FilteredSearcher(SearchableIndex.wrap(loaded, "cpu"), "ip")
    tolerance = 1e-6 if "SQ8" not in factory else 0.02  # the refine stage decodes 8-bit codes
    assert np.allclose(searcher.vectors(wanted), expected, atol=tolerance)
    assert np.array_equal(stored_ids(loaded), ids)
    assert np.allclose(stored_vectors(loaded, ids[:100]), vectors[:100], atol=tolerance)
    # filtered exact scan: the ids asked for, best first
    scores, found, plan = searcher.search(vectors[:2], 3, np.sort(ids[:500]))
    assert plan.strategy == "exact"
    assert found[:, 0].tolist() == ids[:2].tolist()


def test_an_index_map2_file_written_before_still_reads_by_id(tmp_path):
    vectors, ids = _vectors(2000, 16), _shuffled_ids(2000)
    legacy = faiss.IndexIDMap2(faiss.IndexFlatIP(16))
    legacy.add_with_ids(vectors, ids)
    write_index(legacy, tmp_path / "index.faiss")
    loaded = read_index(tmp_path / "index.faiss", mmap=True)
    assert isinstance(loaded, faiss.IndexIDMap2)
    assert id_positions(loaded) is None  # it keeps its own map
    searcher = FilteredSearcher(SearchableIndex.wrap(loaded, "cpu"), "ip")
    assert np.allclose(searcher.vectors(ids[[7, 3]]), vectors[[7, 3]], atol=1e-6)
    assert np.allclose(stored_vectors(loaded, ids[:50]), vectors[:50], atol=1e-6)


def test_an_id_the_index_does_not_hold_is_an_integrity_error():
    vectors, ids = _vectors(100, 8), _shuffled_ids(100)
    index = build_index(vectors, ids, "Flat")
    positions = id_positions(index)
    assert positions is not None
    with pytest.raises(IndexIntegrityError, match="7"):
        reconstruct_ids(index, np.asarray([ids[0], 7]), positions)
    with pytest.raises(IndexIntegrityError):
        IdPositions(np.zeros(0, dtype=np.int64)).of(np.asarray([1]))


def test_positions_from_an_id_vector_already_copied_match_a_fresh_copy():
    vectors, ids = _vectors(200, 8), _shuffled_ids(200)
    index = build_index(vectors, ids, "Flat")
    stored = faiss.vector_to_array(index.id_map)
    fresh, reused = id_positions(index), id_positions(index, stored)
    assert fresh is not None and reused is not None
    assert np.array_equal(fresh.of(ids[::-1]), reused.of(ids[::-1]))
    assert np.allclose(reconstruct_ids(index, ids[[5, 9]], reused), vectors[[5, 9]], atol=1e-6)


# Read in a fresh interpreter: this one's allocator may reuse pages freed by earlier tests.
_MEASURE = """
import sys
from pathlib import Path
from index_shards.faiss_index import read_index

def anon():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024

before = anon()
index = read_index(Path(sys.argv[1]), mmap=True)
print(anon() - before, index.ntotal)
"""


def _private_bytes_to_load(path: Path) -> int:
    output = subprocess.run([sys.executable, "-c", _MEASURE, str(path)], capture_output=True, text=True, check=True)
    grown, ntotal = (int(x) for x in output.stdout.split())
    assert ntotal > 0
    return grown


def test_loading_a_mapped_index_costs_no_hash_table_per_document(tmp_path):
    # IndexIDMap2 builds an unordered_map id → position when it is read (tens of bytes a
    # document, in each replica's private memory); the plain map keeps its 8-byte id vector.
    n = 200_000
    vectors, ids = _vectors(n, 8), _shuffled_ids(n)
    write_index(build_index(vectors, ids, "Flat"), tmp_path / "plain.faiss")
    legacy = faiss.IndexIDMap2(faiss.IndexFlatIP(8))
    legacy.add_with_ids(vectors, ids)
    write_index(legacy, tmp_path / "legacy.faiss")
    plain = _private_bytes_to_load(tmp_path / "plain.faiss")
    old = _private_bytes_to_load(tmp_path / "legacy.faiss")
    assert plain < 16 * n, (plain, old)
    assert old > plain + 16 * n, (plain, old)  # what the plain map saves, measured
