"""The grouping of a ranked list (serving.gateway.grouping): which groups, which hits, when full."""

from __future__ import annotations

import pytest

from retrieval.errors import InvalidRequest
from serving.gateway.grouping import check_grouping, first_depth, group_hits


def hits(*values):
    return [{"doc_id": f"d{i}", "score": 1.0 - i / 100, "metadata": {} if v is ... else {"g": v}}
            for i, v in enumerate(values)]


def test_groups_rank_by_their_best_hit_and_keep_their_best_hits():
    grouped, count, filled = group_hits(hits("a", "b", "a", "a", "c", "b", "d"), "g", 3, 2)
    assert [(h["doc_id"], h["group"]) for h in grouped] == [
        ("d0", "a"), ("d2", "a"), ("d1", "b"), ("d5", "b"), ("d4", "c")]
    assert count == 3 and not filled  # c holds one hit of two; d is below the third group


def test_full_groups_are_filled_and_lower_groups_are_left_out():
    grouped, count, filled = group_hits(hits("a", "b", "b", "c", "a", "c", "d"), "g", 2, 2)
    assert [h["doc_id"] for h in grouped] == ["d0", "d4", "d1", "d2"]
    assert count == 2 and filled


def test_values_compare_as_filters_compare_them():
    # 1 and 1.0 are one value (the group shows its best hit's); true and "1" are others
    grouped, count, _ = group_hits(hits(1.0, True, 1, "1"), "g", 5, 3)
    assert [(h["doc_id"], h["group"]) for h in grouped] == [("d0", 1.0), ("d2", 1.0), ("d1", True), ("d3", "1")]
    assert count == 3


def test_lists_join_every_element_and_documents_without_the_key_join_none():
    grouped, count, filled = group_hits(hits(["x", "y"], ..., [], None, "y", {"no": "objects"}), "g", 2, 2)
    assert [(h["doc_id"], h["group"]) for h in grouped] == [("d0", "x"), ("d0", "y"), ("d4", "y")]
    assert count == 2 and not filled


def test_refusals_name_the_field():
    check_grouping(None, None, 10, 1000)
    check_grouping("source", 10, 100, 1000)
    with pytest.raises(InvalidRequest) as refused:
        check_grouping(None, 2, 10, 1000)
    assert refused.value.field == "group_size"
    with pytest.raises(InvalidRequest) as refused:
        check_grouping("source", 11, 100, 1000)
    assert refused.value.field == "group_size" and "1100" in refused.value.message
    with pytest.raises(InvalidRequest) as refused:
        check_grouping("x" * 129, None, 10, 1000)
    assert refused.value.field == "group_by"


def test_the_first_read_holds_four_hits_per_place_within_the_cap():
    assert first_depth(1, 1, 1000) == 20
    assert first_depth(10, 3, 1000) == 120
    assert first_depth(100, 10, 1000) == 1000
