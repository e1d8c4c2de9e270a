"""LlamaIndex's filter operators in shardrag's language, judged by shardrag's own parser and
``Filter.matches`` on documents written as the LlamaIndex store writes them (``None`` values dropped)."""

from __future__ import annotations

import pytest
from llama_index.core.vector_stores.types import FilterCondition, FilterOperator, MetadataFilter, MetadataFilters

from integrations.llamaindex.filters import to_shardrag
from retrieval.filters import parse_filter

DOCS = {"a": {"year": 2019, "when": "2024-01-31T12:00:00Z", "tags": ["x", "y"]},
        "b": {"year": 2023, "when": "2024-02-01T00:30:00+01:00", "tags": []},
        "c": {"year": 2024, "when": "2025-06-01"},
        "d": {}}


def selected(*filters: MetadataFilter, condition: FilterCondition = FilterCondition.AND) -> set[str]:
    parsed = parse_filter(to_shardrag(MetadataFilters(filters=list(filters), condition=condition)))
    return {doc_id for doc_id, metadata in DOCS.items() if parsed.matches(doc_id, metadata)}


def test_is_empty_selects_an_absent_key_or_an_empty_list_and_not_selects_the_rest():
    assert selected(MetadataFilter(key="tags", value=None, operator=FilterOperator.IS_EMPTY)) == {"b", "c", "d"}
    assert selected(MetadataFilter(key="year", value=None, operator=FilterOperator.IS_EMPTY)) == {"d"}
    nested = MetadataFilters(filters=[MetadataFilter(key="tags", value=None, operator=FilterOperator.IS_EMPTY)],
                             condition=FilterCondition.NOT)
    parsed = parse_filter(to_shardrag(nested))
    assert {doc_id for doc_id, metadata in DOCS.items() if parsed.matches(doc_id, metadata)} == {"a"}


def test_ranges_compare_numbers_and_date_times_as_instants():
    assert selected(MetadataFilter(key="year", value=2023, operator=FilterOperator.GTE)) == {"b", "c"}
    # 2024-02-01T00:30+01:00 is 2024-01-31T23:30Z: before midnight UTC
    assert selected(MetadataFilter(key="when", value="2024-02-01T00:00:00Z", operator=FilterOperator.LT)) == {"a", "b"}
    assert selected(MetadataFilter(key="when", value="2024-01-31T12:00:00Z", operator=FilterOperator.GT),
                    MetadataFilter(key="when", value="2025-01-01", operator=FilterOperator.LTE)) == {"b"}


@pytest.mark.parametrize("value", ["2024-13-01", "soon", [2020]])
def test_a_range_on_anything_else_is_refused_naming_the_key(value):
    with pytest.raises(ValueError, match="filter on 'when': .* compares numbers or ISO 8601 date-times"):
        to_shardrag(MetadataFilters(filters=[MetadataFilter(key="when", value=value, operator=FilterOperator.GT)]))


@pytest.mark.parametrize("operator", [FilterOperator.TEXT_MATCH, FilterOperator.TEXT_MATCH_INSENSITIVE])
def test_substring_matches_are_not_filters_here(operator):
    with pytest.raises(NotImplementedError, match=operator.value):
        to_shardrag(MetadataFilters(filters=[MetadataFilter(key="title", value="fjord", operator=operator)]))


def test_an_empty_in_selects_nothing_and_an_empty_nin_everything():
    assert selected(MetadataFilter(key="year", value=[], operator=FilterOperator.IN)) == set()
    assert selected(MetadataFilter(key="year", value=[], operator=FilterOperator.NIN)) == set(DOCS)
