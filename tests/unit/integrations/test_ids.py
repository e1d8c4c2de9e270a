"""Ids in filters and reads, however many: chunks a ``has_id`` holds, a ``should`` of them past
one, judged by shardrag's own filter parser and ``Filter.matches``."""

from __future__ import annotations

import pytest

from integrations.ids import IDS_PER_CONDITION, MAX_IDS_IN_FILTER, id_chunks, ids_condition
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
