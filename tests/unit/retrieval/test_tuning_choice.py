"""The one binary form of tuning queries and of a shard's tuning answers (retrieval.tuning_choice)."""

from __future__ import annotations

import numpy as np
import pytest

from retrieval.errors import MalformedBody
from retrieval.tuning_choice import ShardTuning, decode_queries, decode_result, encode_queries, encode_result


def test_a_shard_result_and_tuning_queries_round_trip():
    rng = np.random.default_rng(0)
    result = ShardTuning(3, "HNSW32", 500, "ef_search", [8, 16], rng.random((4, 10)).astype(np.float32),
                         rng.integers(0, 500, (4, 10)), [rng.random((4, 10)).astype(np.float32) for _ in range(2)],
                         [rng.integers(0, 500, (4, 10)) for _ in range(2)], [0.01, 0.02], 0.0, 12345)
    back = decode_result(encode_result(result))
    assert (back.shard_id, back.factory, back.count, back.knob, back.values, back.seconds, back.index_bytes) == \
        (3, "HNSW32", 500, "ef_search", [8, 16], [0.01, 0.02], 12345)
    assert all(np.array_equal(a, b) for a, b in zip(back.ids, result.ids, strict=True))
    assert np.array_equal(back.exact_scores, result.exact_scores)
    exact = ShardTuning(0, "Flat", 10, None, [], np.zeros((2, 0), np.float32), np.zeros((2, 0), np.int64))
    assert decode_result(encode_result(exact)).knob is None
    queries, ids = rng.random((5, 8)).astype(np.float32), np.arange(5)
    got_queries, got_ids = decode_queries(encode_queries(queries, ids))
    assert np.array_equal(got_queries, queries) and np.array_equal(got_ids, ids)


@pytest.mark.parametrize("data", [b"", b"not an npz", encode_queries(np.full((2, 3), np.nan), np.arange(2))])
def test_bad_tuning_bodies_are_malformed_not_crashes(data):
    with pytest.raises(MalformedBody):
        decode_queries(data)
    with pytest.raises(MalformedBody):
        decode_result(data)
