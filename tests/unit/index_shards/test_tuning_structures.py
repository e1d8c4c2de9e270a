"""The structures `shardrag tune --rebuild` tries instead of a published index."""

from __future__ import annotations

import pytest

from index_shards.tuning import structure_candidates
from retrieval.errors import ConfigError


def test_ivf_tries_fewer_and_more_lists_within_what_each_shard_can_train():
    # 5,000 vectors per shard train at most 5000 // 39 = 128 lists
    assert structure_candidates("IVF64,Flat", 384, 5_000) == ["IVF64,Flat", "IVF16,Flat", "IVF32,Flat", "IVF128,Flat"]
    # enough vectors for 8-bit PQ codebooks: code sizes of dim/4 and dim/8 bytes join in
    assert structure_candidates("IVF64,Flat", 384, 20_000)[-2:] == ["IVF64,PQ96", "IVF64,PQ48"]


def test_hnsw_tries_other_m_and_flat_tries_approximate_structures():
    assert structure_candidates("HNSW16", 384, 5_000) == ["HNSW16", "HNSW8", "HNSW24", "HNSW32", "HNSW48"]
    flat = structure_candidates("Flat", 384, 5_000)
    assert flat[0] == "Flat" and {"HNSW16", "HNSW32"} <= set(flat)
    lists = int(next(f for f in flat if f.startswith("IVF")).split(",")[0][3:])
    assert lists & (lists - 1) == 0 and 4 <= lists <= 5_000 // 39  # a power of two the shard can train


@pytest.mark.parametrize("factory", ["IVF64,PQ16", "IVF64,PQ16x4fs", "IVF64,SQ8", "HNSW32_PQ8"])
def test_compressed_originals_are_refused_naming_the_flag(factory):
    with pytest.raises(ConfigError) as caught:
        structure_candidates(factory, 384, 50_000)
    assert caught.value.field == "rebuild" and "original vectors" in caught.value.message
