"""The structures `shardrag tune --rebuild` tries instead of a published index."""

from __future__ import annotations

import numpy as np
import pytest

from index_shards.tuning import (
    Structure,
    breadth_candidates,
    choose_structure,
    structure_candidates,
    structures_to_try,
)
from retrieval.errors import ConfigError
from retrieval.tuning_choice import ShardTuning


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


def test_every_hnsw_candidate_is_also_linked_wider_than_published():
    assert breadth_candidates("HNSW32", None) == [None, 100]  # FAISS's 40, then 100
    assert breadth_candidates("HNSW32", 64) == [64, 128]
    assert breadth_candidates("HNSW32", 100) == [100, 200]
    assert breadth_candidates("HNSW32", 800) == [800]  # wide enough: nothing wider is tried
    assert breadth_candidates("IVF64,Flat", 100) == [None]  # no graph
    tried = structures_to_try("HNSW16", 384, 5_000, None)
    assert tried[:2] == [Structure("HNSW16"), Structure("HNSW16", 100)]  # the published one first, as it is
    assert len(tried) == 10 and len(set(tried)) == 10  # M 16, 8, 24, 32, 48 at both breadths
    flat = structures_to_try("Flat", 384, 5_000, None)
    assert flat[0] == Structure("Flat") and Structure("HNSW32", 100) in flat
    assert all(s.ef_construction is None for s in flat if "HNSW" not in s.factory)  # no graph, no breadth
    assert [s.label for s in flat[:3]] == ["Flat", "HNSW16", "HNSW16 efC100"]


def test_the_breadths_asked_for_replace_the_default_pair_and_40_is_faiss_default():
    # --ef-construction 40: M alone, as before breadths were compared (40 is the published None)
    assert structures_to_try("HNSW16", 384, 5_000, None, [40]) == [Structure(f"HNSW{m}") for m in (16, 8, 24, 32, 48)]
    wide = structures_to_try("HNSW16", 384, 5_000, 64, [40, 64, 200])
    assert wide[0] == Structure("HNSW16", 64)  # the published graph, as published, first
    assert {s.ef_construction for s in wide if s.factory == "HNSW8"} == {None, 64, 200}
    assert len(wide) == 15  # 5 M × 3 breadths, the published one once
    ivf = structures_to_try("IVF64,Flat", 384, 5_000, None, [100])
    assert all(s.ef_construction is None for s in ivf)  # no graph: breadths do not apply
    with pytest.raises(ConfigError) as caught:
        structures_to_try("HNSW16", 384, 5_000, None, [1])
    assert caught.value.field == "ef_construction"


def tuning(right_from: int, seconds: float) -> ShardTuning:
    """One shard's answers to 40 queries (query i's true neighbour is id i) at ef_search 8, 16,
    32: right from ``right_from`` on, wrong below it; every value timed at ``seconds``."""
    n, values = 40, [8, 16, 32]
    truth = np.arange(n, dtype=np.int64)[:, None]
    answers = [truth if value >= right_from else truth + 1000 for value in values]
    return ShardTuning(0, "HNSW16", 1000, "ef_search", values, np.ones((n, 1), np.float32), truth,
                       [np.ones((n, 1), np.float32)] * 3, answers, [seconds] * 3)


def choice(narrow: ShardTuning, wide: ShardTuning) -> str | None:
    rows = np.arange(40)
    _, best = choose_structure({Structure("HNSW16"): [narrow], Structure("HNSW16", 100): [wide]}, 0.9, 1, rows,
                               np.zeros(0, dtype=np.int64))
    return best.label if best else None


def test_a_wider_build_wins_only_where_it_needs_a_smaller_knob_value():
    # the same ef_search meets the target on both: the wider build's faster timing is noise, the narrower kept
    assert choice(tuning(16, seconds=1.0), tuning(16, seconds=0.5)) == "HNSW16"
    # the wider graph meets it at a smaller ef_search: it competes, and serves more queries a second
    assert choice(tuning(16, seconds=1.0), tuning(8, seconds=0.5)) == "HNSW16 efC100"
    # ... and still loses to a faster narrower choice (it competes on QPS like any structure)
    assert choice(tuning(16, seconds=0.5), tuning(8, seconds=1.0)) == "HNSW16"
    # the narrower misses the target at every value: the wider one is the only choice
    assert choice(tuning(64, seconds=0.5), tuning(32, seconds=1.0)) == "HNSW16 efC100"
