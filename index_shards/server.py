"""The shard server: one FastAPI app serving one shard directory.

    POST /v1/search     body: n × dim little-endian float32; query: k, version, nprobe, ef_search, with_text,
                        with_metadata, filter (canonical JSON, see retrieval.filters)
                        header x-shardrag-timeout-ms: the caller's remaining budget (expired work is dropped)
    GET  /v1/info       versions held, count, dim, factory, centroid
    GET  /healthz       liveness + the version served
    GET  /metrics       Prometheus
    GET|PUT /admin/faults   fault injection settings (see index_shards.faults)
    GET|POST /admin/versions, DELETE /admin/versions/{id}   versions held: stage (load) and unload

Searches run inline on the event loop: FAISS uses one OpenMP thread per server by default, and
on a small machine several shard processes share the cores, so a thread hop buys nothing.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass, field, replace
from typing import Annotated, Any
from urllib.parse import parse_qsl

import orjson
from fastapi import FastAPI, Query, Request, Response

from httpkit.asgi import FastPathApp, Receive, Scope, read_request_body
from httpkit.auth import guard_from_env, internal_policy
from httpkit.errors import install_error_handlers
from httpkit.metrics import add_metrics_route, status_counter
from httpkit.responses import json_response
from index_shards.faults import FaultConfig, FaultInjector, wait_unless_gone
from index_shards.metrics import ShardMetrics
from index_shards.segment import LiveShard
from index_shards.shard import Shard
from index_shards.versions import ShardVersions
from index_shards.wal import decode_records, encode_records
from retrieval.contract import TIMEOUT_HEADER, SearchParams
from retrieval.errors import DeadlineExceeded, InvalidRequest, MalformedBody, NotFound, ReplicaBehind
from retrieval.filters import filter_from_canonical
from retrieval.records import decode_snapshot, encode_snapshot
from retrieval.wire import decode_vectors

logger = logging.getLogger(__name__)

VERSION_HEADER = b"x-shardrag-version"
_TIMEOUT_HEADER = TIMEOUT_HEADER.encode()


@dataclass(slots=True, frozen=True)
class ShardServerConfig:
    max_k: int = 1000  # largest k a search may ask for
    max_batch: int = 1024  # most query vectors in one search request
    max_body_bytes: int = 16 * 1024 * 1024  # larger bodies get 413 before they are read
    faiss_threads: int = 1  # OpenMP threads for FAISS; several shard processes share the cores
    faults: FaultConfig = field(default_factory=FaultConfig)  # fault injection (off by default)
    max_versions: int = 2  # embedding versions held at once (V and V+1 during a rollout)
    device: str = "auto"  # where staged versions are searched (as for the first one)
    mmap: bool = True  # map index files (replicas on one host share their pages) rather than copy them
    filter_exact_max: int = 4096  # filtered searches with at most this many matches are scored exactly
    data_dir: str | None = None  # where this replica keeps its WALs; None: read-only
    compact_after: int = 20_000  # segment documents + tombstones that start a background compaction
    wal_retain: int = 100_000  # WAL records kept behind a checkpoint for lagging peers
    wal_file_bytes: int = 64 * 1024 * 1024  # a WAL file past this size is closed and the next begun
    max_write_bytes: int = 64 * 1024 * 1024  # largest replicated write batch
    max_snapshot_bytes: int = 4 * 1024 * 1024 * 1024  # largest snapshot a replica restores from (held in memory)


_INT_PARAMS = {"k": (1, None), "nprobe": (1, 65536), "ef_search": (1, 65536), "min_seq": (0, None)}
_KNOWN_PARAMS = {"k", "version", "nprobe", "ef_search", "with_text", "with_metadata", "filter", "min_seq"}
CATCH_UP_WAIT_S = 0.5  # how long a session read waits for this replica to apply the write it needs
_BOOL_PARAMS = ("with_text", "with_metadata")


async def _wait_for_seq(served: LiveShard, min_seq: int, deadline: float | None) -> None:
    """A session read: wait (briefly, within the deadline) for the write it needs, else 409 — the
    caller tries a replica that has it."""
    give_up = time.monotonic() + CATCH_UP_WAIT_S
    if deadline is not None:
        give_up = min(give_up, deadline)
    while served.applied_seq < min_seq:
        if time.monotonic() >= give_up:
            raise ReplicaBehind(f"this replica applied up to seq {served.applied_seq}; the read needs {min_seq}",
                                field="min_seq")
        await asyncio.sleep(0.005)


def parse_search_params(query_string: bytes, max_k: int) -> SearchParams:
    """The search's query parameters, validated; errors name the parameter."""
    params: dict[str, Any] = {"k": 10, "version": None, "nprobe": None, "ef_search": None, "with_text": True,
                              "with_metadata": False, "filter": None, "min_seq": None}
    for name, value in parse_qsl(query_string.decode("latin-1"), keep_blank_values=True):
        if name not in _KNOWN_PARAMS:
            raise InvalidRequest(f"unknown query parameter {name!r}", field=name)
        if name in _INT_PARAMS:
            try:
                number = int(value)
            except ValueError:
                raise InvalidRequest(f"{name} must be an integer, got {value!r}", field=name) from None
            low, high = _INT_PARAMS[name]
            high = max_k if name == "k" else high
            if number < low or (high is not None and number > high):
                raise InvalidRequest(f"{name} must be between {low} and {high}, got {number}", field=name)
            params[name] = number
        elif name in _BOOL_PARAMS:
            if value.lower() not in ("true", "false", "1", "0"):
                raise InvalidRequest(f"{name} must be true or false, got {value!r}", field=name)
            params[name] = value.lower() in ("true", "1")
        elif name == "filter":
            filter_from_canonical(value)  # refused here, naming the clause, if it does not parse
            params[name] = value
        else:
            params[name] = value
    return SearchParams(**params)


