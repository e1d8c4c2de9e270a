"""The shard server: one FastAPI app serving one replica of one shard.

    POST /v1/search     body: n × dim little-endian float32; query: SearchParams (retrieval.contract)
                        header x-shardrag-timeout-ms: the caller's remaining budget (expired work is dropped)
                        with lexical=true: the body is lexical queries (retrieval.bm25), each answered with its
                        BM25 top k and this replica's statistics for its terms (index_shards.lexical_search)
    GET  /v1/info       versions held (applied seq, last record's term and checksum), the role
    GET  /healthz       liveness + the version served
    GET  /metrics       Prometheus
    GET|PUT /admin/faults   fault injection settings (see index_shards.faults)
    GET|POST /admin/versions, DELETE /admin/versions/{id}   versions held: stage (load) and unload

    POST /v1/primary/writes?version=&ack=&generation=   a gateway's batch (records without seqs): the
                        primary numbers, logs, replicates and acknowledges it (index_shards.primary)
    POST /v1/writes?version=   header x-shardrag-term, x-shardrag-prev: a batch from the primary
                        (or a catch-up), checked and applied (index_shards.writes)
    GET  /v1/writes?version=&after=N, GET /v1/snapshot, POST /admin/restore   catch-up and restore
    POST /admin/fence?generation=   refuse writes sent under an older rollout generation
    POST /admin/tune/sample, /admin/tune/evaluate, PUT /admin/search-defaults   a REST tune
                        (index_shards.live_tuning)

Searches run inline on the event loop: FAISS uses one OpenMP thread per server by default, and
on a small machine several shard processes share the cores, so a thread hop buys nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qsl

import numpy as np
import orjson
from fastapi import FastAPI, Query, Request, Response

from httpkit.asgi import FastPathApp, HotHandler, LazyApp, Receive, Scope, read_request_body
from httpkit.auth import guard_from_env, internal_policy
from httpkit.errors import install_error_handlers
from httpkit.metrics import add_metrics_route, status_counter
from httpkit.responses import json_response
from index_shards import compaction, live_tuning, snapshots
from index_shards.faults import FaultConfig, FaultInjector, wait_unless_gone
from index_shards.metrics import ShardMetrics
from index_shards.peers import PREV_HEADER, TERM_HEADER, HttpPeers, PeerClient, parse_prev
from index_shards.primary import decode_unsequenced
from index_shards.role import ShardRole
from index_shards.segment import LiveShard
from index_shards.shard import Shard
from index_shards.versions import ShardVersions
from index_shards.wal import decode_records, encode_records
from index_shards.writes import accept, writes_after
from retrieval.bm25 import LexicalQuery, decode_lexical_queries
from retrieval.contract import TIMEOUT_HEADER, WRITE_ACKS, SearchParams
from retrieval.errors import DeadlineExceeded, InvalidRequest, MalformedBody, NotFound, ReplicaBehind
from retrieval.records import Snapshot
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
    lease_s: float = 3.0  # the primary's lease: how long after it stops renewing a replica takes over
    replica_id: str | None = None  # this replica's stable id (default: its data dir's name)
    replication: int = 0  # the shard's configured replicas, which write_ack counts (0: as many as registered)
    lexical_warm: str = "auto"  # when a base's lexical index is built (index_shards.lexical_warm)


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


@dataclass(slots=True)
class ShardServer:
    """What :func:`create_app` made: the ASGI app, the replica's store and its role. Start the role
    (:meth:`ShardRole.start`) once the server's own URL is known."""

    app: Any
    versions: ShardVersions
    role: ShardRole


