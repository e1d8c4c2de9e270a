"""The filter language: what it means on one document, its canonical form, and refusals that name
the path of the bad clause."""

import pytest

from retrieval.errors import InvalidRequest
from retrieval.filters import check_metadata, filter_from_canonical, parse_filter

DOC = {"lang": "en", "year": 2021, "score": 0.5, "draft": False, "tags": ["a", "b"], "none": [],
       "at": "1969-07-21T20:17:40"}


@pytest.mark.parametrize("data, expected", [
    ({}, True),
    ({"must": [{"key": "lang", "match": {"value": "en"}}]}, True),
    ({"must": [{"key": "lang", "match": {"value": "de"}}]}, False),
    ({"must": [{"key": "tags", "match": {"value": "b"}}]}, True),  # any element of a list
    ({"must": [{"key": "tags", "match": {"any": ["x", "a"]}}]}, True),
    ({"must": [{"key": "year", "range": {"gte": 2020, "lt": 2022}}]}, True),
    ({"must": [{"key": "year", "range": {"gt": 2021}}]}, False),
    ({"must": [{"key": "score", "range": {"lte": 0.5}}]}, True),
    ({"must": [{"key": "lang", "range": {"gte": 0}}]}, False),  # a range never holds on a string
    ({"must": [{"key": "draft", "range": {"gte": 0}}]}, False),  # nor on a boolean
    ({"must": [{"key": "draft", "match": {"value": False}}]}, True),
    ({"must": [{"key": "draft", "match": {"value": 0}}]}, False),  # false is not 0
    ({"must": [{"key": "year", "match": {"value": 2021.0}}]}, True),  # 2021.0 is 2021
    ({"must": [{"key": "missing", "match": {"value": "x"}}]}, False),
    ({"must_not": [{"key": "missing", "match": {"value": "x"}}]}, True),
    ({"should": [{"key": "lang", "match": {"value": "de"}}, {"has_id": ["d1"]}]}, True),
    ({"should": [{"key": "lang", "match": {"value": "de"}}, {"has_id": ["d2"]}]}, False),
    ({"must": [{"key": "at", "range": {"gt": "1969-07-21T20:17:39"}}]}, True),  # date-times compare as instants
    ({"must": [{"key": "at", "range": {"gte": "1969-07-21T21:17:41+01:00"}}]}, False),
    ({"must": [{"key": "at", "range": {"lte": "1969-07-21T20:17:40Z", "gt": "1969-07-21"}}]}, True),
    ({"must": [{"key": "lang", "range": {"gt": "1969-07-21"}}]}, False),  # "en" is not a date-time
    ({"must": [{"key": "year", "range": {"gt": "1969-07-21"}}]}, False),  # nor is a number
    ({"must": [{"is_empty": {"key": "missing"}}]}, True),
    ({"must": [{"is_empty": {"key": "none"}}]}, True),  # an empty list
    ({"must": [{"is_empty": {"key": "draft"}}]}, False),  # false is a value
    ({"must_not": [{}]}, False),  # matches nothing
    ({"must": [{"should": [{"key": "year", "range": {"lt": 2000}}, {"key": "tags", "match": {"value": "a"}}]}],
      "must_not": [{"must": [{"key": "lang", "match": {"value": "en"}}, {"key": "draft", "match": {"value": True}}]}]},
     True),
])
def test_meaning_on_one_document(data, expected):
    assert parse_filter(data).matches("d1", DOC) is expected


