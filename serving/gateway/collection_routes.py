"""The collections API of the gateway.

    PUT    /v1/collections/{name}                 create (CollectionCreate): placed on the live nodes,
                                                  answered once a replica of every shard serves it
    GET    /v1/collections                        every collection (those a scoped key may use)
    GET    /v1/collections/{name}                 its definition, placement and live documents
    DELETE /v1/collections/{name}                 drop it (its nodes remove its replicas and files)
    PUT    /v1/collections/{name}/query-defaults  the mode, fusion and weights of a query naming none
    POST   /v1/collections/{name}/query           as POST /v1/query
    POST   /v1/collections/{name}/documents       as POST /v1/documents
    POST   /v1/collections/{name}/documents/delete
    POST   /v1/collections/{name}/documents/scroll  a page of its documents in id order, with the count
    GET    /v1/collections/{name}/documents/{id}
    GET    /v1/collections/{name}/backup/{shard}  a shard's live documents at one seq (admin)
    POST   /v1/collections/{name}/answer          as POST /v1/answer, passages from this collection
                                                  (text collections; only with generator workers)
    GET    /v1/collections/{name}/rollout[/…]     its rollouts: re-embed in place (collection_rollout)
    POST   /v1/collections/{name}/tune            the search knob measured and set (collection_tune)

The collection the gateway was started with answers under its own name too (and keeps the
``/v1/query`` … paths). A tenant-scoped key is confined by serving.gateway.tenancy; which
collections a key may reach is checked before a route runs (httpkit.auth).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import StreamingResponse

from clusterstate.collections import CollectionSpec, Quotas, vector_version
from httpkit.api import ERROR_RESPONSES, ErrorResponse
from httpkit.asgi import read_request_body
from httpkit.auth import SCOPE_KEY, ApiKey
from httpkit.responses import EVENT_STREAM, json_response
from retrieval.errors import Conflict, Forbidden, InvalidRequest, NotFound
from serving.answer.service import ANSWER_OK, ANSWERS_OFF, AnswerRequest, RetrieveFn
from serving.gateway.api_models import DocIdPath, NamePath, QueryRequest
from serving.gateway.collection_models import CollectionCreate, QueryDefaultsModel
from serving.gateway.collection_rollout import add_collection_rollout_routes
from serving.gateway.collection_tune import add_collection_tune_route
from serving.gateway.collections import CollectionStack, live_count
from serving.gateway.query import QueryService, parse_body, with_query_defaults
from serving.gateway.tenancy import (
    confine_delete,
    confine_filter,
    confine_hits,
    confine_ids,
    confine_listing,
    confine_scroll,
    confine_upsert,
    stored_id,
)
from serving.versions.registry import VersionRegistry
from serving.writes.listing import scroll
from serving.writes.models import DeleteRequest, ScrollRequest, UpsertRequest
from serving.writes.service import WriteService
from serving.writes.snapshots import live_snapshot

RESPONSES: dict[int | str, dict[str, Any]] = {
    **ERROR_RESPONSES, 404: {"model": ErrorResponse, "description": "no such collection (or document)"}}


def _body(model: str) -> dict[str, Any]:
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": f"#/components/schemas/{model}"}}}}}


def _key(request: Request) -> ApiKey | None:
    key: ApiKey | None = request.scope.get(SCOPE_KEY)
    return key


def add_collection_routes(app: FastAPI, gateway: Callable[[], Any], *, answers: bool = False) -> None:
    """``gateway()``: the running Gateway (serving.gateway.factory); ``answers``: generator workers
    are configured (the answer route exists only then, as /v1/answer)."""

    def default_name() -> str:
        return str(gateway().registry.view.snapshot(gateway().registry.view.state.active).topology.collection)

    def model_version(model: str) -> dict[str, Any]:
        """The embedding version of ``model`` as this gateway serves it (422 when it serves no such model)."""
        view = gateway().registry.view
        served = [v for v in view.versions if v in view.state.models]
        # by its encoder checkpoint's label (as rollouts name it: "default" is the launched MiniLM)
        # or by the encoder's own name ("all-MiniLM-L6-v2")
        models = {**{view.snapshot(v).topology.version.encoder_name: v for v in served},
                  **{view.state.models[v]: v for v in served}}
        if model not in models:
            raise InvalidRequest(f"this gateway embeds with {sorted(models)}; model {model!r} is not among them",
                                 field="model")
        version: dict[str, Any] = view.snapshot(models[model]).topology.version.to_dict()
        return version

    async def services(name: str, request: Request) -> tuple[QueryService, WriteService, CollectionStack | None,
                                                              str | None, str | None]:
        """(queries, writes, stack or None for the default collection, tenant field, the key's tenant)."""
        key = _key(request)
        tenant = key.tenant if key is not None else None
        if name == default_name():
            if tenant is not None:
                raise Forbidden(f"collection {name!r} has no tenant field: a tenant-scoped key cannot use it",
                                field="authorization")
            return gateway().queries, gateway().writes, None, None, None
        stack = await gateway().collections.get(name)
        if tenant is not None and stack.spec.tenant_field is None:
            raise Forbidden(f"collection {name!r} has no tenant field: a tenant-scoped key cannot use it",
                            field="authorization")
        stack.admit()
        return stack.queries, stack.writes, stack, stack.spec.tenant_field, tenant

    @app.put("/v1/collections/{name}", status_code=201, summary="Create a collection (empty, writable at once)",
             responses=RESPONSES)
    async def create_collection(name: NamePath, body: CollectionCreate) -> Response:
        if name == default_name():
            raise InvalidRequest(f"{name!r} is the collection this gateway was started with", field="name")
        version = model_version(body.model) if body.model else vector_version(body.dim or 0, body.metric).to_dict()
        spec = CollectionSpec(name=name, dim=int(version["dim"]), metric=body.metric, model=body.model,
                              version=version if body.model else None, shards=body.shards, replicas=body.replicas,
                              factory=body.factory, partitioner=body.partitioner, tenant_field=body.tenant_field,
                              lexical_language=body.lexical_language, ef_construction=body.ef_construction,
                              quotas=Quotas(body.quotas.max_documents, body.quotas.max_rps),
                              query_defaults=body.query_defaults.to_defaults())
        collections = gateway().collections
        placed = await asyncio.to_thread(collections.collections.create, spec)
        await collections.wait_ready(placed)
        return json_response(collections.describe(placed), status_code=201)

    @app.get("/v1/collections", summary="Every collection (a scoped key sees those it may use)",
             responses=RESPONSES)
    async def list_collections(request: Request) -> Response:
        key = _key(request)
        specs = await asyncio.to_thread(gateway().collections.collections.list)
        rows = [gateway().collections.describe(s) for s in specs
                if key is None or key.collections is None or s.name in key.collections]
        default = default_name()
        if key is None or not key.scoped or (key.collections is not None and default in key.collections
                                              and key.tenant is None):
            rows.insert(0, {"name": default, "default": True})
        return json_response({"collections": rows})

    @app.get("/v1/collections/{name}", summary="A collection: definition, placement, replicas, live documents",
             responses=RESPONSES)
    async def show_collection(name: NamePath) -> Response:
        if name == default_name():
            return json_response({"name": name, "default": True, "cluster": "/v1/cluster",
                                  "query_defaults": gateway().queries.defaults.to_dict()})
        collections = gateway().collections
        stack = await collections.get(name)
        await stack.registry.refresh()
        active = stack.registry.view.state.active
        shards = [{"shard": shard, "replicas": list(group),
                   "documents": max((live_count(stack.registry.infos.get(r), active) for r in group), default=0)}
                  for shard, group in enumerate(stack.replicas)]
        return json_response({**collections.describe(stack.spec), "active_version": active, "shard_replicas": shards,
                              "documents": sum(s["documents"] for s in shards)})

    @app.delete("/v1/collections/{name}", summary="Drop a collection: its replicas and files go from every node",
                responses=RESPONSES)
    async def drop_collection(name: NamePath) -> Response:
        if name == default_name():
            raise InvalidRequest(f"{name!r} is the collection this gateway was started with; stop the cluster "
                                 "to retire it", field="name")
        collections = gateway().collections
        existed = await asyncio.to_thread(collections.collections.drop, name)
        await collections.forget(name)
        if not existed:
            raise NotFound(f"no collection {name!r}", field="name")
        return json_response({"dropped": name})

    @app.put("/v1/collections/{name}/query-defaults", summary="Set the mode, fusion and weights a query of the "
             "collection gets when it names none", responses=RESPONSES)
    async def set_query_defaults(name: NamePath, body: QueryDefaultsModel) -> Response:
        if name == default_name():
            raise Conflict(f"{name!r} is the collection this gateway was started with: its query defaults are the "
                           "gateway config's query_defaults section, the same file on every gateway", field="name")
        collections = gateway().collections
        stack = await collections.get(name)
        spec = await asyncio.to_thread(collections.collections.set_query_defaults, name, stack.spec.uid,
                                       body.to_defaults())
        stack.adopt(spec)  # here at once; every other gateway within its refresh
        return json_response(collections.describe(spec))

    limits = lambda: gateway().config.limits  # noqa: E731 - read when a request comes
    write_limit = lambda: gateway().config.writes.max_body_bytes  # noqa: E731

    @app.post("/v1/collections/{name}/query", summary="Top-k documents of the collection for a text or a vector",
              responses=RESPONSES, openapi_extra=_body("CollectionQueryRequest"))
    async def query(name: NamePath, request: Request) -> Response:
        queries, _, stack, tenant_field, tenant = await services(name, request)
        parsed = queries.parse(await read_request_body(request, limits().max_body_bytes))
        if stack is not None and stack.spec.model is None and parsed.vector is None and \
                with_query_defaults(parsed, queries.defaults)[0].mode != "lexical":
            # no encoder to embed the text: BM25 (lexical) takes text alone, dense and hybrid a vector
            raise InvalidRequest(f"collection {name!r} holds vectors only (no encoder): send a vector "
                                 "(dense and hybrid search need one; lexical search takes text alone)",
                                 field="vector" if parsed.text is None else "text")
        if tenant is not None and tenant_field is not None:
            parsed = parsed.model_copy(update={"filter": confine_filter(parsed.filter, tenant_field, tenant)})
            return json_response(confine_hits(await queries.query(parsed), tenant))
        return json_response(await queries.query(parsed))

    @app.post("/v1/collections/{name}/documents", summary="Upsert documents into the collection",
              responses=RESPONSES, openapi_extra=_body("UpsertRequest"))
    async def upsert(name: NamePath, request: Request) -> Response:
        _, writes, stack, tenant_field, tenant = await services(name, request)
        parsed = parse_body(UpsertRequest, await read_request_body(request, write_limit()))
        if stack is not None and stack.spec.model is None:
            for number, document in enumerate(parsed.documents):
                if document.vector is None and not document.no_vector:
                    raise InvalidRequest(f"collection {name!r} holds vectors only (no encoder): give each document "
                                         "a vector (or no_vector: true to store it without one)",
                                         field=f"documents.{number}.vector")
        if tenant_field is not None:
            parsed = confine_upsert(parsed, tenant_field, tenant)
        if stack is not None:
            await stack.check_room(len(parsed.documents))
        reply = await writes.upsert(parsed)
        if stack is not None:
            stack.note_written(len(parsed.documents))
        return json_response(confine_ids(reply, tenant) if tenant is not None else reply)

    @app.post("/v1/collections/{name}/documents/delete", summary="Delete documents of the collection by id or filter",
              responses=RESPONSES, openapi_extra=_body("DeleteRequest"))
    async def delete(name: NamePath, request: Request) -> Response:
        _, writes, _, tenant_field, tenant = await services(name, request)
        parsed = parse_body(DeleteRequest, await read_request_body(request, write_limit()))
        if tenant is not None and tenant_field is not None:
            parsed = confine_delete(parsed, tenant_field, tenant)
        reply = await writes.delete(parsed)
        return json_response(confine_ids(reply, tenant) if tenant is not None else reply)

    @app.post("/v1/collections/{name}/documents/scroll", summary="A page of the collection's documents in id "
              "order (by filter), with how many the filter selects", responses=RESPONSES,
              openapi_extra=_body("ScrollRequest"))
    async def scroll_documents(name: NamePath, request: Request) -> Response:
        _, writes, _, tenant_field, tenant = await services(name, request)
        parsed = parse_body(ScrollRequest, await read_request_body(request, limits().max_body_bytes))
        if tenant is not None and tenant_field is not None:
            return json_response(confine_listing(await scroll(writes, confine_scroll(parsed, tenant_field, tenant)),
                                                 tenant))
        return json_response(await scroll(writes, parsed))

    @app.get("/v1/collections/{name}/documents/{doc_id:path}", summary="One document of the collection",
             responses=RESPONSES)
    async def get_document(name: NamePath, doc_id: DocIdPath, request: Request) -> Response:
        _, writes, _, tenant_field, tenant = await services(name, request)
        if tenant is not None and tenant_field is not None:
            found = await writes.get(stored_id(tenant, doc_id))  # in its namespace: never another tenant's
            return json_response({**found, "id": doc_id})
        return json_response(await writes.get(doc_id))

    @app.get("/v1/collections/{name}/backup/{shard}", responses={**RESPONSES, 200: {
                 "description": "retrieval.records.Snapshot bytes (the version in x-shardrag-version)",
                 "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}},
             summary="A shard's live documents as of one seq: a backup's part (admin; docs/backup.md)")
    async def backup_shard(name: NamePath, shard: int, request: Request) -> Response:
        _, writes, _, _, _ = await services(name, request)
        if not 0 <= shard < len(writes.registry.shard_replicas):
            raise NotFound(f"collection {name!r} has no shard {shard}", field="shard")
        version = writes.registry.view.state.active
        return Response(await live_snapshot(writes, shard, version), media_type="application/octet-stream",
                        headers={"x-shardrag-version": version})

    add_collection_rollout_routes(app, gateway, default_name)

    async def registry_of(name: str) -> VersionRegistry:
        if name == default_name():
            registry: VersionRegistry = gateway().registry
            return registry
        stack: CollectionStack = await gateway().collections.get(name)
        return stack.registry

    add_collection_tune_route(app, registry_of)
    if not answers:
        @app.post("/v1/collections/{name}/answer", include_in_schema=False)
        async def no_answer(name: NamePath) -> Response:
            raise NotFound(ANSWERS_OFF, field="question")
        return

    @app.post("/v1/collections/{name}/answer", summary="Retrieve from the collection, then generate an answer "
              "that cites its passages", responses={**RESPONSES, **ANSWER_OK})
    async def answer(name: NamePath, body: AnswerRequest, request: Request) -> Response:
        queries, _, stack, tenant_field, tenant = await services(name, request)
        if stack is not None and stack.spec.model is None:
            raise InvalidRequest(f"collection {name!r} holds vectors only (no encoder): it cannot retrieve for a "
                                 "question", field="question")

        async def retrieve(query: dict[str, Any]) -> dict[str, Any]:
            parsed = QueryRequest.model_validate(query)
            if tenant is None or tenant_field is None:
                return await queries.query(parsed)
            # the same confinement as the query route: the tenant's clause in the shards, hits re-checked
            parsed = parsed.model_copy(update={"filter": confine_filter(None, tenant_field, tenant)})
            return confine_hits(await queries.query(parsed), tenant)

        confined: RetrieveFn = retrieve
        service = gateway().answers
        if body.stream:
            return StreamingResponse(await service.stream(body, confined), media_type=EVENT_STREAM)
        return json_response(await service.answer(body, confined))
