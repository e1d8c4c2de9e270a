"""The lexical leg's text analysis, one function for documents and queries alike: Unicode words,
lower-cased, then per the collection's *language*: a Snowball stemmer (PyStemmer, a C extension
imported on first use) and the language's stop words dropped (see below). The shards index
and score with it; the gateway uses it to look up the statistics it already knows for a query's
terms (``serving.shardcall.lexical``).

The language is a collection's (``BuildConfig.lexical_language``, kept in every shard manifest,
carried by compaction and every build from a version): documents and queries of one collection
are always analysed alike. ``english`` (the default) stems and drops Lucene's English stop words
from documents and queries; every other Snowball language stems, and a *query* in it is not
searched for that language's stop words (:func:`query_stop_words`: Snowball's lists) while its
documents keep them — so every index built before the lists were used stays exact and BM25's
lengths count every word — and a query's "der", "und", "les" no longer read the longest posting
lists for next to no score. ``cjk`` cuts Chinese, Japanese and Korean text into overlapping
character bigrams; ``none`` keeps the words as they are (identifiers, codes, mixed languages).
"""

from __future__ import annotations

import ast
import importlib.util
import re
from collections import Counter
from functools import lru_cache
from pathlib import Path
from typing import Any

from retrieval.errors import ConfigError

DEFAULT_LANGUAGE = "english"
NO_STEMMING = "none"
CJK = "cjk"  # Chinese, Japanese, Korean: overlapping character bigrams (texts without spaces between words)

_WORD = re.compile(r"[^\W_]+")
# Lucene's EnglishAnalyzer stop set: words too common to rank by (and the bulk of every posting list).
STOP_WORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then there these they "
    "this to was will with".split())
_NO_STOP_WORDS: frozenset[str] = frozenset()


def languages() -> tuple[str, ...]:
    """The languages a collection's text can be analysed in: PyStemmer's Snowball stemmers, and
    ``none``."""
    import Stemmer

    return (*sorted(Stemmer.algorithms()), CJK, NO_STEMMING)


def describe_language(language: str) -> str:
    """One line on how ``language`` analyses a collection's text (``shardrag build --lexical-language
    list``)."""
    if language == CJK:
        return "Chinese, Japanese, Korean: overlapping character bigrams; no stop words"
    if language == NO_STEMMING:
        return "the words as they are (lower-cased); no stop words"
    if language == DEFAULT_LANGUAGE:
        return f"Snowball stems; Lucene's {len(STOP_WORDS)} English stop words dropped from documents and queries"
    stop = query_stop_words(language)
    return f"Snowball stems; {len(stop)} stop words dropped from queries" if stop else "Snowball stems; no stop words"


def check_language(language: str, *, field: str = "lexical_language") -> str:
    """``language`` when it is one of :func:`languages`, else a ConfigError naming ``field``."""
    if language != DEFAULT_LANGUAGE and language not in languages():
        raise ConfigError(f"{field} must be one of {', '.join(languages())}, got {language!r}", field=field)
    return language


class _Stemmers:
    """One PyStemmer stemmer per language, created on first use (a C extension; import is cheap)."""

    _stem_words: dict[str, Any] = {}

    @classmethod
    def stem(cls, words: list[str], language: str) -> list[str]:
        stem_words = cls._stem_words.get(language)
        if stem_words is None:
            import Stemmer

            stem_words = cls._stem_words[language] = Stemmer.Stemmer(language).stemWords
        result: list[str] = stem_words(words)
        return result


@lru_cache(maxsize=64)
def query_stop_words(language: str) -> frozenset[str]:
    """The words a query in ``language`` is not searched for: Lucene's English set for ``english``
    and ``porter``; for another Snowball language the stop list bm25s ships for it, where it has
    one — Snowball's own for most (the lists Lucene's and Elasticsearch's language analyzers use:
    function words only — articles, pronouns, auxiliaries); none for the rest (``cjk``, ``none``,
    …)."""
    if language in (DEFAULT_LANGUAGE, "porter"):
        return STOP_WORDS
    name = _SNOWBALL_STOP_LIST.get(language)
    if name is None:
        return _NO_STOP_WORDS
    return frozenset(word.lower() for word in _snowball_stop_list(name))


