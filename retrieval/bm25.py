"""BM25's corpus statistics and its term weight: the one fact a sharded lexical search needs to
rank exactly as an unsharded one; and the lexical queries a shard call carries (their one
encoder and decoder).

A shard's BM25 score of a document depends on the *corpus*: the number of documents, their
average length and each query term's document frequency. Scored with its own statistics, each
shard would rank on a different corpus and the merged list would not be the unsharded ranking.
So every shard scores with the *collection's* statistics, summed over the shards
(Elasticsearch's ``dfs_query_then_fetch``). The gateway does not ask for them first: it sends
the sums it already knows (``serving.shardcall.lexical``), every shard answers its top k under
them together with its own statistics for the query's terms, and only when those do not add up
to what was sent (a term never seen, a write since) is the query asked again under the new sums.
The statistics cover every live document (filters do not change them, as in Lucene), so a
filtered ranking is the unfiltered one restricted to the filter's documents.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from retrieval.errors import InvalidRequest
from retrieval.fusion import WeightedFusion

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
        for name in ("docs", "length"):
            value = data.get(name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InvalidRequest(f"{field_name}.{name} must be a non-negative integer",
                                     field=f"{field_name}.{name}")
        docs, length, df = int(data["docs"]), int(data["length"]), data.get("df", {})
        # a loop, not a generator and a second dict built from it: every shard reply and lexical
        # query carries one (the gateway reads four or more of them a query)
        if not isinstance(df, Mapping):
            raise InvalidRequest(f"{field_name}.df must map terms to document counts between 0 and docs",
                                 field=f"{field_name}.df")
        for term, count in df.items():
            if type(term) is not str or type(count) is not int or not 0 <= count <= docs:
                if isinstance(term, str) and isinstance(count, int) and not isinstance(count, bool) \
                        and 0 <= count <= docs:
                    continue  # a str or int subclass: accepted, as before
                raise InvalidRequest(f"{field_name}.df must map terms to document counts between 0 and docs",
                                     field=f"{field_name}.df")
        return cls(docs, length, {str(t): int(n) for t, n in df.items()} if type(df) is not dict else dict(df))

    @classmethod
    def from_canonical(cls, text: str, *, field_name: str = "corpus") -> CorpusStats:
        try:
            data = orjson.loads(text)
        except orjson.JSONDecodeError:
            raise InvalidRequest(f"{field_name} is not JSON", field=field_name) from None
        return cls.from_dict(data, field_name=field_name)


def score_bound(term_weights: Iterable[float], *, k1: float = K1) -> float:
    """The most BM25 could give any document for a query whose terms weigh ``term_weights`` (idf ×
    count): each term saturated, weight · (k1 + 1). A weighted hybrid divides by it."""
    return float(sum(term_weights)) * (k1 + 1.0)


MAX_LEXICAL_CHARS = 10_000  # a lexical query's text at a shard (the gateway's own limit is lower)


@dataclass(slots=True, frozen=True)
class LexicalQuery:
    """One lexical query of a shard call: its text, and the statistics to score it under (None:
    the shard's own — the unsharded ranking of a one-shard collection)."""

    text: str
    corpus: CorpusStats | None = None
    fuse: WeightedFusion | None = None  # a weighted hybrid: the shard fuses the legs (its vector rides along)


def encode_lexical_queries(queries: Sequence[LexicalQuery], vectors: bytes = b"") -> bytes:
    """A lexical search's body: the JSON ``{"queries": [{"text", "corpus"?, "fuse"?}, ...]}`` after
    its length (4 bytes, little-endian), then — a hybrid call — one query vector per query
    (``retrieval.wire.encode_vectors`` bytes), searched in the same call (``fuse``: a weighted
    hybrid's weights and depth, the shard answering the fused list)."""
    head = orjson.dumps({"queries": [{"text": q.text, **({"corpus": q.corpus.to_dict()} if q.corpus else {}),
                                      **({"fuse": q.fuse.to_dict()} if q.fuse else {})} for q in queries]})
    return len(head).to_bytes(4, "little") + head + vectors


def decode_lexical_queries(body: bytes, *, max_queries: int) -> tuple[list[LexicalQuery], bytes]:
    """The body :func:`encode_lexical_queries` makes, validated (an error names the bad part): the
    queries, and the vectors' bytes (empty: a lexical search alone)."""
    size = int.from_bytes(body[:4], "little") if len(body) >= 4 else -1
    if size < 0 or 4 + size > len(body):
        raise InvalidRequest("a lexical search's body is a 4-byte length, then that much JSON "
                             "({\"queries\": [...]}), then any query vectors", field="body")
    try:
        data = orjson.loads(body[4:4 + size])
    except orjson.JSONDecodeError:
        raise InvalidRequest("a lexical search's body is JSON: {\"queries\": [{\"text\", \"corpus\"?}]}",
                             field="body") from None
    queries = data.get("queries") if isinstance(data, dict) else None
    if not isinstance(queries, list) or not 1 <= len(queries) <= max_queries:
        raise InvalidRequest(f"body.queries must be a list of 1 to {max_queries} queries", field="body.queries")
    decoded = []
    for i, query in enumerate(queries):
        text = query.get("text") if isinstance(query, dict) else None
        if not isinstance(text, str) or len(text) > MAX_LEXICAL_CHARS:
            raise InvalidRequest(f"a lexical query's text is a string of at most {MAX_LEXICAL_CHARS} characters",
                                 field=f"body.queries.{i}.text")
        corpus, fuse = query.get("corpus"), query.get("fuse")
        decoded.append(LexicalQuery(text, CorpusStats.from_dict(corpus, field_name=f"body.queries.{i}.corpus")
                                    if corpus is not None else None,
                                    WeightedFusion.from_dict(fuse, field_name=f"body.queries.{i}.fuse")
                                    if fuse is not None else None))
    return decoded, body[4 + size:]
