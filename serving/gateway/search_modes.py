"""``mode: lexical`` and ``mode: hybrid`` of ``POST /v1/query`` (``serving.gateway.query`` runs
``dense`` itself and shapes every answer).

* **lexical** — BM25 across the shards (``serving.shardcall.lexical``: the collection's
  statistics, so the ranking is the unsharded one).
* **hybrid, weighted** (the default) — one call per shard with the query's vector and its lexical
  query; each shard answers its exact fused top k (``LexicalFanOut.search_weighted``), merged like
  dense lists. A text to embed first is embedded while the collection's statistics are fetched,
  when the gateway knows none yet (``LexicalFanOut.prime``).
* **hybrid, rrf** — both legs' lists in one call per shard when the query's vector is at hand
  (given, or its text's embedding cached: ``LexicalFanOut.search_hybrid``); otherwise the lexical
  leg runs while the text is embedded, then the dense leg (and with ``top_m``, which routes the
  dense leg only, the legs always go separately). The two lists (``candidates`` hits each) are
  fused at the gateway (``retrieval.fusion.fuse_rrf``).

Each hybrid hit says where each leg ranked it and its score there.

A filter applies to both legs; session floors too. ``top_m`` routes the dense leg only: a lexical
hit can be on any shard, so the lexical leg always reads every shard (and a weighted hybrid, which
fuses on every shard, refuses it).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from retrieval.analysis import query_terms
from retrieval.contract import SearchParams, SessionFloor
from retrieval.errors import InvalidRequest
from retrieval.fusion import DENSE, LEXICAL, RRF, WEIGHTED, FusedHit, WeightedFusion, fuse_rrf, weights_of
from retrieval.types import Hit
from serving.gateway.api_models import QueryRequest
from serving.shardcall.fanout import FanOutResult
from serving.shardcall.lexical import LexicalFanOut
from serving.versions.registry import VersionSnapshot

if TYPE_CHECKING:
    from serving.gateway.query import QueryService

DEFAULT_CANDIDATES = 20  # hits each leg brings to a fusion (at least k); chosen with the weights


@dataclass(slots=True)
class Legs:
    """What a query's legs produced, for the answer: the result whose shards, calls and missing
    shards the answer reports (the dense leg's, or the lexical's alone), and the shaped hits."""

    result: FanOutResult
    hits: list[dict[str, Any]]
    encode_ms: float = 0.0
    fanout_ms: float = 0.0
    lexical_ms: float = 0.0
    fusion: str | None = None
    leg: str = DENSE  # the leg ``result`` is
    lexical: FanOutResult | None = None  # hybrid: the lexical leg (its calls and missing shards count too)
    lexical_terms: list[str] | None = None  # lexical and hybrid: the terms the lexical leg searched

    def calls(self) -> Iterator[tuple[str, list[Any]]]:
        yield self.leg, self.result.calls
        if self.lexical is not None:
            yield LEXICAL, self.lexical.calls


class SearchModes:
    def __init__(self, service: QueryService, lexical: LexicalFanOut) -> None:
        self.service = service
        self.lexical = lexical

    async def run(self, request: QueryRequest, text: str | None, params: SearchParams, snapshot: VersionSnapshot,
                  session: Mapping[int, SessionFloor] | None, timeout_ms: float, started: float) -> Legs:
        assert text is not None  # QueryService._text refuses lexical and hybrid queries without text
        legs = await self._run(request, text, params, snapshot, session, timeout_ms, started)
        # what the shards searched for (the same analysis, cached): why "und die der" finds nothing
        legs.lexical_terms = [term for term, _ in query_terms(text, snapshot.route.lexical_language)]
        return legs

    async def _run(self, request: QueryRequest, text: str, params: SearchParams, snapshot: VersionSnapshot,
                   session: Mapping[int, SessionFloor] | None, timeout_ms: float, started: float) -> Legs:
        deadline_s = timeout_ms / 1000.0 - (time.perf_counter() - started)
        if request.mode == LEXICAL:
            if request.top_m is not None:
                raise InvalidRequest("top_m routes by the query vector; a lexical query reads every shard",
                                     field="top_m")
            lexical_started = time.perf_counter()
            result = await self.lexical.search(text, params, snapshot.route, timeout_s=max(deadline_s, 0.001),
                                               session=session)
            took = (time.perf_counter() - lexical_started) * 1000.0
            return Legs(result, [shaped_hit(h, params.with_metadata) for h in result.hits], 0.0, took, took,
                        leg=LEXICAL)
        return await self._hybrid(request, text, params, snapshot, session, deadline_s)

    async def _hybrid(self, request: QueryRequest, text: str, params: SearchParams, snapshot: VersionSnapshot,
                      session: Mapping[int, SessionFloor] | None, deadline_s: float) -> Legs:
        if request.fusion == WEIGHTED:
            return await self._weighted(request, text, params, snapshot, session, deadline_s)
        service = self.service
        depth = max(params.k, request.candidates or DEFAULT_CANDIDATES)
        leg_params = replace(params, k=depth)
        timing: dict[str, float] = {}

        async def query_vector() -> tuple[np.ndarray, float]:
            """The query's vector (given, or the text embedded) and the seconds of the deadline left."""
            if request.vector is not None:
                return service._vector(request, snapshot), deadline_s
            vector, timing["encode_ms"] = await service.encode_timed(snapshot, text, deadline_s * 1000.0)
            return vector, deadline_s - timing["encode_ms"] / 1000.0

        async def dense() -> FanOutResult:
            vector, remaining = await query_vector()
            fanout_started = time.perf_counter()
            result = await service.fanout.search(vector, leg_params, snapshot.route, top_m=request.top_m,
                                                 timeout_s=max(remaining, 0.001), session=session,
                                                 exact=request.exact)
            timing["fanout_ms"] = (time.perf_counter() - fanout_started) * 1000.0
            return result

        async def lexical() -> FanOutResult:
            lexical_started = time.perf_counter()
            result = await self.lexical.search(text, leg_params, snapshot.route, timeout_s=max(deadline_s, 0.001),
                                               session=session)
            timing["lexical_ms"] = (time.perf_counter() - lexical_started) * 1000.0
            return result

        ready = service._vector(request, snapshot) if request.vector is not None else \
            snapshot.encoder.cached(text) if snapshot.encoder is not None else None
        if request.top_m is None and ready is not None:
            # the vector needs no encoding: both legs in one call per shard
            if request.vector is None:
                service.recent_queries.append(text)
            vector, remaining = ready, deadline_s
            both_started = time.perf_counter()
            dense_result, lexical_result = await self.lexical.search_hybrid(
                text, vector, leg_params, snapshot.route, timeout_s=max(remaining, 0.001), session=session)
            timing["fanout_ms"] = timing["lexical_ms"] = (time.perf_counter() - both_started) * 1000.0
        else:
            # the text must be embedded first: the lexical leg runs meanwhile; or top_m routes the
            # dense leg alone (the lexical one reads every shard)
            dense_result, lexical_result = await asyncio.gather(dense(), lexical())
        fused = fuse_rrf({DENSE: dense_result.hits, LEXICAL: lexical_result.hits}, params.k, rrf_k=request.rrf_k)
        merged = replace(dense_result, missing={**lexical_result.missing, **dense_result.missing})
        return Legs(merged, _shaped_fused(fused, params.with_metadata), timing.get("encode_ms", 0.0),
                    timing.get("fanout_ms", 0.0), timing.get("lexical_ms", 0.0),
                    f"{RRF} k={request.rrf_k}, {depth} candidates per leg", lexical=lexical_result)

    async def _weighted(self, request: QueryRequest, text: str, params: SearchParams, snapshot: VersionSnapshot,
                        session: Mapping[int, SessionFloor] | None, deadline_s: float) -> Legs:
        if request.top_m is not None:
            raise InvalidRequest("top_m routes the dense leg alone; a weighted hybrid fuses both legs on every "
                                 "shard (use fusion rrf, or leave top_m out)", field="top_m")
        service = self.service
        dense_weight, lexical_weight = weights_of(request.weights.model_dump() if request.weights else None)
        spec = WeightedFusion(dense_weight, lexical_weight, max(params.k, request.candidates or DEFAULT_CANDIDATES))
        encode_ms = 0.0
        if request.vector is not None:
            vector = service._vector(request, snapshot)
        elif (cached := snapshot.encoder.cached(text) if snapshot.encoder is not None else None) is not None:
            vector = cached
            service.recent_queries.append(text)
        else:  # embed the text; meanwhile fetch the collection's statistics if the gateway knows none yet
            (vector, encode_ms), _ = await asyncio.gather(
                service.encode_timed(snapshot, text, deadline_s * 1000.0),
                self.lexical.prime(text, params, snapshot.route, timeout_s=max(deadline_s, 0.001), session=session))
        both_started = time.perf_counter()
        remaining = deadline_s - encode_ms / 1000.0
        result, fused = await self.lexical.search_weighted(text, vector, spec, params, snapshot.route,
                                                           timeout_s=max(remaining, 0.001), session=session)
        took = (time.perf_counter() - both_started) * 1000.0
        return Legs(result, _shaped_fused(fused, params.with_metadata), encode_ms, took, took,
                    f"{WEIGHTED} dense={dense_weight:g} lexical={lexical_weight:g}, legs read {spec.depth} deep "
                    "first", leg="hybrid")


def _shaped_fused(fused: list[FusedHit], with_metadata: bool) -> list[dict[str, Any]]:
    hits = []
    for item in fused:
        shaped = shaped_hit(item.hit, with_metadata)
        shaped["score"] = item.score
        shaped["legs"] = {leg: {"rank": where.rank, "score": where.score} for leg, where in item.legs.items()}
        hits.append(shaped)
    return hits


def shaped_hit(hit: Hit, with_metadata: bool) -> dict[str, Any]:
    """A hit as the API returns it (with its metadata when the query asked ``with_metadata``)."""
    shaped = {"doc_id": hit.doc_id, "score": hit.score, "shard": hit.shard_id, "version": hit.version,
              "title": hit.title, "text": hit.text}
    if with_metadata:
        shaped["metadata"] = dict(hit.metadata or {})
    return shaped
