"""Ids and values in filters and reads, however many: chunks a ``has_id`` holds, a ``should`` of them past
one, judged by shardrag's own filter parser and ``Filter.matches``."""

from __future__ import annotations

import pytest

from integrations.lists import (
    IDS_PER_CONDITION,
    MAX_IDS_IN_FILTER,
    MAX_VALUES_IN_FILTER,
    any_condition,
    id_chunks,
    ids_condition,
)
from retrieval.filters import MAX_VALUES, parse_filter


def test_chunks_keep_the_first_of_each_id_in_order_and_fit_a_has_id():
    ids = [f"d{i}" for i in range(2_500)] + ["d7", "d0"]
    chunks = id_chunks(ids)
    assert [len(chunk) for chunk in chunks] == [1000, 1000, 500]
    assert sum(chunks, []) == [f"d{i}" for i in range(2_500)]
    assert IDS_PER_CONDITION <= MAX_VALUES and id_chunks([]) == []


@pytest.mark.parametrize("count", [1, 1_000, 1_001, 2_500, MAX_IDS_IN_FILTER])
def test_a_condition_selects_exactly_its_ids_and_the_gateway_parser_takes_it(count):
    ids = [f"doc-{i}" for i in range(count)]
    parsed = parse_filter({"must": [ids_condition(ids)]})  # raises, naming the part, where the API would refuse
    for doc_id in (ids[0], ids[-1], ids[count // 2]):
        assert parsed.matches(doc_id, {})
    assert not parsed.matches(f"doc-{count}", {}) and not parsed.matches("doc-", {})
    assert ("has_id" in ids_condition(ids)) == (count <= IDS_PER_CONDITION)


def test_too_many_or_no_ids_are_refused_naming_the_limit():
    with pytest.raises(ValueError, match="at most 16,000 ids, got 16,001"):
        ids_condition([f"d{i}" for i in range(MAX_IDS_IN_FILTER + 1)])
    with pytest.raises(ValueError, match="at least one id"):
        ids_condition([])


@pytest.mark.parametrize("count", [1, 1_024, 1_025, 5_000, MAX_VALUES_IN_FILTER])
def test_a_value_list_selects_exactly_its_values_and_the_gateway_parser_takes_it(count):
    values = list(range(count))
    parsed = parse_filter({"must": [any_condition("n", values)]})
    for n in (0, count - 1, count // 2):
        assert parsed.matches("d", {"n": n}) and parsed.matches("d", {"n": [-5, n]})
    assert not parsed.matches("d", {"n": count}) and not parsed.matches("d", {})
    assert ("match" in any_condition("n", values)) == (count <= MAX_VALUES)


def test_values_keep_their_kinds_and_long_value_lists_are_refused_naming_the_key():
    parsed = parse_filter({"must": [any_condition("flag", [1, True])]})  # a set would make them one value
    assert parsed.matches("d", {"flag": True}) and parsed.matches("d", {"flag": 1})
    with pytest.raises(ValueError, match="a filter on 'n' lists at most 16,384 values, got 16,385"):
        any_condition("n", range(MAX_VALUES_IN_FILTER + 1))
    with pytest.raises(ValueError, match="needs at least one value"):
        any_condition("n", [])


@pytest.mark.parametrize("translate", ["haystack", "llamaindex", "langchain"])
def test_every_framework_takes_a_value_list_longer_than_one_condition_holds(translate):
    values = [f"v{i}" for i in range(3_000)]
    if translate == "haystack":
        from integrations.haystack.filters import to_shardrag as haystack
        given = haystack({"field": "meta.tag", "operator": "in", "value": values})
    elif translate == "llamaindex":
        from llama_index.core.vector_stores.types import FilterOperator, MetadataFilter, MetadataFilters

        from integrations.llamaindex.filters import to_shardrag as llamaindex
        given = llamaindex(MetadataFilters(filters=[MetadataFilter(key="tag", value=values,
                                                                   operator=FilterOperator.IN)]))
    else:
        from integrations.langchain.filters import to_shardrag as langchain
        given = langchain({"tag": {"$in": values}})
    parsed = parse_filter(given)
    assert parsed.matches("d", {"tag": "v2999"}) and parsed.matches("d", {"tag": "v0"})
    assert not parsed.matches("d", {"tag": "v3000"})
