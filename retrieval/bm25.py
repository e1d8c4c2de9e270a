"""BM25's corpus statistics and its term weight: the one fact a sharded lexical search needs to
rank exactly as an unsharded one.

A shard's BM25 score of a document depends on the *corpus*: the number of documents, their
average length and each query term's document frequency. Scored with its own statistics, each
shard would rank on a different corpus and the merged list would not be the unsharded ranking.
So a lexical query runs in two phases (Elasticsearch's ``dfs_query_then_fetch``): every shard
reports its :class:`CorpusStats` for the query's terms, the gateway sums them, and every shard
scores with the sum. The statistics cover every live document (filters do not change them, as
in Lucene), so a filtered ranking is the unfiltered one restricted to the filter's documents.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from retrieval.errors import InvalidRequest

# Lucene's defaults (BM25Similarity): term-frequency saturation and length normalization.
K1 = 1.2
B = 0.75


@dataclass(slots=True, frozen=True)
class CorpusStats:
    """Statistics of a set of live documents for some terms: ``docs`` documents holding ``length``
    tokens in all, and per term the number of documents that contain it."""

    docs: int
    length: int
    df: Mapping[str, int] = field(default_factory=dict)

    def __add__(self, other: CorpusStats) -> CorpusStats:
        df = dict(self.df)
        for term, count in other.df.items():
            df[term] = df.get(term, 0) + count
        return CorpusStats(self.docs + other.docs, self.length + other.length, df)

    @classmethod
    def total(cls, parts: Iterable[CorpusStats]) -> CorpusStats:
        """The statistics of the union of disjoint document sets (the shards of a collection)."""
        result = cls(0, 0, {})
        for part in parts:
            result = result + part
        return result

    @property
    def average_length(self) -> float:
        return self.length / self.docs if self.docs else 0.0

    def idf(self, term: str) -> float:
        """Lucene's BM25 idf: ln(1 + (N − df + 0.5) / (df + 0.5)), always positive; 0 for a term no
        document holds (it cannot match). One Python expression, so every shard computes the same bits."""
        df = self.df.get(term, 0)
        if df <= 0 or self.docs <= 0:
            return 0.0
        return math.log(1.0 + (self.docs - df + 0.5) / (df + 0.5))

    # -- wire (a SearchParams field and a SearchReply field carry it) -------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"docs": self.docs, "length": self.length, "df": dict(self.df)}

    def canonical(self) -> str:
        return orjson.dumps(self.to_dict(), option=orjson.OPT_SORT_KEYS).decode()

    @classmethod
    def from_dict(cls, data: Any, *, field_name: str = "corpus") -> CorpusStats:
        """Validated: an error names ``field_name`` and the bad part."""
        if not isinstance(data, Mapping):
            raise InvalidRequest(f"{field_name} must be an object with docs, length and df", field=field_name)
        counts = {name: data.get(name) for name in ("docs", "length")}
        for name, value in counts.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InvalidRequest(f"{field_name}.{name} must be a non-negative integer",
                                     field=f"{field_name}.{name}")
        docs, length, df = int(counts["docs"] or 0), int(counts["length"] or 0), data.get("df", {})
        if not isinstance(df, Mapping) or not all(
                isinstance(t, str) and isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= docs
                for t, n in df.items()):
            raise InvalidRequest(f"{field_name}.df must map terms to document counts between 0 and docs",
                                 field=f"{field_name}.df")
        return cls(docs, length, {str(t): int(n) for t, n in df.items()})

    @classmethod
    def from_canonical(cls, text: str, *, field_name: str = "corpus") -> CorpusStats:
        try:
            data = orjson.loads(text)
        except orjson.JSONDecodeError:
            raise InvalidRequest(f"{field_name} is not JSON", field=field_name) from None
        return cls.from_dict(data, field_name=field_name)
