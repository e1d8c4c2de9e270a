"""The query path: validate a query, take the version snapshot, embed the text, fan out, shape
the answer. Usable without HTTP (the app, the answer service and the quality gate call it).

Each query reads the registry's view once (:class:`~serving.versions.registry.RegistryView`) and
works on that one immutable :class:`~serving.versions.registry.VersionSnapshot` to the end: the
version, its topology, its encoder and the replicas eligible for it cannot change under it.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, TypeVar

import numpy as np
from pydantic import BaseModel, ValidationError

from httpkit import tracing
from retrieval.blank import is_blank
from retrieval.contract import SearchParams, SessionFloor
from retrieval.errors import (
    DeadlineExceeded,
    DimensionMismatch,
    EncoderError,
    InvalidRequest,
    ShardragError,
    VersionConflict,
    validation_error_body,
)
from retrieval.filters import parse_filter
from retrieval.fusion import RRF, WEIGHTED
from retrieval.query_defaults import PLAIN, QueryDefaults
from retrieval.wire import check_finite
from serving.gateway.api_models import LegWeights, QueryRequest
from serving.gateway.config import Limits
from serving.gateway.grouping import Grouping, check_grouping, first_depth, group_hits
from serving.gateway.metrics import GatewayMetrics
from serving.gateway.search_modes import Legs, SearchModes, shaped_hit
from serving.shardcall.fanout import FanOut
from serving.shardcall.lexical import LexicalFanOut
from serving.versions.registry import VersionRegistry, VersionSnapshot


class Rejected(ShardragError):
    """A validation failure with its ready-made (status, body)."""

    def __init__(self, status: int, body: dict[str, Any], message: str, field: str | None) -> None:
        super().__init__(message, field=field)
        self.status_code = status
        self.body = body

    def to_dict(self) -> dict[str, Any]:
        return self.body


M = TypeVar("M", bound=BaseModel)


def parse_body(model: type[M], body: bytes) -> M:
    """``body`` parsed and validated in one pass by pydantic's JSON parser; a failure is a
    :class:`Rejected` naming the first bad field."""
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        status, payload = validation_error_body([dict(error) for error in exc.errors()])
        error = payload["error"]
        raise Rejected(status, payload, error["message"], error.get("field")) from None


class QueryService:
    def __init__(self, limits: Limits, registry: VersionRegistry, fanout: FanOut, metrics: GatewayMetrics, *,
                 recent_queries: int = 200, defaults: QueryDefaults = PLAIN) -> None:
        self.limits = limits
        self.defaults = defaults  # the collection's query defaults (a query's own fields win)
        self.registry = registry
        self.fanout = fanout
        self.metrics = metrics
        self.recent_queries: deque[str] = deque(maxlen=recent_queries)  # the quality gate's default sample
        self.modes = SearchModes(self, LexicalFanOut(fanout, metrics.count_lexical_rounds))  # lexical and hybrid

    @property
    def defaults(self) -> QueryDefaults:
        return self._defaults

    @defaults.setter
    def defaults(self, defaults: QueryDefaults) -> None:
        self._defaults = defaults
        self._defaulting = not defaults.is_plain  # read per query: a plain collection's pay nothing

    @staticmethod
    def parse(body: bytes) -> QueryRequest:
        return parse_body(QueryRequest, body)

    def _snapshot(self, pinned: str | None) -> VersionSnapshot:
        view = self.registry.view  # read once: a query started on V finishes on V
        version = view.state.active
        if pinned is not None and pinned != version:
            if pinned not in view.state.loaded():
                raise VersionConflict(f"version {pinned!r} is not served; loaded: {list(view.state.loaded())}",
                                      field="version")
            version = pinned
        return view.snapshot(version)

    async def encode(self, snapshot: VersionSnapshot, text: str, timeout_s: float) -> np.ndarray:
        if snapshot.encoder is None:
            raise EncoderError(f"no query encoder for version {snapshot.version}", field="text")
        return await snapshot.encoder.encode(text, timeout_s)

    async def search_text(self, text: str, version: str, k: int) -> list[str]:
        """Doc ids of the top ``k`` for ``text`` on ``version`` (the quality gate's search)."""
        snapshot = self.registry.view.snapshot(version)
        vector = await self.encode(snapshot, text, self.limits.default_timeout_ms / 1000.0)
        outcome = await self.fanout.search(vector, SearchParams(k=k, version=version, with_text=False),
                                           snapshot.route, top_m=None,
                                           timeout_s=self.limits.default_timeout_ms / 1000.0)
        return [hit.doc_id for hit in outcome.hits]

    async def retrieve(self, query: dict[str, Any]) -> dict[str, Any]:
        """A query body's answer (the answer service's retrieval: ``serving.answer.service.retrieval_query``)."""
        return await self.query(QueryRequest.model_validate(query))

    def _vector(self, request: QueryRequest, snapshot: VersionSnapshot) -> np.ndarray:
        limits = self.limits
        with np.errstate(over="ignore"):  # values beyond float32 range become inf, refused below
            vector = np.asarray(request.vector, dtype=np.float32)
        dim = snapshot.topology.dim
        if vector.shape != (dim,):
            raise DimensionMismatch(f"vector has {vector.size} dims, version {snapshot.version} has {dim}",
                                    field="vector")
        check_finite(vector, field="vector")
        if vector.size and float(np.abs(vector).max()) > limits.max_vector_abs:
            raise InvalidRequest(f"vector components must be within ±{limits.max_vector_abs:g} "
                                 "(larger ones overflow float32 scores)", field="vector")
        return vector

    @staticmethod
    def _session(request: QueryRequest, snapshot: VersionSnapshot) -> dict[int, SessionFloor] | None:
        """Per shard, what a replica must hold to answer a session read (min_seq, with min_term)."""
        if request.consistency != "session":
            for name in ("min_seq", "min_term"):
                if getattr(request, name):
                    raise InvalidRequest(f"{name} needs consistency: session", field=name)
            return None
        names = {str(i) for i in range(snapshot.topology.num_shards)}
        seqs, terms = request.min_seq or {}, request.min_term or {}
        for name, given in (("min_seq", seqs), ("min_term", terms)):
            for shard in given:
                if shard not in names:  # exactly "0", "1", ...: the keys a write's reply uses
                    raise InvalidRequest(f"{name} names shard {shard!r}; this collection has shards 0.."
                                         f"{snapshot.topology.num_shards - 1}", field=f"{name}.{shard}")
        return {int(shard): SessionFloor(seqs.get(shard, 0), terms.get(shard)) for shard in {*seqs, *terms}}

    async def query(self, request: QueryRequest) -> dict[str, Any]:
        limits = self.limits
        started = time.perf_counter()
        k = request.k if request.k is not None else limits.default_k
        if k > limits.max_k:
            raise InvalidRequest(f"k must be between 1 and {limits.max_k}, got {k}", field="k")
        timeout_ms = request.timeout_ms if request.timeout_ms is not None else limits.default_timeout_ms
        if not limits.min_timeout_ms <= timeout_ms <= limits.max_timeout_ms:
            raise InvalidRequest(f"timeout_ms must be between {limits.min_timeout_ms} and {limits.max_timeout_ms}",
                                 field="timeout_ms")
        check_grouping(request.group_by, request.group_size, k, limits.max_group_read)
        given = request.model_fields_set
        defaulted: list[str] = []
        if self._defaulting:  # a plain collection's queries are searched as they come
            request, defaulted = with_query_defaults(request, self._defaults)
        check_fusion_fields(request, given)
        if request.group_by is None:
            return self._answer(request, await self._ranked(request, k, timeout_ms, started), started, defaulted)
        return await self._grouped(request, k, timeout_ms, started, defaulted)

    async def _grouped(self, request: QueryRequest, k: int, timeout_ms: int, started: float,
                       defaulted: list[str]) -> dict[str, Any]:
        """The k best groups (``serving.gateway.grouping``): rounds ever deeper, on one version."""
        assert request.group_by is not None
        size, max_read = request.group_size or 1, self.limits.max_group_read
        depth, rounds, searched = first_depth(k, size, max_read), 0, request.model_copy(update={"with_metadata": True})
        whole: tuple[Legs, list[dict[str, Any]], int, int] | None = None  # the last round every shard answered
        while True:
            legs = await self._ranked(searched, depth, timeout_ms, started)
            rounds += 1
            if whole is not None and legs.result.missing:
                # a deeper round lost a shard the round before had (its deadline, most often): the
                # whole shallower answer stands, not filled, rather than a partial one or a 504
                (legs, hits, groups, depth), filled = whole, False
                break
            hits, groups, filled = group_hits(legs.hits, request.group_by, k, size)
            filled = filled or len(legs.hits) < depth  # or the list ran out: every matching document read
            if filled or depth == max_read:
                break
            whole = (legs, hits, groups, depth) if not legs.result.missing else None
            depth = min(max_read, depth * 2)
            searched = searched.model_copy(update={"version": legs.result.version})  # a rollout never mixes models
        if not request.with_metadata:
            for hit in hits:
                hit.pop("metadata", None)
        legs.hits = hits
        return self._answer(request, legs, started, defaulted,
                            Grouping(request.group_by, size, groups, depth, rounds, filled))

    async def _ranked(self, request: QueryRequest, k: int, timeout_ms: int, started: float) -> Legs:
        """The query's top ``k`` in its mode, as legs for the answer."""
        snapshot = self._snapshot(request.version)
        text = self._text(request)
        filter_ = parse_filter(request.filter) if request.filter is not None else None
        params = SearchParams(k=k, version=snapshot.version, nprobe=request.nprobe, ef_search=request.ef_search,
                              with_text=request.with_text, with_metadata=request.with_metadata,
                              filter=filter_.canonical() if filter_ is not None and not filter_.empty else None)
        session = self._session(request, snapshot)
        if request.mode != "dense":
            return await self.modes.run(request, text, params, snapshot, session, timeout_ms, started)
        encode_ms = 0.0
        if request.vector is not None:
            vector = self._vector(request, snapshot)
        else:
            assert text is not None
            vector, encode_ms = await self.encode_timed(snapshot, text, timeout_ms)
        fanout_started = time.perf_counter()
        remaining_ms = timeout_ms - (fanout_started - started) * 1000.0  # encoding spent part of it
        with tracing.span("fanout", **{"shardrag.k": k, "shardrag.version": snapshot.version}):
            result = await self.fanout.search(vector, params, snapshot.route, top_m=request.top_m,
                                              timeout_s=max(remaining_ms, 1.0) / 1000.0, session=session,
                                              exact=request.exact)
        fanout_ms = (time.perf_counter() - fanout_started) * 1000.0
        return Legs(result, [shaped_hit(h, request.with_metadata) for h in result.hits], encode_ms, fanout_ms)

    def _text(self, request: QueryRequest) -> str | None:
        """The query text, checked; None for a dense vector query."""
        if request.mode == "dense" and (request.text is None) == (request.vector is None):
            raise InvalidRequest("give exactly one of 'text' and 'vector'",
                                 field="text" if request.text is not None else "vector")
        if request.mode == "lexical" and request.vector is not None:
            raise InvalidRequest("mode lexical ranks the text; leave vector out", field="vector")
        if request.text is None:
            if request.mode != "dense":
                raise InvalidRequest(f"mode {request.mode} needs the query's text", field="text")
            return None
        if is_blank(request.text):  # retrieval.blank's blanks: the ones the schema's pattern names
            raise InvalidRequest("text is empty or white space only", field="text")
        if len(request.text) > self.limits.max_text_chars:  # as given, as the schema's maxLength counts
            raise InvalidRequest(f"text is longer than {self.limits.max_text_chars} characters", field="text")
        return request.text.strip()

    async def encode_timed(self, snapshot: VersionSnapshot, text: str, timeout_ms: float) -> tuple[np.ndarray, float]:
        """The text's vector and the milliseconds it took (recorded as the encode latency)."""
        encode_started = time.perf_counter()
        with tracing.span("encode", **{"shardrag.version": snapshot.version}):
            vector = await self.encode(snapshot, text, timeout_ms / 1000.0)
        encode_ms = (time.perf_counter() - encode_started) * 1000.0
        self.metrics.encode_latency.observe(encode_ms / 1000.0)
        self.recent_queries.append(text)
        return vector, encode_ms

    def _answer(self, request: QueryRequest, legs: Legs, started: float, defaulted: list[str],
                grouping: Grouping | None = None) -> dict[str, Any]:
        result = legs.result
        missing = sorted(result.missing)
        allow_partial = request.allow_partial if request.allow_partial is not None else self.limits.allow_partial
        if missing and (not allow_partial or not result.calls):
            reasons = "; ".join(f"shard {s}: {result.missing[s]}" for s in missing)
            why = "partial answers not allowed" if result.calls else "no shard answered"
            raise DeadlineExceeded(f"{why}: shards {missing} missing ({reasons})", shard=missing[0])
        if missing:
            self.metrics.partial_responses.inc()
        took_ms = (time.perf_counter() - started) * 1000.0
        self.metrics.observe_query(request.mode if request.mode != "hybrid" else f"hybrid_{request.fusion}",
                                   took_ms / 1000.0)
        return {
            "hits": legs.hits,
            "version": result.version,
            "partial": bool(missing),
            "coverage": len(result.calls) / len(result.shards_queried),
            "missing_shards": [{"shard": s, "reason": result.missing[s]} for s in missing],
            "diagnostics": {
                "embedding_version": result.version,
                "shards_total": result.shards_total,
                "shards_queried": len(result.shards_queried),
                "shards_answered": len(result.calls),
                "took_ms": took_ms,
                "encode_ms": legs.encode_ms,
                "fanout_ms": legs.fanout_ms,
                "shard_k": result.asked_k,
                "second_round": list(result.second_round),
                "trimming": result.trimming,
                "per_shard": [
                    {"shard": c.shard_id, "replica": c.replica, "latency_ms": c.latency_ms, "server_ms": c.server_ms,
                     "batch_size": c.batch_size, "attempts": c.attempts, "hedged": c.hedged,
                     "hedge_won": c.hedge_won, "leg": leg}
                    for leg, calls in legs.calls() for c in calls
                ],
                "mode": request.mode,
                "fusion": legs.fusion,
                "lexical_ms": legs.lexical_ms,
                "lexical_terms": legs.lexical_terms,
                "defaulted": defaulted,
                "groups": grouping.to_dict() if grouping is not None else None,
            },
        }


_FUSION_FIELDS = ("fusion", "rrf_k", "weights", "candidates")


def with_query_defaults(request: QueryRequest, defaults: QueryDefaults) -> tuple[QueryRequest, list[str]]:
    """The query as it is searched — the fields it names, the collection's defaults for the others
    — and the fields the defaults gave. A query with a vector and no text stays dense: a lexical
    leg needs text."""
    given = request.model_fields_set
    update: dict[str, Any] = {}
    if "mode" not in given and request.text is not None and defaults.mode != request.mode:
        update["mode"] = defaults.mode
    if update.get("mode", request.mode) == "hybrid":
        if "fusion" not in given and defaults.fusion != request.fusion:
            update["fusion"] = defaults.fusion
        fusion = update.get("fusion", request.fusion)
        if fusion == WEIGHTED and "weights" not in given and (weights := defaults.leg_weights()) is not None:
            update["weights"] = LegWeights(**weights)
        if fusion == RRF and "rrf_k" not in given and defaults.rrf_k != request.rrf_k:
            update["rrf_k"] = defaults.rrf_k
    return (request.model_copy(update=update), list(update)) if update else (request, [])


def check_fusion_fields(request: QueryRequest, given: set[str] | None = None) -> None:
    """Refuse the fields that shape a fusion where they would be ignored: ``fusion: rrf`` without
    ``mode: hybrid`` is a dense query its sender believes hybrid, ``weights`` with rrf a weighting
    that never happens, ``rrf_k`` with the weighted fusion an offset nobody reads. ``given``: the
    fields the sender named (default: the request's own; a collection's defaults never count)."""
    given = request.model_fields_set if given is None else given
    if request.mode != "hybrid":
        for name in _FUSION_FIELDS:
            if name in given and getattr(request, name) is not None:
                raise InvalidRequest(f"{name} shapes a hybrid query's fusion, and mode is {request.mode} "
                                     "(send \"mode\": \"hybrid\", or leave it out)", field=name)
        return
    if request.fusion == "rrf" and request.weights is not None:
        raise InvalidRequest("weights are the weighted fusion's; rrf ranks by each leg's ranks alone "
                             "(send \"fusion\": \"weighted\", or leave weights out)", field="weights")
    if request.fusion == "weighted" and "rrf_k" in given:
        raise InvalidRequest("rrf_k is rrf's rank offset, and fusion is weighted (send \"fusion\": \"rrf\", or "
                             "leave rrf_k out)", field="rrf_k")