# The stop lists by PyStemmer language, as the constants bm25s ships them (NLTK's copies of
# Snowball's lists, and a Turkish one): the one package on PyPI that carries these conservative lists
# — the stop-words/stopwords/stopwordsiso packages' lists hold content words ("lavoro", "время", "état").
_SNOWBALL_STOP_LIST = {
    "danish": "STOPWORDS_DANISH", "dutch": "STOPWORDS_DUTCH", "dutch_porter": "STOPWORDS_DUTCH",
    "french": "STOPWORDS_FRENCH", "german": "STOPWORDS_GERMAN", "italian": "STOPWORDS_ITALIAN",
    "norwegian": "STOPWORDS_NORWEGIAN", "portuguese": "STOPWORDS_PORTUGUESE", "russian": "STOPWORDS_RUSSIAN",
    "spanish": "STOPWORDS_SPANISH", "swedish": "STOPWORDS_SWEDISH", "turkish": "STOPWORDS_TURKISH",
}


def _snowball_stop_list(name: str) -> tuple[str, ...]:
    """One tuple of bm25s's ``stopwords.py`` (``STOPWORDS_GERMAN = ("aber", …)``), read as data:
    only its own lines evaluated as a literal (~1 ms; the whole module parsed is ~40 ms, paid by the
    first query of every process). Read, not imported — importing anything of bm25s runs its
    ``__init__``, which loads scipy.sparse (~0.3 s and ~30 MB in every shard process)."""
    spec = importlib.util.find_spec("bm25s")  # finds the package without running it
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("the lexical leg's stop words need the bm25s package (pip install bm25s)",
                          field="lexical_language")
    source = (Path(next(iter(spec.submodule_search_locations))) / "stopwords.py").read_text(encoding="utf-8")
    found = re.search(rf"^{name} = (.*?)(?=^[A-Z_]+ = |\Z)", source, re.M | re.S)
    if found is None:
        raise ConfigError(f"bm25s's stopwords.py has no {name}", field="lexical_language")
    return tuple(ast.literal_eval(found.group(1).strip()))


def analyze(text: str, language: str = DEFAULT_LANGUAGE, *, stop: frozenset[str] | None = None) -> list[str]:
    """The terms of ``text`` in order (with repeats): what is indexed and what is looked up.
    ``stop``: the words dropped (by default a document's: Lucene's English set for ``english``,
    none for any other language)."""
    if stop is None:
        stop = STOP_WORDS if language == DEFAULT_LANGUAGE else _NO_STOP_WORDS
    words = [w for w in _WORD.findall(text.lower()) if w not in stop]
    if language == CJK:
        return [term for word in words for term in _cjk_terms(word)]
    if not words or language == NO_STEMMING:
        return words
    return _Stemmers.stem(words, language)


# Han (with extension A), hiragana, katakana, Hangul syllables: scripts written without spaces
_CJK_RUN = re.compile(r"([\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3040-\u309f\u30a0-\u30ff\uac00-\ud7af]+)")


def _cjk_terms(word: str) -> list[str]:
    """A word's terms for ``cjk``: each run of CJK characters as its overlapping bigrams (a single
    character alone), as Lucene's CJKAnalyzer does — so a query's words match inside a text that
    has no spaces between them — and anything else in the word as it is."""
    terms = []
    for part in _CJK_RUN.split(word):
        if not part:
            continue
        if _CJK_RUN.fullmatch(part):
            terms.extend([part] if len(part) == 1 else [part[i:i + 2] for i in range(len(part) - 1)])
        else:
            terms.append(part)
    return terms


def document_terms(title: str, text: str, language: str = DEFAULT_LANGUAGE) -> list[str]:
    """A document's terms: its title's, then its text's."""
    return analyze(f"{title}\n{text}" if title else text, language)


QUERY_CACHE_CHARS = 1_000  # texts up to this long are remembered (queries repeat; documents do not)


def query_terms(text: str, language: str = DEFAULT_LANGUAGE) -> list[tuple[str, int]]:
    """A query's distinct terms with how often each occurs, in first-occurrence order (the order
    in which scores are summed: fixed, so every shard adds the same floats in the same order), its
    language's :func:`query_stop_words` dropped."""
    if len(text) <= QUERY_CACHE_CHARS:
        return list(_remembered_query_terms(text, language))
    return list(Counter(analyze(text, language, stop=query_stop_words(language))).items())


@lru_cache(maxsize=4096)
def _remembered_query_terms(text: str, language: str) -> tuple[tuple[str, int], ...]:
    # a hybrid query is analysed by the gateway and by every shard it reaches, and popular queries
    # repeat: the regex and the stemmer cost ~15 µs a text, a lookup here ~1 (at most ~4 MB held)
    return tuple(Counter(analyze(text, language, stop=query_stop_words(language))).items())
