"""The gateway: embeds the query, fans out to every shard (or the ``top_m`` nearest), merges.

    POST /v1/query    {text | vector, k, nprobe, ef_search, top_m, timeout_ms, with_text, version}
    GET  /v1/cluster  shards, replicas, versions, live health
    GET  /healthz     gateway + encoder state
    GET  /metrics     Prometheus
    GET  /docs        OpenAPI UI

:class:`Gateway` holds the logic (usable without HTTP); :func:`create_app` puts FastAPI around
it. The query handler parses the body itself (pydantic's JSON parser, no FastAPI body
machinery) because it is the hot path; the same model documents it in OpenAPI.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Sequence

import numpy as np
import orjson
from fastapi import FastAPI, Request, Response
from fastapi.responses import PlainTextResponse, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError

from retrieval.errors import (
    DeadlineExceeded,
    DimensionMismatch,
    EncoderError,
    InvalidRequest,
    ShardragError,
    VersionConflict,
    validation_error_body,
)
from retrieval.serve import FastPathApp, install_error_handlers, read_limited_body
from retrieval.wire import check_finite

from serving.api_models import (
    ERROR_RESPONSES,
    ActivateCommand,
    QueryRequest,
    QueryResponse,
    RetireCommand,
    StageCommand,
    VersionCommand,
)
from retrieval.auth import RateLimiter, gateway_policy, guard_from_env
from serving.answer import AnswerRequest, AnswerService
from serving.balancer import make_balancer
from serving.config import GatewayConfig
from serving.fanout import FanOut, ShardCall
from serving.health import OutlierDetector
from serving.metrics import GatewayMetrics
from serving.query_encoder import QueryEncoder
from serving.rollout_service import RolloutService
from serving.rollout_store import RolloutStore, make_store
from serving.shard_call import HedgingSettings, ShardCaller
from serving.versions import DEFAULT_MODEL, EncoderLoader, VersionRegistry
from serving.transport import TRANSPORTS, SearchParams, ShardTransport

logger = logging.getLogger(__name__)


class Gateway:
    def __init__(
        self,
        config: GatewayConfig,
        shard_replicas: Sequence[Sequence[str]],
        *,
        transport: ShardTransport | None = None,
        encoder_loader: EncoderLoader | None = None,
        store: RolloutStore | None = None,
        generators: Sequence[str] = (),
    ) -> None:
        config.validate()
        self.config = config
        self.shard_replicas = [list(r) for r in shard_replicas]
        if transport is None and config.transport not in TRANSPORTS:
            raise InvalidRequest(f"unknown transport {config.transport!r}; use one of {sorted(TRANSPORTS)}",
                                 field="transport")
        self.transport = transport or TRANSPORTS[config.transport]()
        self._encoder_loader = encoder_loader
        self.store = store or make_store(config.rollout_state_path)
        self.metrics = GatewayMetrics.create()
        self.registry: VersionRegistry | None = None
        self.fanout: FanOut | None = None
        self.detector: OutlierDetector | None = None
        self.caller: ShardCaller | None = None
        self.rollout: RolloutService | None = None
        self.recent_queries: deque[str] = deque(maxlen=max(config.gate_sample * 4, 100))
        self.answers = AnswerService(self, generators, timeout_s=config.answer_timeout_s)
        self._tasks: list[asyncio.Future[None]] = []

    async def start(self) -> None:
        config = self.config
        self.registry = VersionRegistry(
            self.shard_replicas, self.transport, self.store,
            encoder_loader=self._encoder_loader if config.load_encoder else None,
            default_model=config.encoder_model or DEFAULT_MODEL,
            discovery_timeout_s=config.discovery_timeout_s, probe_timeout_s=config.probe_timeout_s)
        await self.registry.start()
        self.detector = OutlierDetector(consecutive_failures=config.eject_after_failures,
                                        base_ejection_s=config.eject_base_s, max_ejection_s=config.eject_max_s,
                                        on_eject=self._on_eject)
        hedging = HedgingSettings(enabled=config.hedging, percentile=config.hedge_percentile,
                                  floor_s=config.hedge_floor_ms / 1000.0, cap_s=config.hedge_cap_ms / 1000.0,
                                  max_hedges=config.max_hedges, budget_ratio=config.hedge_budget_ratio,
                                  budget_burst=config.hedge_budget_burst)
        self.caller = ShardCaller(self.transport, make_balancer(config.balancer), self.detector, hedging,
                                  on_not_eligible=self.registry.mark_not_eligible)
        self.metrics.watch_calls(self.caller)
        self.fanout = FanOut(
            self.shard_replicas, self.caller, self.registry.eligible, coalesce=config.coalesce,
            max_batch=config.max_batch, max_inflight_per_replica=config.max_inflight_per_replica,
            on_call=self._observe_call,
        )
        self.rollout = RolloutService(self)
        self._tasks = [asyncio.ensure_future(self._probe_ejected()),
                       asyncio.ensure_future(self.registry.poll_forever(config.poll_interval_s))]

    def _on_eject(self, replica: str, duration_s: float) -> None:
        logger.warning("replica %s ejected for %.1f s after repeated failures", replica, duration_s)
        self.metrics.ejections.labels(replica=replica).inc()

    async def _probe_ejected(self) -> None:
        """Bring ejected replicas back once their back-off has passed and /healthz answers."""
        assert self.detector is not None
        while True:
            await asyncio.sleep(self.config.probe_interval_s)
            for replica in self.detector.due_for_probe():
                try:
                    await self.transport.get_json(replica, "/healthz", self.config.probe_timeout_s)
                except ShardragError:
                    self.detector.probe_result(replica, ok=False)
                else:
                    logger.info("replica %s answers /healthz again: back in rotation", replica)
                    self.detector.probe_result(replica, ok=True)

    def _observe_call(self, call: ShardCall) -> None:
        self.metrics.observe_shard_call(call.shard_id, call.replica, call.latency_ms / 1000.0, call.batch_size)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self.registry is not None:
            self.registry.close()
        await self.answers.close()
        await self.transport.close()

    def parse(self, body: bytes) -> QueryRequest:
        try:
            return QueryRequest.model_validate_json(body)
        except ValidationError as exc:
            status, payload = validation_error_body(list(exc.errors()))
            error = payload["error"]
            raise _Rejected(status, payload, error["message"], error.get("field")) from None

    def encoder_for(self, version: str) -> QueryEncoder:
        assert self.registry is not None
        encoder = self.registry.encoders.get(version)
        if encoder is None:
            raise EncoderError(f"no query encoder for version {version}", field="text")
        return encoder

    def active_topology(self) -> Any | None:
        """The active version's topology (None before it is known)."""
        try:
            assert self.registry is not None and self.registry.state is not None
            return self.registry.topology(self.registry.state.active)
        except Exception:  # noqa: BLE001 - not started yet
            return None

    async def query(self, request: QueryRequest) -> dict[str, Any]:
        assert self.registry is not None and self.fanout is not None
        config = self.config
        started = time.perf_counter()
        state = self.registry.state  # read once: a query started on V finishes on V
        assert state is not None
        k = request.k if request.k is not None else config.default_k
        if k > config.max_k:
            raise InvalidRequest(f"k must be between 1 and {config.max_k}, got {k}", field="k")
        timeout_ms = request.timeout_ms if request.timeout_ms is not None else config.default_timeout_ms
        if not config.min_timeout_ms <= timeout_ms <= config.max_timeout_ms:
            raise InvalidRequest(f"timeout_ms must be between {config.min_timeout_ms} and {config.max_timeout_ms}",
                                 field="timeout_ms")
        version = state.active
        if request.version is not None and request.version != version:
            if request.version not in state.loaded():
                raise VersionConflict(f"version {request.version!r} is not served; loaded: {list(state.loaded())}",
                                      field="version")
            version = request.version
        topology = self.registry.topology(version)
        if (request.text is None) == (request.vector is None):
            raise InvalidRequest("give exactly one of 'text' and 'vector'",
                                 field="text" if request.text is not None else "vector")
        encode_ms = 0.0
        if request.vector is not None:
            with np.errstate(over="ignore"):  # values beyond float32 range become inf, refused below
                vector = np.asarray(request.vector, dtype=np.float32)
            if vector.shape != (topology.dim,):
                raise DimensionMismatch(f"vector has {vector.size} dims, version {version} has {topology.dim}",
                                        field="vector")
            check_finite(vector, field="vector")
            if vector.size and float(np.abs(vector).max()) > config.max_vector_abs:
                raise InvalidRequest(f"vector components must be within ±{config.max_vector_abs:g} "
                                     "(larger ones overflow float32 scores)", field="vector")
        else:
            text = request.text.strip() if request.text is not None else ""
            if not text:
                raise InvalidRequest("text is empty", field="text")
            if len(text) > config.max_text_chars:
                raise InvalidRequest(f"text is longer than {config.max_text_chars} characters", field="text")
            encode_started = time.perf_counter()
            vector = await self.encoder_for(version).encode(text)
            encode_ms = (time.perf_counter() - encode_started) * 1000.0
            self.metrics.encode_latency.observe(encode_ms / 1000.0)
            self.recent_queries.append(text)
        params = SearchParams(k=k, version=version, nprobe=request.nprobe, ef_search=request.ef_search,
                              with_text=request.with_text)
        remaining_ms = timeout_ms - (time.perf_counter() - started) * 1000.0  # encoding spent part of it
        result = await self.fanout.search(vector, params, topology, top_m=request.top_m,
                                          timeout_s=max(remaining_ms, 1.0) / 1000.0)
        missing = sorted(result.missing)
        allow_partial = request.allow_partial if request.allow_partial is not None else config.allow_partial
        if missing and (not allow_partial or not result.calls):
            reasons = "; ".join(f"shard {s}: {result.missing[s]}" for s in missing)
            why = "partial answers not allowed" if result.calls else "no shard answered"
            raise DeadlineExceeded(f"{why}: shards {missing} missing ({reasons})", shard=missing[0])
        if missing:
            self.metrics.partial_responses.inc()
        took_ms = (time.perf_counter() - started) * 1000.0
        self.metrics.query_latency.observe(took_ms / 1000.0)
        return {
            "hits": [
                {"doc_id": h.doc_id, "score": h.score, "shard": h.shard_id, "version": h.version, "title": h.title,
                 "text": h.text}
                for h in result.hits
            ],
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
                "encode_ms": encode_ms,
                "per_shard": [
                    {"shard": c.shard_id, "replica": c.replica, "latency_ms": c.latency_ms,
                     "batch_size": c.batch_size, "attempts": c.attempts, "hedged": c.hedged,
                     "hedge_won": c.hedge_won}
                    for c in result.calls
                ],
            },
        }

    async def cluster(self) -> dict[str, Any]:
        assert self.registry is not None and self.registry.state is not None
        timeout_s = self.config.probe_timeout_s
        ejection = self.detector.snapshot() if self.detector else {}
        active = self.registry.topology(self.registry.state.active)

        async def probe(replica: str) -> dict[str, Any]:
            started = time.perf_counter()
            state = ejection.get(replica, {"ejected": False})
            try:
                info = await self.transport.get_json(replica, "/v1/info", timeout_s)
            except ShardragError as exc:
                return {"url": replica, "healthy": False, "error": exc.message, "ejection": state}
            return {"url": replica, "healthy": True,
                    "versions": [{k: v.get(k) for k in ("id", "state", "count", "error") if k in v}
                                 for v in info.get("versions", [])],
                    "on_gpu": info.get("on_gpu"), "latency_ms": (time.perf_counter() - started) * 1000.0,
                    "ejection": state}

        supervision = self._supervision()
        by_url = {c.get("url"): c for c in (supervision or {}).get("children", []) if c.get("url")}
        shards = []
        for shard in active.shards:
            replicas = await asyncio.gather(*(probe(r) for r in shard.replicas))
            for replica in replicas:
                child = by_url.get(replica["url"])
                if child is not None:
                    replica["restarts"] = child.get("restarts", 0)
                    replica["last_exit_code"] = child.get("last_exit_code")
            shards.append({"shard": shard.shard_id, "count": shard.count, "replicas": replicas,
                           "healthy_replicas": sum(r["healthy"] for r in replicas)})
        return {
            "collection": active.collection,
            "embedding_version": active.version.to_dict(),
            "rollout": self.registry.state.to_dict(),
            "partitioner": active.partitioner,
            "factory": active.factory,
            "metric": active.metric,
            "num_shards": active.num_shards,
            "shards": shards,
            "encoders": {v: {"state": e.state, "error": e.error} for v, e in self.registry.encoders.items()},
            "balancer": self.config.balancer,
            "hedging": self._hedging_state(),
            "supervision": supervision,
        }

    def _supervision(self) -> dict[str, Any] | None:
        """Restarts of every process the local launcher supervises (None when not launched by it)."""
        if not self.config.supervision_path:
            return None
        try:
            payload = orjson.loads(Path(self.config.supervision_path).read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return None
        children = payload.get("children", [])
        return {"updated_at": payload.get("updated_at"), "total_restarts": sum(c.get("restarts", 0) for c in children),
                "children": children}

    def _hedging_state(self) -> dict[str, Any]:
        if self.caller is None:
            return {}
        stats = self.caller.stats
        return {"enabled": self.config.hedging, "calls": stats.calls, "hedges_fired": stats.hedges_fired,
                "hedges_won": stats.hedges_won, "budget_exhausted": stats.budget_exhausted, "retries": stats.retries,
                "delay_ms": {str(s): self.caller.hedge_delay(s).delay_s() * 1000.0
                             for s in range(len(self.shard_replicas))}}


class _Rejected(ShardragError):
    """A validation failure with its ready-made (status, body)."""

    def __init__(self, status: int, body: dict[str, Any], message: str, field: str | None) -> None:
        super().__init__(message, field=field)
        self.status_code = status
        self.body = body

    def to_dict(self) -> dict[str, Any]:
        return self.body


def _json(payload: object, status_code: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(payload), status_code=status_code, media_type="application/json", headers=headers)


def query_request_schema(gateway: Gateway) -> dict[str, Any]:
    """QueryRequest's JSON schema with this gateway's limits and the collection's dimension in it,
    so that every request the schema allows is one the gateway accepts (what fuzzers check)."""
    schema = QueryRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    config, props = gateway.config, schema["properties"]
    bound = float(config.max_vector_abs)

    def set_in(name: str, **limits: Any) -> None:
        for option in props[name].get("anyOf", [props[name]]):
            if option.get("type") != "null":
                option.update(limits)

    set_in("k", maximum=config.max_k)
    set_in("timeout_ms", minimum=config.min_timeout_ms, maximum=config.max_timeout_ms)
    set_in("text", maxLength=config.max_text_chars, pattern=r"\S")
    vector: dict[str, Any] = {"type": "array", "minItems": 1,
                              "items": {"type": "number", "minimum": -bound, "maximum": bound}}
    topology = gateway.active_topology()
    if topology is not None:
        vector.update(minItems=int(topology.dim), maxItems=int(topology.dim))
        n = int(topology.num_shards)  # top_m < n needs kmeans centroids to route with
        set_in("top_m", minimum=1 if topology.centroids is not None else n, maximum=n)
        factory = str(topology.factory or "")
        for name, applies in (("nprobe", "IVF" in factory), ("ef_search", "HNSW" in factory)):
            if not applies:  # the index has no such knob: the field may only be null
                props[name] = {"type": "null", "title": props[name].get("title", name),
                               "description": props[name].get("description", "") + f" (not for {factory})"}
    set_in("vector", **{k: v for k, v in vector.items() if k != "type"})
    # exactly one of text and vector
    schema["oneOf"] = [{"required": ["text"], "properties": {"text": {"type": "string"}}},
                       {"required": ["vector"], "properties": {"vector": {"type": "array"}}}]
    return schema


def create_app(gateway: Gateway) -> Any:
    """The gateway's ASGI app: a fast path for POST /v1/query around the FastAPI app."""
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await gateway.start()
        try:
            yield
        finally:
            await gateway.close()

    app = FastAPI(
        title="shardrag gateway",
        description="Sharded retrieval for RAG: embed, fan out to every shard, merge the exact top k.",
        version="1",
        lifespan=lifespan,
    )
    install_error_handlers(app)
    metrics = gateway.metrics

    async def handle_query(scope: dict[str, Any], body: bytes, receive: Any = None) -> tuple[int, bytes]:
        return 200, orjson.dumps(await gateway.query(gateway.parse(body)))

    @app.post(
        "/v1/query",
        summary="Top-k documents for a text or a vector",
        response_model=QueryResponse,
        responses=ERROR_RESPONSES,
        openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
            "schema": {"$ref": "#/components/schemas/QueryRequest"}}}}},
    )
    async def query(request: Request) -> Response:
        # Served by the fast path; this route documents it and answers without the wrapper.
        status, payload = await handle_query(request.scope, await read_limited_body(request, gateway.config.max_body_bytes))
        return Response(payload, status_code=status, media_type="application/json")

    if gateway.answers.generators:  # the endpoint exists only with generator workers behind it
        @app.post("/v1/answer", summary="Retrieve, then generate an answer that cites the passages",
                  responses=ERROR_RESPONSES)
        async def answer(request: AnswerRequest) -> Response:
            if request.stream:
                return StreamingResponse(gateway.answers.stream(request), media_type="text/event-stream")
            return _json(await gateway.answers.answer(request))

    @app.get("/v1/cluster", summary="Shards, replicas, versions and live health", responses=ERROR_RESPONSES)
    async def cluster() -> Response:
        return _json(await gateway.cluster())

    @app.get("/healthz", summary="Gateway liveness and readiness")
    async def healthz() -> Response:
        registry = gateway.registry
        state = registry.state if registry else None
        encoder = registry.encoders.get(state.active) if registry and state else None
        return _json({
            "status": "ok" if state is not None else "starting",
            "version": state.active if state else None,
            "shards": len(gateway.shard_replicas),
            "encoder": encoder.state if encoder else "disabled",
        })

    @app.get("/admin/rollout", summary="Rollout state, per-replica versions, encoders, recent events",
             responses=ERROR_RESPONSES)
    async def rollout_status() -> Response:
        assert gateway.rollout is not None
        return _json(await gateway.rollout.status())

    @app.post("/admin/rollout/stage", summary="Load a new version on every replica (and its encoder)",
              responses=ERROR_RESPONSES)
    async def rollout_stage(command: StageCommand) -> Response:
        assert gateway.rollout is not None
        return _json(await gateway.rollout.stage(command.version, command.model))

    @app.post("/admin/rollout/activate", summary="Switch new queries to a staged version (readiness + quality gate)",
              responses=ERROR_RESPONSES)
    async def rollout_activate(command: ActivateCommand) -> Response:
        assert gateway.rollout is not None
        return _json(await gateway.rollout.activate(command.version, force=command.force, queries=command.queries,
                                                    qrels=command.qrels))

    @app.post("/admin/rollout/retire", summary="Unload the previous version after the drain period",
              responses=ERROR_RESPONSES)
    async def rollout_retire(command: RetireCommand) -> Response:
        assert gateway.rollout is not None
        return _json(await gateway.rollout.retire(command.version, force=command.force))

    @app.post("/admin/rollout/abort", summary="Unload a staged version", responses=ERROR_RESPONSES)
    async def rollout_abort(command: VersionCommand) -> Response:
        assert gateway.rollout is not None
        return _json(await gateway.rollout.abort(command.version))

    @app.post("/admin/rollout/rollback", summary="Re-activate the previous version while it is loaded",
              responses=ERROR_RESPONSES)
    async def rollout_rollback(command: VersionCommand) -> Response:
        assert gateway.rollout is not None
        return _json(await gateway.rollout.rollback(command.version))

    @app.get("/metrics", summary="Prometheus metrics", response_class=PlainTextResponse,
             responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}})
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            from fastapi.openapi.utils import get_openapi

            schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            request_schema = query_request_schema(gateway)
            schema.setdefault("components", {}).setdefault("schemas", {})["QueryRequest"] = request_schema
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    def count(path: str, status: int) -> None:
        metrics.requests.labels(endpoint="query", status=str(status)).inc()

    fast = FastPathApp(app, {("POST", "/v1/query"): handle_query}, max_body_bytes=gateway.config.max_body_bytes,
                       on_result=count)
    config = gateway.config
    limiter = RateLimiter(config.rate_limit_qps, config.rate_limit_burst) if config.rate_limit_qps > 0 else None
    # API keys (SHARDRAG_API_KEYS[_FILE]) and the per-key rate limit, checked before anything else.
    return guard_from_env(fast, gateway_policy, limiter=limiter, with_keys=True)
