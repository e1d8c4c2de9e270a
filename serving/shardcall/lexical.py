"""The lexical leg's fan-out: BM25 across shards, ranked exactly as on one unsharded index.

Two phases over every shard (``retrieval.bm25``): each shard's statistics for the query's terms,
summed; then each shard's top k scored under the sum, merged by score then doc id like the
dense leg. Both phases are ordinary shard calls (``ShardCaller``: replica choice, hedging,
retries, the replica's 409/behind answers), with the query's session floors; they are not
coalesced (each carries its own text) nor trimmed (every shard is asked for the full k).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping

import numpy as np

from retrieval.bm25 import CorpusStats
from retrieval.contract import HitColumns, SearchParams, SessionFloor
from retrieval.errors import VersionConflict
from serving.shardcall.call import CallResult, ShardCaller
from serving.shardcall.fanout import FanOutResult, ShardCall, ShardRoute, floored, merge_answers, settle

_NO_VECTORS = np.zeros((0, 0), dtype=np.float32)


class LexicalFanOut:
    def __init__(self, caller: ShardCaller) -> None:
        self.caller = caller

    async def search(self, text: str, params: SearchParams, route: ShardRoute, *, timeout_s: float,
                     session: Mapping[int, SessionFloor] | None = None) -> FanOutResult:
        """``params``: k, version (``route``'s), with_text/with_metadata, filter. A shard missing
        from the first phase is missing from the answer (its documents' statistics are not in
        the sum, so its scores could not be compared)."""
        deadline = time.monotonic() + timeout_s
        targets = list(range(route.num_shards))
        first = SearchParams(params.k, params.version, text=text, stats_only=True)
        replies, missing = await self._round(first, route, targets, deadline, session)
        stats = CorpusStats.total(replies[s][0].reply.stats or CorpusStats(0, 0) for s in targets if s in replies)
        second = SearchParams(params.k, params.version, with_text=params.with_text,
                              with_metadata=params.with_metadata, filter=params.filter, text=text,
                              corpus=stats.canonical())
        answered = [s for s in targets if s in replies]
        results, failed = await self._round(second, route, answered, deadline, session)
        missing.update(failed)
        answers: list[tuple[HitColumns, ShardCall]] = [(results[s][0].reply.results[0], results[s][1])
                                                       for s in answered if s in results]
        return FanOutResult(merge_answers(answers, params.k), route.version, route.num_shards, targets,
                            [call for _, call in answers], missing, params.k, (), "off: lexical")

    async def _round(self, params: SearchParams, route: ShardRoute, targets: list[int], deadline: float,
                     session: Mapping[int, SessionFloor] | None,
                     ) -> tuple[dict[int, tuple[CallResult, ShardCall]], dict[int, str]]:
        tasks = {s: asyncio.ensure_future(self._call(s, floored(params, session.get(s) if session else None),
                                                     route, deadline)) for s in targets}
        return await settle(tasks, deadline - time.monotonic())

    async def _call(self, shard_id: int, params: SearchParams, route: ShardRoute,
                    deadline: float) -> tuple[CallResult, ShardCall]:
        result = await self.caller.call(shard_id, route.replicas[shard_id], _NO_VECTORS, params, deadline)
        if result.reply.version != params.version:  # never merged: the query fails instead
            raise VersionConflict(f"shard {shard_id} answered with version {result.reply.version!r}, "
                                  f"the query is on {params.version!r}", shard=shard_id)
        return result, ShardCall(shard_id, result.reply.version, result.replica, result.latency_ms,
                                 result.reply.server_ms, 1, result.attempts, result.hedged, result.hedge_won)