@pytest.mark.parametrize("data, field", [
    ([], "filter"),
    ({"bogus": []}, "filter.bogus"),
    ({"must": {}}, "filter.must"),
    ({"must": [5]}, "filter.must[0]"),
    ({"must": [{"key": "", "match": {"value": 1}}]}, "filter.must[0].key"),
    ({"must": [{"key": "a", "eq": 1}]}, "filter.must[0].eq"),
    ({"must": [{"key": "a"}]}, "filter.must[0]"),
    ({"must": [{"key": "a", "match": {"value": 1}, "range": {"gt": 1}}]}, "filter.must[0]"),
    ({"must": [{"key": "a", "match": {"value": {"x": 1}}}]}, "filter.must[0].match.value"),
    ({"must": [{"key": "a", "match": {"equals": 1}}]}, "filter.must[0].match"),
    ({"must": [{"key": "a", "match": {"any": []}}]}, "filter.must[0].match.any"),
    ({"must": [{"key": "a", "match": {"any": [1, None]}}]}, "filter.must[0].match.any[1]"),
    ({"should": [{}, {"key": "y", "range": {"gte": "2020"}}]}, "filter.should[1].range.gte"),
    ({"must": [{"key": "y", "range": {"between": [1, 2]}}]}, "filter.must[0].range.between"),
    ({"must": [{"key": "y", "range": {"gt": True}}]}, "filter.must[0].range.gt"),
    ({"must": [{"key": "y", "range": {}}]}, "filter.must[0].range"),
    ({"must": [{"key": "y", "range": {"gt": "2020-01-01", "lt": 5}}]}, "filter.must[0].range.lt"),
    ({"must": [{"key": "y", "range": {"gt": "2020-02-30"}}]}, "filter.must[0].range.gt"),
    ({"must": [{"is_empty": "y"}]}, "filter.must[0].is_empty"),
    ({"must": [{"is_empty": {"key": ""}}]}, "filter.must[0].is_empty.key"),
    ({"must": [{"is_empty": {"key": "y"}, "key": "y"}]}, "filter.must[0]"),
    ({"must": [{"has_id": []}]}, "filter.must[0].has_id"),
    ({"must": [{"has_id": ["a", 3]}]}, "filter.must[0].has_id[1]"),
    ({"must": [{"has_id": ["a"], "key": "x"}]}, "filter.must[0]"),
    ({"must": [{"must": [{"must": [{"must": [{"must": [{"must": []}]}]}]}]}]},
     "filter.must[0].must[0].must[0].must[0].must[0]"),
])
def test_refusals_name_the_bad_clause(data, field):
    with pytest.raises(InvalidRequest) as caught:
        parse_filter(data)
    assert caught.value.field == field


def test_too_many_conditions_are_refused():
    with pytest.raises(InvalidRequest, match="at most 16 conditions") as caught:
        parse_filter({"should": [{"key": "k", "match": {"value": i}} for i in range(17)]})
    assert caught.value.field == "filter.should"
    wide = {"should": [{"should": [{"should": [{"key": "k", "match": {"value": i}} for i in range(16)]}
                                   for _ in range(16)]} for _ in range(2)]}
    with pytest.raises(InvalidRequest, match="more than 256 conditions"):
        parse_filter(wide)


def test_the_canonical_form_round_trips_and_ignores_value_order():
    a = parse_filter({"must": [{"key": "t", "match": {"any": ["b", "a"]}},
                               {"key": "y", "range": {"lt": 3, "gte": 1}}]})
    b = parse_filter({"must": [{"key": "t", "match": {"any": ["a", "b"]}},
                               {"key": "y", "range": {"gte": 1.0, "lt": 3}}]})
    assert a.canonical() == b.canonical()
    assert filter_from_canonical(a.canonical()) == a
    dated = parse_filter({"must": [{"key": "at", "range": {"lt": "2024-01-31T12:00:00+02:00"}},
                                   {"is_empty": {"key": "lang"}}]})
    assert filter_from_canonical(dated.canonical()) == dated
    assert parse_filter({}).empty and parse_filter({"must": []}).empty


def test_metadata_is_flat_and_typed():
    assert check_metadata({"a": 1, "b": "x", "c": [" y"], "d": True, "e": 0.5, "f": -(2**63), "g": 2**63 - 1}) == \
        {"a": 1, "b": "x", "c": [" y"], "d": True, "e": 0.5, "f": -(2**63), "g": 2**63 - 1}
    for bad, field in (([1], "metadata"), ({"a": {"b": 1}}, "metadata.a"), ({"a": [1]}, "metadata.a"),
                       ({"big": 2**63}, "metadata.big"), ({"small": -(2**63) - 1}, "metadata.small"),
                       ({"a": float("nan")}, "metadata.a"), ({"": 1}, "metadata"), ({"a": "x" * 2000}, "metadata.a")):
        with pytest.raises(InvalidRequest) as caught:
            check_metadata(bad)
        assert caught.value.field == field
