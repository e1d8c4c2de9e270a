"""The gateway's HTTP API.

    POST /v1/query    {text | vector, k, nprobe, ef_search, top_m, timeout_ms, with_text, version}
    POST /v1/answer   retrieve, then generate (only when generator workers are configured)
    POST /v1/documents[/delete|/scroll], GET /v1/documents/{id}   writes, deletes, listings, one document
    GET  /v1/cluster  shards, replicas, versions, live health
    GET  /healthz     gateway + encoder state
    GET  /metrics     Prometheus
    GET|POST /admin/rollout[/stage|activate|retire|abort|rollback]
    GET|DELETE /admin/faults, PUT /admin/faults/{shard}/{replica}   game days (serving.gateway.faults_proxy)
    PUT|GET|DELETE /v1/collections[/{name}], /v1/collections/{name}/query|documents…   collections created
                      at run time on the nodes (serving.gateway.collection_routes)
    GET  /docs        OpenAPI UI
    GET  /            the live status page (static/status.html: polls /v1/cluster and /metrics)

:func:`create_app` builds the gateway (:meth:`GatewaySetup.build`) in the app's lifespan and
puts FastAPI around it. The query handler parses the body itself (pydantic's JSON parser, no
FastAPI body machinery) because it is the hot path; the same model documents it in OpenAPI.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
from fastapi import FastAPI, Request, Response
from fastapi.responses import StreamingResponse

from httpkit.api import ErrorResponse
from httpkit.asgi import FastPathApp, Receive, Scope, read_request_body
from httpkit.auth import RateLimiter, gateway_policy, guard_from_env
from httpkit.errors import install_error_handlers
from httpkit.metrics import add_metrics_route, status_counter
from httpkit.responses import EVENT_STREAM, json_response
from retrieval.errors import ConfigError, NotFound
from serving.answer.service import ANSWER_OK, ANSWERS_OFF, AnswerRequest
from serving.gateway.api_models import (
    ERROR_RESPONSES,
    ActivateCommand,
    DocIdPath,
    QueryResponse,
    RetireCommand,
    StageCommand,
    VersionCommand,
)
from serving.gateway.collection_routes import add_collection_routes
from serving.gateway.factory import Gateway, GatewaySetup
from serving.gateway.faults_proxy import add_fault_routes
from serving.gateway.metrics import GatewayMetrics
from serving.gateway.openapi import build_openapi, filter_schemas, query_request_schemas, write_schemas
from serving.gateway.query import parse_body
from serving.writes.listing import scroll
from serving.writes.models import DeleteRequest, ScrollRequest, UpsertRequest

STATUS_PAGE = (Path(__file__).parent / "static" / "status.html").read_bytes()


class _Running:
    """The gateway once the lifespan has built it (routes run only after that)."""

    def __init__(self) -> None:
        self._gateway: Gateway | None = None

    @property
    def gateway(self) -> Gateway:
        if self._gateway is None:
            raise ConfigError("the gateway is not started", field="gateway")
        return self._gateway


def gateway_of(app: Any) -> Gateway:
    """The running gateway behind an app made by :func:`create_app` (tests, embedding)."""
    running: _Running = app.state.running
    return running.gateway


def create_app(setup: GatewaySetup) -> Any:
    """The gateway's ASGI app: a fast path for POST /v1/query around the FastAPI app."""
    running = _Running()
    limits = setup.config.limits
    writes_settings = setup.config.writes
    metrics = GatewayMetrics.create()  # made here so /metrics is routed before the gateway starts

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        running._gateway = await setup.build(metrics)
        try:
            yield
        finally:
            gateway, running._gateway = running._gateway, None
            await gateway.close()

    app = FastAPI(
        title="shardrag gateway",
        description="Sharded retrieval for RAG: embed, fan out to every shard, merge the exact top k.",
        version="1",
        lifespan=lifespan,
    )
    app.state.running = running
    install_error_handlers(app)

    async def handle_query(scope: Scope, body: bytes, receive: Receive) -> tuple[int, bytes]:
        queries = running.gateway.queries
        return 200, orjson.dumps(await queries.query(queries.parse(body)))

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
        status, payload = await handle_query(request.scope, await read_request_body(request, limits.max_body_bytes),
                                             request.receive)
        return Response(payload, status_code=status, media_type="application/json")

    if not setup.generators:  # no such endpoint (nor in the schema), but a 404 that says how to get one
        @app.post("/v1/answer", include_in_schema=False)
        async def no_answer() -> Response:
            raise NotFound(ANSWERS_OFF, field="question")

    if setup.generators:  # the endpoint exists only with generator workers behind it
        @app.post("/v1/answer", summary="Retrieve, then generate an answer that cites the passages",
                  responses={**ERROR_RESPONSES, **ANSWER_OK})
        async def answer(request: AnswerRequest) -> Response:
            answers = running.gateway.answers
            if request.stream:
                return StreamingResponse(await answers.stream(request), media_type=EVENT_STREAM)
            return json_response(await answers.answer(request))

    def write_body(model: str) -> dict[str, Any]:
        return {"requestBody": {"required": True, "content": {"application/json": {
            "schema": {"$ref": f"#/components/schemas/{model}"}}}}}

    async def handle_upsert(scope: Scope, body: bytes, receive: Receive) -> tuple[int, bytes]:
        return 200, orjson.dumps(await running.gateway.writes.upsert(parse_body(UpsertRequest, body)))

    @app.post("/v1/documents", summary="Upsert documents (text embedded by every loaded version, or vectors); "
              "answers once write_ack replicas of each touched shard have them fsynced", responses=ERROR_RESPONSES,
              openapi_extra=write_body("UpsertRequest"))
    async def upsert_documents(request: Request) -> Response:
        # Served by the fast path (every write passes here); this route documents it.
        status, payload = await handle_upsert(request.scope, await read_request_body(
            request, writes_settings.max_body_bytes), request.receive)
        return Response(payload, status_code=status, media_type="application/json")

    @app.post("/v1/documents/delete", summary="Delete documents by id or by filter (same acks as upserts)",
              responses=ERROR_RESPONSES, openapi_extra=write_body("DeleteRequest"))
    async def delete_documents(request: Request) -> Response:
        parsed = parse_body(DeleteRequest, await read_request_body(request, writes_settings.max_body_bytes))
        return json_response(await running.gateway.writes.delete(parsed))

    @app.post("/v1/documents/scroll", summary="A page of the documents in id order (by filter), with how many "
              "the filter selects", responses=ERROR_RESPONSES, openapi_extra=write_body("ScrollRequest"))
    async def scroll_documents(request: Request) -> Response:
        parsed = parse_body(ScrollRequest, await read_request_body(request, writes_settings.max_body_bytes))
        return json_response(await scroll(running.gateway.writes, parsed))

    @app.get("/v1/documents/{doc_id:path}", summary="One document with its metadata and seq (404 if absent)",
             responses={**ERROR_RESPONSES, 404: {"model": ErrorResponse,
                                                 "description": "no such document (absent or deleted)"}})
    async def get_document(doc_id: DocIdPath) -> Response:
        return json_response(await running.gateway.writes.get(doc_id))

    @app.get("/v1/cluster", summary="Shards, replicas, versions and live health", responses=ERROR_RESPONSES)
    async def cluster() -> Response:
        return json_response(await running.gateway.cluster.cluster())

    @app.get("/", include_in_schema=False)
    async def status_page() -> Response:
        """The live status page (no key needed for the page; it asks for one when /v1/cluster does)."""
        return Response(STATUS_PAGE, media_type="text/html; charset=utf-8",
                        headers={"cache-control": "no-cache", "x-content-type-options": "nosniff"})

    @app.get("/healthz", summary="Gateway liveness and readiness")
    async def healthz() -> Response:
        return json_response(running.gateway.cluster.healthz())

    @app.get("/admin/rollout", summary="Rollout state, per-replica versions, encoders, recent events",
             responses=ERROR_RESPONSES)
    async def rollout_status() -> Response:
        return json_response(await running.gateway.rollout.status())

    @app.post("/admin/rollout/stage", summary="Load a new version on every replica (and its encoder)",
              responses=ERROR_RESPONSES)
    async def rollout_stage(command: StageCommand) -> Response:
        return json_response(await running.gateway.rollout.stage(command.version, command.model))

    @app.post("/admin/rollout/activate", summary="Switch new queries to a staged version (readiness + quality gate)",
              responses=ERROR_RESPONSES)
    async def rollout_activate(command: ActivateCommand) -> Response:
        return json_response(await running.gateway.rollout.activate(
            command.version, force=command.force, queries=command.queries, qrels=command.qrels))

    @app.post("/admin/rollout/retire", summary="Unload the previous version after the drain period",
              responses=ERROR_RESPONSES)
    async def rollout_retire(command: RetireCommand) -> Response:
        return json_response(await running.gateway.rollout.retire(command.version, force=command.force))

    @app.post("/admin/rollout/abort", summary="Unload a staged version", responses=ERROR_RESPONSES)
    async def rollout_abort(command: VersionCommand) -> Response:
        return json_response(await running.gateway.rollout.abort(command.version))

    @app.post("/admin/rollout/rollback", summary="Re-activate the previous version while it is loaded",
              responses=ERROR_RESPONSES)
    async def rollout_rollback(command: VersionCommand) -> Response:
        return json_response(await running.gateway.rollout.rollback(command.version))

    add_fault_routes(app, lambda: list(running.gateway.registry.shard_replicas))
    add_collection_routes(app, lambda: running.gateway, answers=bool(setup.generators))

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build_openapi(title=app.title, version=app.version, description=app.description,
                                   routes=app.routes)
            gateway = running._gateway
            topology = None
            if gateway is not None:
                view = gateway.registry.view
                topology = view.versions[view.state.active].topology if view.state.active in view.versions else None
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            components.update(query_request_schemas(limits, topology, setup.config.query_defaults))
            components.update(filter_schemas())
            components.update(write_schemas(limits, topology, writes_settings))
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    add_metrics_route(app, metrics.registry)
    fast = FastPathApp(app, {("POST", "/v1/query"): handle_query, ("POST", "/v1/documents"): handle_upsert},
                       max_body_bytes=limits.max_body_bytes,
                       body_limits={"/v1/documents": writes_settings.max_body_bytes},
                       on_result=status_counter(metrics.requests, "query", {"/v1/documents": "upsert"}))
    limiter = RateLimiter(limits.rate_limit_qps, limits.rate_limit_burst) if limits.rate_limit_qps > 0 else None
    # API keys (SHARDRAG_API_KEYS[_FILE]) and the per-key rate limit, checked before anything else.
    # A key's rps quota is the whole cluster's: this gateway enforces its share (1 / live gateways).
    return guard_from_env(fast, gateway_policy, limiter=limiter, with_keys=True,
                          quota_share=lambda: running.gateway.presence.quota_share() if running._gateway else 1.0)
