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
for the full k. A hybrid query sends both legs in one call per shard (the query's vector rides
after its lexical query), so it costs the calls of one leg: :meth:`search_weighted` (each shard
answers its exact fused top k; :func:`fused_hits` merges them and ranks each hit in each leg) or,
for rrf, :meth:`search_hybrid` (each shard answers both legs' lists).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from retrieval.analysis import DEFAULT_LANGUAGE, query_terms
from retrieval.bm25 import CorpusStats, LexicalQuery
from retrieval.contract import HitColumns, SearchParams, SessionFloor
from retrieval.errors import ShardUnavailable, VersionConflict
from retrieval.fusion import LEGS, FusedHit, LegRank, LegTops, WeightedFusion
from serving.shardcall.fanout import FanOut, FanOutResult, ShardCall, ShardRoute, floored, merge_answers, settle

_NO_VECTORS = np.zeros((0, 0), dtype=np.float32)
MAX_CACHED_TERMS = 200_000  # per version; past it the cache starts over (it only saves round trips)

_Item = tuple[LexicalQuery, float, tuple[str, ...]]  # (query, monotonic deadline, eligible replicas)
_Answer = tuple[HitColumns, CorpusStats, ShardCall]
_HybridItem = tuple[LexicalQuery, np.ndarray, float, tuple[str, ...]]  # (query, its vector, deadline, replicas)
_HybridAnswer = tuple[_Answer, HitColumns]  # (the lexical answer, the vector's hits)


class CorpusStatsCache:
    """Per embedding version, the collection's statistics as last summed over its shards."""

    def __init__(self) -> None:
        self._totals: dict[str, tuple[int, int]] = {}  # version → (documents, tokens)
        self._df: dict[str, dict[str, int]] = {}  # version → term → documents holding it

    def guess(self, version: str, text: str, language: str = DEFAULT_LANGUAGE) -> CorpusStats | None:
        """The sums last seen for ``text``'s terms, analysed as the version's shards do in ``language``
        (None: nothing known yet for this version)."""
        totals = self._totals.get(version)
        if totals is None:
            return None
        known = self._df.get(version, {})
        return CorpusStats(totals[0], totals[1],
                           {term: known[term] for term, _ in query_terms(text, language) if term in known})

    def has_totals(self, version: str) -> bool:
        """Whether any sums are known for ``version`` (its document and token counts)."""
        return version in self._totals

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
    def __init__(self, fanout: FanOut, on_rounds: Callable[[int], None] = lambda rounds: None) -> None:
        """``on_rounds``: told, per lexical or hybrid query, in how many rounds it was answered (the
        gateway's metrics)."""
        self.caller = fanout.caller
        self._record = fanout.record
        self.cache = CorpusStatsCache()
        self._batchers = fanout.batchers(self._call_for)
        self._hybrid_batchers = fanout.batchers(self._hybrid_call_for)
        self._weighted_batchers = fanout.batchers(self._weighted_call_for)
        self._on_rounds = on_rounds

    async def search(self, text: str, params: SearchParams, route: ShardRoute, *, timeout_s: float,
                     session: Mapping[int, SessionFloor] | None = None) -> FanOutResult:
        """``params``: k, version (``route``'s), with_text/with_metadata, filter. The ranking is the
        unsharded one under the statistics the answering shards report."""
        deadline = time.monotonic() + timeout_s
        asked, targets = self._asked(params, route), list(range(route.num_shards))
        sent = self.cache.guess(asked.version or route.version, text, route.lexical_language)
        first = await self._round(LexicalQuery(text, sent), asked, route, targets, deadline, session)
        return await self._settle(text, sent, first, asked, route, deadline, session)

    async def search_hybrid(self, text: str, vector: np.ndarray, params: SearchParams, route: ShardRoute, *,
                            timeout_s: float, session: Mapping[int, SessionFloor] | None = None,
                            ) -> tuple[FanOutResult, FanOutResult]:
        """Both legs in one call per shard (the dense leg: ``vector``'s top k, every shard asked for
        the full k): (dense, lexical). Only a lexical second round, when the statistics disagree,
        costs another call."""
        deadline = time.monotonic() + timeout_s
        asked, targets = self._asked(params, route), list(range(route.num_shards))
        both = replace(asked, nprobe=params.nprobe, ef_search=params.ef_search)  # the dense leg's breadth too
        sent = self.cache.guess(asked.version or route.version, text, route.lexical_language)
        futures = {s: self._hybrid_batchers[s].submit(floored(both, session.get(s) if session else None),
                                                      (LexicalQuery(text, sent), vector, deadline, route.replicas[s]))
                   for s in targets}
        answers, missing = await settle(futures, deadline - time.monotonic())
        dense_answers = [(answers[s][1], answers[s][0][2]) for s in targets if s in answers]
        dense = FanOutResult(merge_answers(dense_answers, params.k), route.version, route.num_shards, targets,
                             [call for _, call in dense_answers], dict(missing), params.k, (),
                             "off: a hybrid call asks every shard for the full k")
        first = _Round({s: answer[0] for s, answer in answers.items()}, dict(missing))
        return dense, await self._settle(text, sent, first, asked, route, deadline, session)

    async def search_weighted(self, text: str, vector: np.ndarray, spec: WeightedFusion, params: SearchParams,
                              route: ShardRoute, *, timeout_s: float, session: Mapping[int, SessionFloor] | None = None,
                              ) -> tuple[FanOutResult, list[FusedHit]]:
        """A weighted hybrid: every shard answers its exact fused top k (``index_shards.hybrid_search``)
        under the collection's statistics, in one call per shard — a second only when the statistics
        sent were not the shards' — and the lists merge like dense ones. The hits with each leg's
        score and rank."""
        deadline = time.monotonic() + timeout_s
        asked, targets = self._asked(params, route), list(range(route.num_shards))
        both = replace(asked, nprobe=params.nprobe, ef_search=params.ef_search)  # the dense leg's breadth too
        version = asked.version or route.version
        sent = self.cache.guess(version, text, route.lexical_language)
        result = await self._weighted_round(LexicalQuery(text, sent, spec), vector, both, route, targets, deadline,
                                            session)
        summed = CorpusStats.total(stats for _, stats, _ in result.answers.values())
        if not agrees(sent, summed):
            self.cache.learn(version, summed)
            self._on_rounds(2)
            first = result
            result = await self._weighted_round(LexicalQuery(text, summed, spec), vector, both, route,
                                                [s for s in targets if s in first.answers], deadline, session)
            result.missing.update(first.missing)
        else:
            self._on_rounds(1)
        answers = [(result.answers[s][0], result.answers[s][2]) for s in targets if s in result.answers]
        fused = fused_hits(answers, asked.k, spec.depth)
        return FanOutResult([item.hit for item in fused], route.version, route.num_shards, targets,
                            [call for _, call in answers], result.missing, asked.k, (),
                            "off: a weighted hybrid asks every shard for its fused top k"), fused

    async def prime(self, text: str, params: SearchParams, route: ShardRoute, *, timeout_s: float,
                    session: Mapping[int, SessionFloor] | None = None) -> None:
        """Learn the collection's statistics for ``text``'s terms when nothing is known of the
        version yet (one lexical round for one hit without its text): run while a weighted hybrid's
        text is embedded, it saves that first query a second round after the embedding. Later
        queries go optimistically: a term the cache has not seen is sent as held by no document —
        true of most such terms (numbers, names, typos), and when it is not, the shards' statistics
        say so and the query is asked again. A failure here costs only that."""
        version = params.version or route.version
        if self.cache.has_totals(version):
            return
        asked = SearchParams(1, version, with_text=False, lexical=True)
        targets = list(range(route.num_shards))
        found = await self._round(LexicalQuery(text, None), asked, route, targets, time.monotonic() + timeout_s,
                                  session)
        if len(found.answers) == len(targets):
            self.cache.learn(version, CorpusStats.total(stats for _, stats, _ in found.answers.values()))

    @staticmethod
    def _asked(params: SearchParams, route: ShardRoute) -> SearchParams:
        return SearchParams(params.k, params.version or route.version, with_text=params.with_text,
                            with_metadata=params.with_metadata, filter=params.filter, lexical=True)

    async def _settle(self, text: str, sent: CorpusStats | None, first: _Round, asked: SearchParams,
                      route: ShardRoute, deadline: float, session: Mapping[int, SessionFloor] | None) -> FanOutResult:
        """The lexical answer from a first round scored under ``sent``: itself when the shards'
        statistics add up to it, else a second round under their sum."""
        targets = list(range(route.num_shards))
        summed = CorpusStats.total(stats for _, stats, _ in first.answers.values())
        result = first
        if not agrees(sent, summed):
            self.cache.learn(asked.version or route.version, summed)
            self._on_rounds(2)
            answered = [s for s in targets if s in first.answers]
            result = await self._round(LexicalQuery(text, summed), asked, route, answered, deadline, session)
            result.missing.update(first.missing)
        else:
            self._on_rounds(1)
        answers = [(result.answers[s][0], result.answers[s][2]) for s in targets if s in result.answers]
        return FanOutResult(merge_answers(answers, asked.k), route.version, route.num_shards, targets,
                            [call for _, call in answers], result.missing, asked.k, (),
                            "off: a lexical list is never trimmed")

    async def _round(self, query: LexicalQuery, params: SearchParams, route: ShardRoute, targets: list[int],
                     deadline: float, session: Mapping[int, SessionFloor] | None) -> _Round:
        futures = {s: self._batchers[s].submit(floored(params, session.get(s) if session else None),
                                               (query, deadline, route.replicas[s])) for s in targets}
        answers, missing = await settle(futures, deadline - time.monotonic())
        return _Round(answers, missing)

    async def _weighted_round(self, query: LexicalQuery, vector: np.ndarray, params: SearchParams, route: ShardRoute,
                              targets: list[int], deadline: float,
                              session: Mapping[int, SessionFloor] | None) -> _Round:
        futures = {s: self._weighted_batchers[s].submit(floored(params, session.get(s) if session else None),
                                                        (query, vector, deadline, route.replicas[s])) for s in targets}
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
            self._record(info)
            return [(hits, stats, info) for hits, stats in zip(reply.results, reply.stats, strict=True)]

        return call

    async def _call_with_vectors(self, shard_id: int, params: SearchParams, items: list[_HybridItem],
                                 what: str) -> tuple[Any, ShardCall]:
        """One call of lexical queries with their vectors (a hybrid or weighted call): the reply,
        checked to be of the query's version and to hold every query's lexical answer."""
        deadline = max(item[2] for item in items)
        result = await self.caller.call(shard_id, items[0][3], np.stack([item[1] for item in items]), params,
                                        deadline, lexical=[item[0] for item in items])
        reply = result.reply
        if reply.version != params.version:  # never merged: the query fails instead
            raise VersionConflict(f"shard {shard_id} answered with version {reply.version!r}, "
                                  f"the query is on {params.version!r}", shard=shard_id)
        if reply.stats is None or not len(reply.stats) == len(reply.results) == len(items):
            raise ShardUnavailable(f"shard {shard_id} ({result.replica}) did not answer the {len(items)} "
                                   f"queries of a {what} call", shard=shard_id)
        info = ShardCall(shard_id, reply.version, result.replica, result.latency_ms, reply.server_ms, len(items),
                         result.attempts, result.hedged, result.hedge_won)
        self._record(info)
        return reply, info

    def _hybrid_call_for(self, shard_id: int) -> Callable[[SearchParams, list[Any]], Any]:
        async def call(params: SearchParams, items: list[_HybridItem]) -> Sequence[_HybridAnswer]:
            reply, info = await self._call_with_vectors(shard_id, params, items, "hybrid")
            if reply.dense is None or len(reply.dense) != len(items):
                raise ShardUnavailable(f"shard {shard_id} ({info.replica}) did not answer the {len(items)} "
                                       "vectors of a hybrid call", shard=shard_id)
            return [((hits, stats, info), dense)
                    for hits, stats, dense in zip(reply.results, reply.stats, reply.dense, strict=True)]

        return call

    def _weighted_call_for(self, shard_id: int) -> Callable[[SearchParams, list[Any]], Any]:
        async def call(params: SearchParams, items: list[_HybridItem]) -> Sequence[_Answer]:
            reply, info = await self._call_with_vectors(shard_id, params, items, "weighted hybrid")
            return [(hits, stats, info) for hits, stats in zip(reply.results, reply.stats, strict=True)]

        return call


def fused_hits(answers: list[tuple[HitColumns, ShardCall]], k: int, depth: int) -> list[FusedHit]:
    """The shards' fused lists merged (fused score, then doc id), each hit with every leg's score
    and its rank in that leg across the shards (from each shard's best ``depth`` scores of it)."""
    hits = merge_answers(answers, k)
    tops = {leg: LegTops([columns.get("leg_tops", {}).get(leg, []) for columns, _ in answers], depth) for leg in LEGS}
    by_shard = {call.shard_id: columns for columns, call in answers}
    fused = []
    for hit in hits:
        columns = by_shard[hit.shard_id]
        i = columns["doc_ids"].index(hit.doc_id)
        legs, scores_of = {}, columns.get("legs", {})
        for leg in LEGS:
            score = scores_of[leg][i] if leg in scores_of else None
            if score is not None:
                legs[leg] = LegRank(tops[leg].rank(score), score)
        fused.append(FusedHit(hit, hit.score, legs))
    return fused


__all__ = ["CorpusStatsCache", "LexicalFanOut", "agrees", "fused_hits"]
