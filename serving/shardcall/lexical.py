"""The lexical leg's fan-out: BM25 across shards, ranked exactly as on one unsharded index.

Every shard must score with the *collection's* statistics (``retrieval.bm25``). Asking for them
first would cost a round trip per query; instead the gateway keeps the sums it last saw
(:class:`CorpusStatsCache`: the collection's document and token counts, and per term its
document frequency) and sends them with the query. Each shard answers its top k under them
*and* its own statistics for the query's terms. When those add up to what was sent — the steady
state — the merged list is the unsharded ranking, in one round. When they do not (a term never
seen, a write since), the cache takes the new sums and the query is asked again under them.

Calls go through :class:`~serving.shardcall.call.ShardCaller` (replica choice, hedging, retries,
the replica's 409/behind answers) with the query's session floors, coalesced per shard like the
dense leg's (the queries ride in the body). A lexical list is never trimmed: every shard is asked
for the full k.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from retrieval.analysis import query_terms
from retrieval.bm25 import CorpusStats, LexicalQuery
from retrieval.contract import HitColumns, SearchParams, SessionFloor
from retrieval.errors import ShardUnavailable, VersionConflict
from serving.shardcall.fanout import FanOut, FanOutResult, ShardCall, ShardRoute, floored, merge_answers, settle

_NO_VECTORS = np.zeros((0, 0), dtype=np.float32)
MAX_CACHED_TERMS = 200_000  # per version; past it the cache starts over (it only saves round trips)

_Item = tuple[LexicalQuery, float, tuple[str, ...]]  # (query, monotonic deadline, eligible replicas)
_Answer = tuple[HitColumns, CorpusStats, ShardCall]


class CorpusStatsCache:
    """Per embedding version, the collection's statistics as last summed over its shards."""

    def __init__(self) -> None:
        self._totals: dict[str, tuple[int, int]] = {}  # version → (documents, tokens)
        self._df: dict[str, dict[str, int]] = {}  # version → term → documents holding it

    def guess(self, version: str, text: str) -> CorpusStats | None:
        """The sums last seen for ``text``'s terms (None: nothing known yet for this version)."""
        totals = self._totals.get(version)
        if totals is None:
            return None
        known = self._df.get(version, {})
        return CorpusStats(totals[0], totals[1], {term: known[term] for term, _ in query_terms(text) if term in known})

    def learn(self, version: str, stats: CorpusStats) -> None:
        self._totals[version] = (stats.docs, stats.length)
        known = self._df.setdefault(version, {})
        if len(known) + len(stats.df) > MAX_CACHED_TERMS:
            known.clear()
        known.update(stats.df)


def agrees(sent: CorpusStats | None, summed: CorpusStats) -> bool:
    """Whether the statistics a query was scored under are the shards' (a term counted nowhere
    is the same as a term left out: neither is scored)."""
    if sent is None or (sent.docs, sent.length) != (summed.docs, summed.length):
        return False
    return all(sent.df.get(term, 0) == count for term, count in summed.df.items())


@dataclass(slots=True)
class _Round:
    answers: dict[int, _Answer]
    missing: dict[int, str]


class LexicalFanOut:
    def __init__(self, fanout: FanOut) -> None:
        self.caller = fanout.caller
        self.cache = CorpusStatsCache()
        self._batchers = fanout.batchers(self._call_for)
        self.rounds = {"one": 0, "again": 0}  # queries answered in one round / asked again

    async def search(self, text: str, params: SearchParams, route: ShardRoute, *, timeout_s: float,
                     session: Mapping[int, SessionFloor] | None = None) -> FanOutResult:
        """``params``: k, version (``route``'s), with_text/with_metadata, filter. The ranking is the
        unsharded one under the statistics the answering shards report."""
        deadline = time.monotonic() + timeout_s
        version = params.version or route.version
        targets = list(range(route.num_shards))
        asked = SearchParams(params.k, version, with_text=params.with_text, with_metadata=params.with_metadata,
                             filter=params.filter, lexical=True)
        sent = self.cache.guess(version, text)
        first = await self._round(LexicalQuery(text, sent), asked, route, targets, deadline, session)
        summed = CorpusStats.total(stats for _, stats, _ in first.answers.values())
        result = first
        if not agrees(sent, summed):
            self.cache.learn(version, summed)
            self.rounds["again"] += 1
            answered = [s for s in targets if s in first.answers]
            result = await self._round(LexicalQuery(text, summed), asked, route, answered, deadline, session)
            result.missing.update(first.missing)
        else:
            self.rounds["one"] += 1
        answers = [(result.answers[s][0], result.answers[s][2]) for s in targets if s in result.answers]
        return FanOutResult(merge_answers(answers, params.k), route.version, route.num_shards, targets,
                            [call for _, call in answers], result.missing, params.k, (),
                            "off: a lexical list is never trimmed")

    async def _round(self, query: LexicalQuery, params: SearchParams, route: ShardRoute, targets: list[int],
                     deadline: float, session: Mapping[int, SessionFloor] | None) -> _Round:
        futures = {s: self._batchers[s].submit(floored(params, session.get(s) if session else None),
                                               (query, deadline, route.replicas[s])) for s in targets}
        answers, missing = await settle(futures, deadline - time.monotonic())
        return _Round(answers, missing)

    def _call_for(self, shard_id: int) -> Callable[[SearchParams, list[Any]], Any]:
        async def call(params: SearchParams, items: list[_Item]) -> Sequence[_Answer]:
            deadline = max(item_deadline for _, item_deadline, _ in items)
            replicas = items[0][2]  # one version per batch: every item's snapshot names its replicas
            result = await self.caller.call(shard_id, replicas, _NO_VECTORS, params, deadline,
                                            lexical=[query for query, _, _ in items])
            reply = result.reply
            if reply.version != params.version:  # never merged: the query fails instead
                raise VersionConflict(f"shard {shard_id} answered with version {reply.version!r}, "
                                      f"the query is on {params.version!r}", shard=shard_id)
            if reply.stats is None or len(reply.stats) != len(items) or len(reply.results) != len(items):
                raise ShardUnavailable(f"shard {shard_id} ({result.replica}) answered {len(reply.results)} "
                                       f"lexical queries of {len(items)}", shard=shard_id)
            info = ShardCall(shard_id, reply.version, result.replica, result.latency_ms, reply.server_ms, len(items),
                             result.attempts, result.hedged, result.hedge_won)
            return [(hits, stats, info) for hits, stats in zip(reply.results, reply.stats, strict=True)]

        return call


__all__ = ["CorpusStatsCache", "LexicalFanOut", "agrees"]
