"""A KV-cache node: blocks in memory under a byte budget (LRU, leaves first), shared by every
generator process. ``shardrag kv-node --budget-mb 512 --port 0``.

    POST /v1/blocks/put   body: frames [key][u32 len][parent key + payload] ...
    POST /v1/blocks/get   body: concatenated 16-byte keys → frames of the blocks held (request order)
    GET  /v1/stats        blocks, bytes used / budget, evictions, hits / misses
    GET  /healthz, /metrics

Binary in, binary out (no pickle, no JSON floats): a block of SmolLM2-135M is ~740 KB of fp32.
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest

from retrieval.auth import guard_from_env, internal_policy
from retrieval.errors import MalformedBody
from retrieval.serve import FastPathApp, install_error_handlers

from serving.kv_blocks import pack_blocks, unpack_keys, unpack_puts
from serving.kv_pool import BlockPool

BINARY = b"application/octet-stream"


def create_kv_node_app(budget_bytes: int, *, max_body_bytes: int = 512 << 20) -> Any:
    pool = BlockPool(budget_bytes)
    registry = CollectorRegistry()
    blocks_in = Counter("shardrag_kvnode_blocks_stored_total", "Blocks written to this node", registry=registry)
    lookups = Counter("shardrag_kvnode_lookups_total", "Block lookups by result", ["result"], registry=registry)
    bytes_out = Counter("shardrag_kvnode_bytes_sent_total", "Block bytes served", registry=registry)
    used = Gauge("shardrag_kvnode_used_bytes", "Bytes held", registry=registry)
    evictions = Gauge("shardrag_kvnode_evictions", "Blocks evicted so far", registry=registry)
    hits, misses = lookups.labels(result="hit"), lookups.labels(result="miss")

    async def put(scope: dict[str, Any], body: bytes, receive: Any = None) -> tuple[int, bytes]:
        try:
            blocks = unpack_puts(body)
        except ValueError as exc:
            raise MalformedBody(f"bad block frames: {exc}", field="body") from exc
        stored = sum(pool.put(key, payload, parent) for key, parent, payload in blocks)
        blocks_in.inc(stored)
        used.set(pool.used_bytes)
        evictions.set(pool.evictions)
        return 200, orjson.dumps({"stored": stored, "offered": len(blocks)})

    async def get(scope: dict[str, Any], body: bytes, receive: Any = None) -> tuple[int, bytes]:
        try:
            keys = unpack_keys(body)
        except ValueError as exc:
            raise MalformedBody(str(exc), field="body") from exc
        found = []
        for key in keys:
            payload = pool.get(key)
            if payload is None:
                misses.inc()
            else:
                hits.inc()
                found.append((key, payload))
        packed = pack_blocks(found)
        bytes_out.inc(len(packed))
        return 200, packed

    app = FastAPI(title="shardrag kv-node", version="1",
                  description="KV-cache blocks in memory, shared by the generator processes.")
    install_error_handlers(app)

    @app.get("/v1/stats", summary="Blocks, bytes, evictions")
    async def stats() -> Response:
        return Response(orjson.dumps(pool.stats()), media_type="application/json")

    @app.get("/healthz", summary="Liveness")
    async def healthz() -> Response:
        return Response(orjson.dumps({"status": "ok", **pool.stats()}), media_type="application/json")

    @app.get("/metrics", summary="Prometheus metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    routes = {("POST", "/v1/blocks/put"): put, ("POST", "/v1/blocks/get"): get}
    fast = FastPathApp(app, routes, max_body_bytes=max_body_bytes, content_types={"/v1/blocks/get": BINARY})
    return guard_from_env(fast, internal_policy)  # SHARDRAG_INTERNAL_TOKEN: only generators may call