def create_server(shard: Shard | ShardVersions, config: ShardServerConfig | None = None, *,
                  state: Any = None, peers: PeerClient | None = None, lease: Any = None) -> ShardServer:
    """The shard server's ASGI app (a fast path for search and writes around a FastAPI app), over a
    version store and the replica's role in its shard. ``state``: the cluster state
    (clusterstate.state.ClusterState) the role coordinates through; None: this replica is the only
    one, the primary of its shard on its own. The role starts with :meth:`ShardRole.start`, given
    the URL the server is reached at once it listens. ``lease``: a started LeaseKeeper the role
    shares (a node's) instead of taking its own."""
    config = config or ShardServerConfig()
    faults = FaultInjector(config.faults)
    versions = shard if isinstance(shard, ShardVersions) else ShardVersions(
        shard, max_versions=config.max_versions, device=config.device, filter_exact_max=config.filter_exact_max,
        data_dir=config.data_dir, compact_after=config.compact_after, wal_retain=config.wal_retain,
        wal_file_bytes=config.wal_file_bytes, crash_point=faults.crash_point, mmap=config.mmap,
        ignore_terms=lambda: faults.config.ignore_terms, lexical_warm=config.lexical_warm)
    replica = config.replica_id or (Path(config.data_dir).name if config.data_dir else "local")
    role = ShardRole(versions, replica, state, peers or HttpPeers(), replication=config.replication,
                     lease_s=config.lease_s, shared_lease=lease)
    shard_id = versions.shard_id
    metrics = ShardMetrics.create(shard_id, versions.describe)
    metrics.documents.labels(shard=str(shard_id)).set(versions.get(versions.ready_ids()[0]).manifest.count)
    started_at = time.time()

    async def handle_search(scope: Scope, body: bytes, receive: Receive) -> tuple[int, bytes]:
        arrived = time.monotonic()
        params = SearchParams.from_query_string(scope.get("query_string", b""), config.max_k)
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
        lexical: list[LexicalQuery] = []
        if params.lexical:  # the body holds lexical queries, and a hybrid call's vectors after them
            lexical, vector_bytes = decode_lexical_queries(body, max_queries=config.max_batch)
            queries = np.zeros((0, served.manifest.dim), dtype=np.float32)
            if vector_bytes:
                queries = decode_vectors(vector_bytes, served.manifest.dim, field="body", max_rows=config.max_batch)
                if len(queries) != len(lexical):
                    raise InvalidRequest(f"a hybrid call has one vector per lexical query: {len(queries)} vectors, "
                                         f"{len(lexical)} queries", field="body")
        else:
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
        reply = versions.search(queries, replace(params, version=served.version_id), lexical)
        took_s = time.perf_counter() - started
        if faults.active and faults.config.slowdown > 1.0:
            await wait_unless_gone(receive, faults.extra_service_s(took_s), deadline)
        metrics.search_latency.observe(took_s)
        metrics.batch_size.observe(len(lexical) or len(queries))
        return 200, orjson.dumps(reply.to_dict())

    def header(scope: Scope, name: bytes) -> str | None:
        for key, value in scope.get("headers", ()):
            if key == name:
                return str(value.decode("latin-1"))
        return None

    def query_params(scope: Scope) -> dict[str, str]:
        return dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))

    def required(params: dict[str, str], name: str) -> str:
        value = params.get(name)
        if not value:
            raise InvalidRequest(f"the query parameter {name!r} is required", field=name)
        return value

    def int_header(scope: Scope, name: bytes, default: int) -> int:
        value = header(scope, name)
        try:
            return int(value) if value else default
        except ValueError:
            raise InvalidRequest(f"header {name.decode()} must be an integer", field=name.decode()) from None

    async def in_thread(function: Any, *args: Any) -> Any:
        # in the request's context (its trace span, when traced), as asyncio.to_thread would run it
        context = contextvars.copy_context()
        return await asyncio.get_running_loop().run_in_executor(None, functools.partial(context.run, function, *args))

    async def handle_writes(scope: Scope, body: bytes, receive: Receive) -> tuple[int, bytes]:
        """A batch from the shard's primary (or a peer catching this replica up)."""
        version = required(query_params(scope), "version")
        term = int_header(scope, TERM_HEADER.encode(), 0)
        try:
            prev = parse_prev(header(scope, PREV_HEADER.encode()))
            records = decode_records(body)
        except ValueError as exc:
            raise MalformedBody(f"write records do not parse: {exc}", field="body") from exc
        applied = await in_thread(accept, versions, version, term, prev, records)
        return 200, orjson.dumps({"shard_id": shard_id, "version": version, "applied_seq": applied,
                                  "term": versions.term})

    async def handle_primary_writes(scope: Scope, body: bytes, receive: Receive) -> tuple[int, bytes]:
        """A gateway's batch: this replica, as the primary, numbers and replicates it."""
        params = query_params(scope)
        version = required(params, "version")
        ack = params.get("ack", "majority")
        if ack not in WRITE_ACKS:
            raise InvalidRequest(f"ack must be one of {', '.join(WRITE_ACKS)}, got {ack!r}", field="ack")
        try:
            generation = int(params.get("generation", "0"))
            records = decode_unsequenced(body)
        except ValueError as exc:
            raise MalformedBody(f"write records do not parse: {exc}", field="body") from exc
        reply = await in_thread(role.writer.write, version, records, ack, generation)
        return 200, orjson.dumps(reply.to_dict())

    async def handle_info(scope: Scope, body: bytes, receive: Receive) -> tuple[int, bytes]:
        info = replace(versions.info(), pid=os.getpid(), started_at=started_at, uptime_s=time.time() - started_at)
        return 200, orjson.dumps(info.to_dict())

    async def handle_health(scope: Scope, body: bytes, receive: Receive) -> tuple[int, bytes]:
        return 200, orjson.dumps(versions.health().to_dict())

    async def handle_role(scope: Scope, body: bytes, receive: Receive) -> tuple[int, bytes]:
        return 200, orjson.dumps(role.info().to_dict())

    async def json_object(request: Request, what: str) -> dict[str, Any]:
        """A small admin body that must be one JSON object (422/400 naming the body otherwise)."""
        try:
            data = orjson.loads(await read_request_body(request, 64 * 1024) or b"{}")
        except orjson.JSONDecodeError as exc:
            raise MalformedBody(f"body is not valid JSON: {exc}", field="body") from exc
        if not isinstance(data, dict):
            raise InvalidRequest(f"body must be a JSON object of {what}", field="body")
        return data

    def documented_app() -> FastAPI:
        """The FastAPI app: every route, documented (the fast path serves the hot ones first)."""
        @contextlib.asynccontextmanager
        async def lifespan(app: FastAPI) -> AsyncIterator[None]:
            yield
            await asyncio.get_running_loop().run_in_executor(None, role.stop)  # drops a primary claim at once
            versions.close()

        app = FastAPI(
            lifespan=lifespan,
            title=f"shardrag shard {shard_id} of {versions.collection}",
            description="One slice of a shardrag collection. Query vectors travel as little-endian float32.",
            version="1",
        )
        install_error_handlers(app)

        @app.post(
            "/v1/search",
            summary="Top-k search for a batch of query vectors, or a lexical (BM25) search of a text",
            openapi_extra={
                "requestBody": {
                    "required": False,
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
            lexical: Annotated[bool, Query(description="the body is lexical queries (JSON, retrieval.bm25): "
                                                       "each one's BM25 top k and this replica's statistics")] = False,
        ) -> Response:
            # Served by the fast path below; this route documents it and answers when the
            # FastAPI app is mounted without the wrapper.
            body = await read_request_body(request, config.max_body_bytes)
            status, payload = await handle_search(request.scope, body, request.receive)
            return Response(payload, status_code=status, media_type="application/json")

        @app.get("/v1/info", summary="What this replica holds: every version with its state")
        async def get_info(request: Request) -> Response:
            # Served by the fast path; this route documents it.
            return Response((await handle_info(request.scope, b"", request.receive))[1], media_type="application/json")

        @app.get("/healthz", summary="Liveness")
        async def healthz(request: Request) -> Response:
            return Response((await handle_health(request.scope, b"", request.receive))[1],
                            media_type="application/json")

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

        @app.post("/v1/writes",
                  summary="Take a batch from the shard's primary (WAL framing): checked, fsynced, applied",
                  openapi_extra={"requestBody": {"required": True, "content": {"application/octet-stream": {
                      "schema": {"type": "string", "format": "binary"}}}, "description": "retrieval.records framing"}})
        async def post_writes(request: Request,
                              version: Annotated[str, Query(description="embedding version")]) -> Response:
            # Served by the fast path below; this route documents it.
            body = await read_request_body(request, config.max_write_bytes)
            status, payload = await handle_writes(request.scope, body, request.receive)
            return Response(payload, status_code=status, media_type="application/json")

        @app.post("/v1/primary/writes", summary="A gateway's write to the shard's primary: numbered, replicated, "
                  "acknowledged per ack", openapi_extra={"requestBody": {"required": True, "content": {
                      "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
                      "description": "retrieval.records framing, seq and term 0"}})
        async def post_primary_writes(request: Request, version: Annotated[str, Query()],
                                      ack: Annotated[str, Query()] = "majority",
                                      generation: Annotated[int, Query(ge=0)] = 0) -> Response:
            # Served by the fast path below; this route documents it.
            status, payload = await handle_primary_writes(
                request.scope, await read_request_body(request, config.max_write_bytes), request.receive)
            return Response(payload, status_code=status, media_type="application/json")

        @app.get("/v1/writes", summary="The writes after a seq (WAL framing): a lagging peer catches up from these")
        async def get_writes(version: Annotated[str, Query()], after: Annotated[int, Query(ge=0)] = 0) -> Response:
            records = await in_thread(writes_after, versions, version, after)
            return Response(encode_records(records), media_type="application/octet-stream")

        @app.get("/v1/role", summary="This replica's place in its shard's write ordering: term, primary, in-sync set")
        async def get_role(request: Request) -> Response:
            return Response((await handle_role(request.scope, b"", request.receive))[1], media_type="application/json")

        @app.post("/admin/fence", summary="Refuse writes sent under a rollout generation older than this one, "
                  "for hold_s seconds")
        async def post_fence(generation: Annotated[int, Query(ge=0)],
                             hold_s: Annotated[float, Query(gt=0, le=600)] = 10.0) -> Response:
            return json_response(await in_thread(role.writer.fence, generation, hold_s))

        @app.get("/v1/documents/{doc_id:path}",
                 summary="One document as this replica holds it (404 if absent or deleted)")
        async def get_document(doc_id: str, version: Annotated[str | None, Query()] = None) -> Response:
            found = versions.document(version, doc_id)
            if found is None:
                raise NotFound(f"no document {doc_id!r} in shard {shard_id}", field="id", shard=shard_id)
            return json_response(found)

        @app.get("/v1/ids", summary="Ids of the live documents a filter selects (delete by filter reads these)")
        async def get_ids(version: Annotated[str, Query()], filter: Annotated[str, Query()],
                          limit: Annotated[int, Query(ge=1, le=1_000_000)] = 100_000) -> Response:
            ids = await in_thread(versions.matching_ids, version, filter, limit)
            return json_response({"shard_id": shard_id, "version": version, "ids": ids})

        @app.post("/v1/scan", summary="A page of the live documents a filter selects, in id order "
                  "(retrieval.records.ScanPage: the count of all it selects, then the page)",
                  openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
                      "schema": {"type": "object"}}}, "description": "the filter's canonical JSON ({} for all)"}})
        async def post_scan(request: Request, version: Annotated[str, Query()],
                            after: Annotated[str, Query(max_length=1024)] = "",
                            limit: Annotated[int, Query(ge=0, le=10_000)] = 1000) -> Response:
            filter_canonical = (await read_request_body(request, config.max_body_bytes)).decode("utf-8", "replace")
            page = await in_thread(versions.scan, version, filter_canonical or "{}", after, limit)
            return Response(page.encode(), media_type="application/octet-stream")

        @app.get("/v1/snapshot", summary="Every live document of a version (retrieval.records.Snapshot): a peer "
                 "behind the WAL's retention, or diverged, restores from it")
        async def get_snapshot(version: Annotated[str, Query(description="embedding version")]) -> Response:
            snapshot = await in_thread(snapshots.take, versions, version)
            return Response(snapshot.encode(), media_type="application/octet-stream")

        @app.post("/admin/restore", summary="Replace a version's state with the primary's snapshot (GET /v1/snapshot)",
                  openapi_extra={"requestBody": {"required": True, "content": {"application/octet-stream": {
                      "schema": {"type": "string", "format": "binary"}}}, "description": "GET /v1/snapshot's reply"}})
        async def post_restore(request: Request,
                               version: Annotated[str, Query(description="embedding version")],
                               force: Annotated[bool, Query(description="replace the state even when this replica "
                                                                        "is ahead (it diverged)")] = False) -> Response:
            try:
                snapshot = Snapshot.decode(await read_request_body(request, config.max_snapshot_bytes))
            except ValueError as exc:
                raise MalformedBody(f"the snapshot does not parse: {exc}", field="body") from exc
            term = int_header(request.scope, TERM_HEADER.encode(), 0)
            applied = await in_thread(functools.partial(snapshots.restore_from, force=force), versions, version, term,
                                      snapshot)
            return json_response({"shard_id": shard_id, "version": version, "applied_seq": applied})

        @app.get("/admin/digest", summary="Count and sha256 of every live document (replica consistency checks)")
        async def get_digest(version: Annotated[str | None, Query()] = None) -> Response:
            live = versions.get(version)
            return json_response(await in_thread(live.digest))

        @app.post("/admin/compact", summary="Fold the write segment and tombstones into a new sealed base now")
        async def post_compact(
                version: Annotated[str | None, Query(description="embedding version")] = None) -> Response:
            version_id = versions.get(version).version_id
            return json_response(await in_thread(compaction.compact, versions, version_id))

        @app.post("/admin/tune/sample", summary="Stored vectors of the base as tuning pseudo-queries (npz)",
                  response_class=Response)
        async def post_tune_sample(version: Annotated[str, Query(description="embedding version")],
                                   count: Annotated[int, Query(ge=1, le=live_tuning.MAX_QUERIES)] = 100,
                                   seed: Annotated[int, Query(ge=0)] = 0) -> Response:
            data = await in_thread(live_tuning.sample, versions, version, count, seed)
            return Response(data, media_type="application/octet-stream")

        @app.post("/admin/tune/evaluate", summary="The base's answers to tuning queries at every value of its knob "
                  "(npz in: queries, ids; out: retrieval.tuning_choice.encode_result)", response_class=Response,
                  openapi_extra={"requestBody": {"required": True, "content": {"application/octet-stream": {
                      "schema": {"type": "string", "format": "binary"}}}}})
        async def post_tune_evaluate(request: Request, version: Annotated[str, Query(description="embedding version")],
                                     k: Annotated[int, Query(ge=1, le=1000)] = 10,
                                     max_value: Annotated[int | None, Query(ge=1)] = None) -> Response:
            body = await read_request_body(request, 64 * 1024 * 1024)
            data = await in_thread(live_tuning.evaluate, versions, version, body, k, max_value)
            return Response(data, media_type="application/octet-stream")

        @app.put("/admin/search-defaults", summary="Keep and apply tuned search defaults (nprobe / ef_search) "
                 "for queries that set none")
        async def put_search_defaults(request: Request,
                                      version: Annotated[str, Query(description="embedding version")]) -> Response:
            data = await json_object(request, "search defaults")
            return json_response(await in_thread(live_tuning.set_defaults, versions, version, data))

        @app.get("/admin/faults", summary="Current fault injection settings and counts")
        async def get_faults() -> Response:
            return json_response({"faults": faults.config.to_dict(), "active": faults.active,
                                  "injected": faults.injected})

        @app.put("/admin/faults", summary="Replace the fault injection settings (an empty object turns faults off)")
        async def put_faults(request: Request) -> Response:
            data = await json_object(request, "fault settings")
            if "spec" in data:  # the --faults string form: {"spec": "stall=0.05:100,latency=fixed:5"}
                if set(data) != {"spec"} or not isinstance(data["spec"], str):
                    raise InvalidRequest("give either {\"spec\": \"name=value,...\"} or the settings object",
                                         field="spec")
                faults.set(FaultConfig.parse(data["spec"]))
            else:
                faults.set(FaultConfig.from_dict(data))
            logger.warning("fault injection set to %s", faults.config)
            return json_response({"faults": faults.config.to_dict(), "active": faults.active})

        return app

    # The FastAPI app is built on first use (a node's replicas rarely need it; see LazyApp).
    hot: dict[tuple[str, str], HotHandler] = {
        ("POST", "/v1/search"): handle_search, ("POST", "/v1/writes"): handle_writes,
        ("POST", "/v1/primary/writes"): handle_primary_writes, ("GET", "/v1/info"): handle_info,
        ("GET", "/healthz"): handle_health, ("GET", "/v1/role"): handle_role}
    endpoints = {"/v1/writes": "writes", "/v1/primary/writes": "primary_writes", "/v1/info": "info",
                 "/healthz": "health", "/v1/role": "role"}
    fast = FastPathApp(LazyApp(documented_app), hot, max_body_bytes=config.max_body_bytes,
                       body_limits={"/v1/writes": config.max_write_bytes, "/v1/primary/writes": config.max_write_bytes,
                                    "/admin/restore": config.max_snapshot_bytes},
                       on_result=status_counter(metrics.requests, "search", endpoints))
    # SHARDRAG_INTERNAL_TOKEN: only the gateway and the shard's other replicas may call
    return ShardServer(guard_from_env(fast, internal_policy), versions, role)


def create_app(shard: Shard | ShardVersions, config: ShardServerConfig | None = None) -> Any:
    """A shard server on its own (no cluster state): the only replica, primary of its shard."""
    server = create_server(shard, config)
    server.role.start()
    return server.app

