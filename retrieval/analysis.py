"""The lexical leg's text analysis, one function for documents and queries alike: Unicode words,
lower-cased, Lucene's English stop words dropped, Snowball English stems (PyStemmer, a C
extension imported on first use). The shards index and score with it; the gateway uses it to
look up the statistics it already knows for a query's terms (``serving.shardcall.lexical``)."""

from __future__ import annotations

import re
from collections import Counter
from functools import lru_cache
from typing import Any

_WORD = re.compile(r"[^\W_]+")
# Lucene's EnglishAnalyzer stop set: words too common to rank by (and the bulk of every posting list).
STOP_WORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then there these they "
    "this to was will with".split())


class _Stemmer:
    """PyStemmer's Snowball English stemmer, created on first use (a C extension; import is cheap)."""

    _stem_words: Any = None

    @classmethod
    def stem(cls, words: list[str]) -> list[str]:
        if cls._stem_words is None:
            import Stemmer

            cls._stem_words = Stemmer.Stemmer("english").stemWords
        result: list[str] = cls._stem_words(words)
        return result


def analyze(text: str) -> list[str]:
    """The terms of ``text`` in order (with repeats): what is indexed and what is looked up."""
    words = [w for w in _WORD.findall(text.lower()) if w not in STOP_WORDS]
    return _Stemmer.stem(words) if words else []


def document_terms(title: str, text: str) -> list[str]:
    """A document's terms: its title's, then its text's."""
    return analyze(f"{title}\n{text}" if title else text)


QUERY_CACHE_CHARS = 1_000  # texts up to this long are remembered (queries repeat; documents do not)


def query_terms(text: str) -> list[tuple[str, int]]:
    """A query's distinct terms with how often each occurs, in first-occurrence order (the order
    in which scores are summed: fixed, so every shard adds the same floats in the same order)."""
    if len(text) <= QUERY_CACHE_CHARS:
        return list(_remembered_query_terms(text))
    return list(Counter(analyze(text)).items())


@lru_cache(maxsize=4096)
def _remembered_query_terms(text: str) -> tuple[tuple[str, int], ...]:
    # a hybrid query is analysed by the gateway and by every shard it reaches, and popular queries
    # repeat: the regex and the stemmer cost ~15 µs a text, a lookup here ~1 (at most ~4 MB held)
    return tuple(Counter(analyze(text)).items())
