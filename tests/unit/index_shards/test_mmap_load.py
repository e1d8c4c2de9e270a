"""Memory-mapped shard loading: the same answers as an index read into memory, without a private
copy of the vectors (so replicas on one host share the file's pages)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from index_shards.build import BuildConfig, build_collection
from index_shards.layout import INDEX_FILE, resolve_version, shard_dir
from index_shards.shard import Shard
from retrieval.types import Document, EmbeddingVersion


def _anon_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon in /proc/self/status")


# 4-bit PQ codes: the same IndexIVFPQ layout as 8-bit, trained in a second instead of ~15
@pytest.mark.parametrize("factory", ["Flat", "IVF16,Flat", "HNSW16", "IVF16,PQ8x4"])
def test_mapped_index_answers_like_a_read_one_without_a_private_copy(tmp_path, factory):
    rng = np.random.default_rng(3)
    vectors = rng.standard_normal((40_000, 128)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    documents = [Document(f"d{i}", "") for i in range(len(vectors))]
    build_collection(tmp_path, documents, vectors, EmbeddingVersion("m", "0" * 64, 128),
                     BuildConfig("c", 1, "hash", factory), show_progress=False)
    directory = shard_dir(resolve_version(tmp_path, "c")[0], 0)
    queries = vectors[:50] + 0.01 * rng.standard_normal((50, 128)).astype(np.float32)

    read = Shard.load(directory, device="cpu", mmap=False)
    expected = read.search(queries, 10, nprobe=4 if "IVF" in factory else None, with_text=False)
    del read
    before = _anon_bytes()
    mapped = Shard.load(directory, device="cpu", mmap=True)
    found = mapped.search(queries, 10, nprobe=4 if "IVF" in factory else None, with_text=False)
    grown = _anon_bytes() - before
    assert [r["doc_ids"] for r in found] == [r["doc_ids"] for r in expected]
    assert np.allclose([r["scores"] for r in found], [r["scores"] for r in expected], atol=1e-6)
    if factory in ("Flat", "IVF16,Flat"):  # the vectors are the index: none of them copied
        index_bytes = (directory / INDEX_FILE).stat().st_size
        assert grown < 0.2 * index_bytes, f"{grown / 2**20:.1f} MiB private for a {index_bytes / 2**20:.1f} MiB index"