def create_app(shard: Shard | ShardVersions, config: ShardServerConfig | None = None) -> Any:
    """The shard server's ASGI app: a fast path for POST /v1/search around a FastAPI app."""
    config = config or ShardServerConfig()
    faults = FaultInjector(config.faults)
    versions = shard if isinstance(shard, ShardVersions) else ShardVersions(
        shard, max_versions=config.max_versions, device=config.device, filter_exact_max=config.filter_exact_max,
        data_dir=config.data_dir, compact_after=config.compact_after, wal_retain=config.wal_retain,
        wal_file_bytes=config.wal_file_bytes, crash_point=faults.crash_point, mmap=config.mmap)
    shard_id = versions.shard_id
    metrics = ShardMetrics.create(shard_id)
    metrics.documents.labels(shard=str(shard_id)).set(versions.get(versions.ready_ids()[0]).manifest.count)
    started_at = time.time()

    async def handle_search(scope: Scope, body: bytes, receive: Receive) -> tuple[int, bytes]:
        arrived = time.monotonic()
        params = parse_search_params(scope.get("query_string", b""), config.max_k)
        timeout_ms = None
        for name, value in scope.get("headers", ()):
            if name == VERSION_HEADER and params.version is None:
                params = replace(params, version=value.decode("latin-1"))
            elif name == _TIMEOUT_HEADER:
                try:
                    timeout_ms = float(value)
                except ValueError:
                    raise MalformedBody("x-shardrag-timeout-ms is not a number",
                                        field="x-shardrag-timeout-ms") from None
        served = versions.get(params.version)  # 409 naming the versions held when it is not one of them
        queries = decode_vectors(body, served.manifest.dim, field="body", max_rows=config.max_batch)
        deadline = arrived + timeout_ms / 1000.0 if timeout_ms is not None else None
        if params.min_seq is not None and served.applied_seq < params.min_seq:
            await _wait_for_seq(served, params.min_seq, deadline)
        if faults.active:
            async def wait(seconds: float, honour_deadline: bool = True) -> None:
                await wait_unless_gone(receive, seconds, deadline if honour_deadline else None)

            await faults.before_search(wait)
        if deadline is not None and time.monotonic() >= deadline:
            # The caller has given up on this answer: do not spend the search on it.
            metrics.expired.inc()
            raise DeadlineExceeded(f"request expired after {timeout_ms:.0f} ms before the search ran", field="deadline")
        started = time.perf_counter()
        results = served.search(queries, params.k, nprobe=params.nprobe, ef_search=params.ef_search,
                                with_text=params.with_text, with_metadata=params.with_metadata,
                                filter_=filter_from_canonical(params.filter) if params.filter else None)
        took_s = time.perf_counter() - started
        if faults.active and faults.config.slowdown > 1.0:
            await wait_unless_gone(receive, faults.extra_service_s(took_s), deadline)
        metrics.search_latency.observe(took_s)
        metrics.batch_size.observe(len(queries))
        return 200, orjson.dumps({
            "shard_id": shard_id,
            "version": served.version_id,
            "took_ms": took_s * 1000.0,
            "results": results,
        })

    app = FastAPI(
        title=f"shardrag shard {shard_id} of {versions.collection}",
        description="One slice of a shardrag collection. Query vectors travel as little-endian float32.",
        version="1",
    )
    install_error_handlers(app)

    @app.post(
        "/v1/search",
        summary="Top-k search for a batch of query vectors",
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
                "description": "n × dim little-endian float32 values, row-major",
            }
        },
    )
    async def search(
        request: Request,
        k: Annotated[int, Query(ge=1, description="hits per query")] = 10,
        version: Annotated[str | None, Query(description="embedding version the vectors belong to")] = None,
        nprobe: Annotated[int | None, Query(ge=1, le=65536, description="IVF lists to visit")] = None,
        ef_search: Annotated[int | None, Query(ge=1, le=65536, description="HNSW search breadth")] = None,
        with_text: Annotated[bool, Query(description="return titles and texts")] = True,
        with_metadata: Annotated[bool, Query(description="return each hit's metadata")] = False,
        filter: Annotated[str | None, Query(description="only documents this filter selects (canonical JSON, "
                                                        "see retrieval.filters)")] = None,
    ) -> Response:
        # Served by the fast path below; this route documents it and answers when the
        # FastAPI app is mounted without the wrapper.
        body = await read_request_body(request, config.max_body_bytes)
        status, payload = await handle_search(request.scope, body, request.receive)
        return Response(payload, status_code=status, media_type="application/json")

    @app.get("/v1/info", summary="What this replica holds: every version with its state")
    async def get_info() -> Response:
        info = replace(versions.info(), pid=os.getpid(), started_at=started_at, uptime_s=time.time() - started_at)
        return json_response(info.to_dict())

    @app.get("/healthz", summary="Liveness")
    async def healthz() -> Response:
        return json_response(versions.health().to_dict())

    @app.get("/admin/versions", summary="Versions held, with state (loading / ready / failed)")
    async def list_versions() -> Response:
        return json_response({"versions": [v.to_dict() for v in versions.describe()]})

    @app.post("/admin/versions", status_code=202, summary="Stage (load) another version next to the others")
    async def stage_version(request: Request) -> Response:
        try:
            data = orjson.loads(await read_request_body(request, 64 * 1024) or b"{}")
        except orjson.JSONDecodeError as exc:
            raise MalformedBody(f"body is not valid JSON: {exc}", field="body") from exc
        version = data.get("version") if isinstance(data, dict) else None
        if not isinstance(version, str):
            raise InvalidRequest("give the version id to load as {\"version\": \"...\"}", field="version")
        return json_response(versions.stage_reply(version).to_dict(), status_code=202)

    @app.delete("/admin/versions/{version_id}", summary="Unload a version (idempotent)")
    async def unload_version(version_id: str) -> Response:
        return json_response(versions.unload_reply(version_id).to_dict())

    add_metrics_route(app, metrics.registry)

    async def handle_writes(scope: Scope, body: bytes, receive: Receive) -> tuple[int, bytes]:
        version = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1"))).get("version")
        if not version:
            raise InvalidRequest("the query parameter 'version' is required", field="version")
        try:
            records = decode_records(body)
        except ValueError as exc:
            raise MalformedBody(f"write records do not parse: {exc}", field="body") from exc
        applied = await asyncio.get_running_loop().run_in_executor(None, versions.write, version, records)
        return 200, orjson.dumps({"shard_id": shard_id, "version": version, "applied_seq": applied})

    @app.post("/v1/writes", summary="Append writes (WAL framing) to a version: fsynced, then applied",
              openapi_extra={"requestBody": {"required": True, "content": {"application/octet-stream": {
                  "schema": {"type": "string", "format": "binary"}}}, "description": "retrieval.records framing"}})
    async def post_writes(request: Request,
                          version: Annotated[str, Query(description="embedding version")]) -> Response:
        # Served by the fast path below; this route documents it.
        status, payload = await handle_writes(request.scope, await read_request_body(request, config.max_write_bytes),
                                              request.receive)
        return Response(payload, status_code=status, media_type="application/json")

    @app.get("/v1/writes", summary="The writes after a seq (WAL framing): a lagging peer catches up from these")
    async def get_writes(version: Annotated[str, Query()], after: Annotated[int, Query(ge=0)] = 0) -> Response:
        records = versions.writes_after(version, after)
        return Response(encode_records(records), media_type="application/octet-stream")

    @app.get("/v1/documents/{doc_id:path}", summary="One document as this replica holds it (404 if absent or deleted)")
    async def get_document(doc_id: str, version: Annotated[str | None, Query()] = None) -> Response:
        live = versions.get(version)
        stored = live.get(doc_id)
        if stored is None:
            raise NotFound(f"no document {doc_id!r} in shard {shard_id}", field="id", shard=shard_id)
        return json_response({"id": stored.doc_id, "title": stored.title, "text": stored.text,
                              "metadata": stored.metadata, "seq": stored.seq, "shard": shard_id,
                              "version": live.version_id, "applied_seq": live.applied_seq})

    @app.get("/v1/ids", summary="Ids of the live documents a filter selects (delete by filter reads these)")
    async def get_ids(version: Annotated[str, Query()], filter: Annotated[str, Query()],
                      limit: Annotated[int, Query(ge=1, le=1_000_000)] = 100_000) -> Response:
        ids = await asyncio.get_running_loop().run_in_executor(None, versions.matching_ids, version, filter, limit)
        return json_response({"shard_id": shard_id, "version": version, "ids": ids})

    @app.get("/v1/snapshot", summary="Every live document of a version (seq u64 LE + WAL framing): a peer behind "
             "the WAL's retention restores from it")
    async def get_snapshot(version: Annotated[str, Query(description="embedding version")]) -> Response:
        seq, records = await asyncio.get_running_loop().run_in_executor(None, versions.snapshot, version)
        return Response(encode_snapshot(seq, records), media_type="application/octet-stream")

    @app.post("/admin/restore", summary="Replace a version's state with a peer's snapshot (GET /v1/snapshot bytes)",
              openapi_extra={"requestBody": {"required": True, "content": {"application/octet-stream": {
                  "schema": {"type": "string", "format": "binary"}}}, "description": "GET /v1/snapshot's reply"}})
    async def post_restore(request: Request,
                           version: Annotated[str, Query(description="embedding version")]) -> Response:
        try:
            seq, records = decode_snapshot(await read_request_body(request, config.max_snapshot_bytes))
        except ValueError as exc:
            raise MalformedBody(f"the snapshot does not parse: {exc}", field="body") from exc
        applied = await asyncio.get_running_loop().run_in_executor(None, versions.restore, version, seq, records)
        return json_response({"shard_id": shard_id, "version": version, "applied_seq": applied})

    @app.get("/admin/digest", summary="Count and sha256 of every live document (replica consistency checks)")
    async def get_digest(version: Annotated[str | None, Query()] = None) -> Response:
        live = versions.get(version)
        return json_response(await asyncio.get_running_loop().run_in_executor(None, live.digest))

    @app.post("/admin/compact", summary="Fold the write segment and tombstones into a new sealed base now")
    async def post_compact(version: Annotated[str | None, Query(description="embedding version")] = None) -> Response:
        version_id = versions.get(version).version_id
        done = await asyncio.get_running_loop().run_in_executor(None, versions.compact, version_id)
        return json_response(done)

    @app.get("/admin/faults", summary="Current fault injection settings and counts")
    async def get_faults() -> Response:
        return json_response({"faults": faults.config.to_dict(), "active": faults.active, "injected": faults.injected})

    @app.put("/admin/faults", summary="Replace the fault injection settings (an empty object turns faults off)")
    async def put_faults(request: Request) -> Response:
        try:
            data = orjson.loads(await read_request_body(request, 64 * 1024) or b"{}")
        except orjson.JSONDecodeError as exc:
            raise MalformedBody(f"body is not valid JSON: {exc}", field="body") from exc
        if not isinstance(data, dict):
            raise InvalidRequest("body must be a JSON object of fault settings", field="body")
        if "spec" in data:  # the --faults string form: {"spec": "stall=0.05:100,latency=fixed:5"}
            if set(data) != {"spec"} or not isinstance(data["spec"], str):
                raise InvalidRequest("give either {\"spec\": \"name=value,...\"} or the settings object",
                                     field="spec")
            faults.set(FaultConfig.parse(data["spec"]))
        else:
            faults.set(FaultConfig.from_dict(data))
        logger.warning("fault injection set to %s", faults.config)
        return json_response({"faults": faults.config.to_dict(), "active": faults.active})

    fast = FastPathApp(app, {("POST", "/v1/search"): handle_search, ("POST", "/v1/writes"): handle_writes},
                       max_body_bytes=config.max_body_bytes, body_limits={"/v1/writes": config.max_write_bytes,
                                                                      "/admin/restore": config.max_snapshot_bytes},
                       on_result=status_counter(metrics.requests, "search", {"/v1/writes": "writes"}))
    return guard_from_env(fast, internal_policy)  # SHARDRAG_INTERNAL_TOKEN: only the gateway may call

