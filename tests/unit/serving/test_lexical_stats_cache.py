"""The gateway's BM25 statistics cache and the check that decides whether a lexical query must be
asked again: a query scored under statistics the shards do not report is never accepted."""

from retrieval.bm25 import CorpusStats
from serving.shardcall import lexical
from serving.shardcall.lexical import CorpusStatsCache, agrees


def test_only_statistics_equal_to_the_shards_sums_are_accepted():
    summed = CorpusStats(100, 5000, {"zebra": 3, "migrat": 0})
    assert not agrees(None, summed)  # nothing was known: always asked again
    assert agrees(CorpusStats(100, 5000, {"zebra": 3}), summed)  # a term no shard holds counts as left out
    assert agrees(CorpusStats(100, 5000, {"zebra": 3, "other": 9}), summed)  # a guessed term no shard has
    assert not agrees(CorpusStats(100, 5000, {"zebra": 2}), summed)  # a write since
    assert not agrees(CorpusStats(101, 5000, {"zebra": 3}), summed)  # the totals moved
    assert not agrees(CorpusStats(100, 5001, {"zebra": 3}), summed)
    assert not agrees(CorpusStats(100, 5000, {}), CorpusStats(100, 5000, {"zebra": 1}))  # a term never seen


def test_the_cache_guesses_a_querys_terms_per_version_and_starts_over_when_full(monkeypatch):
    cache = CorpusStatsCache()
    assert cache.guess("v1", "zebras migrate") is None
    cache.learn("v1", CorpusStats(100, 5000, {"zebra": 3, "migrat": 7, "kalahari": 1}))
    assert cache.guess("v1", "Zebras migrating") == CorpusStats(100, 5000, {"zebra": 3, "migrat": 7})
    assert cache.guess("v1", "the lions") == CorpusStats(100, 5000, {})  # totals known, the term not
    assert cache.guess("v2", "zebras") is None  # each version its own statistics
    cache.learn("v1", CorpusStats(101, 5050, {"zebra": 4}))  # a later sum replaces what it covers
    assert cache.guess("v1", "zebra kalahari") == CorpusStats(101, 5050, {"zebra": 4, "kalahari": 1})
    monkeypatch.setattr(lexical, "MAX_CACHED_TERMS", 2)
    cache.learn("v1", CorpusStats(101, 5050, {"lion": 2}))  # past the bound: only the newest terms stay
    assert cache.guess("v1", "zebra lion") == CorpusStats(101, 5050, {"lion": 2})
