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

from httpkit.asgi import FastPathApp, HotHandler, Receive, Scope
from httpkit.auth import guard_from_env, internal_policy
from httpkit.errors import install_error_handlers
from httpkit.metrics import add_metrics_route
from httpkit.responses import json_response
from retrieval.errors import MalformedBody
from serving.kvcache.blocks import pack_blocks, unpack_keys, unpack_puts
from serving.kvcache.metrics import KVNodeMetrics
from serving.kvcache.pool import BlockPool

BINARY = b"application/octet-stream"


def create_kv_node_app(budget_bytes: int, *, max_body_bytes: int = 512 << 20) -> Any:
    pool = BlockPool(budget_bytes)
    metrics = KVNodeMetrics.create()
    hits, misses = metrics.lookups.labels(result="hit"), metrics.lookups.labels(result="miss")

    async def put(scope: Scope, body: bytes, receive: Receive) -> tuple[int, bytes]:
        try:
            blocks = unpack_puts(body)
        except ValueError as exc:
            raise MalformedBody(f"bad block frames: {exc}", field="body") from exc
        stored = sum(pool.put(key, payload, parent) for key, parent, payload in blocks)
        metrics.blocks_stored.inc(stored)
        metrics.used_bytes.set(pool.used_bytes)
        metrics.evictions.set(pool.evictions)
        return 200, orjson.dumps({"stored": stored, "offered": len(blocks)})

    async def get(scope: Scope, body: bytes, receive: Receive) -> tuple[int, bytes]:
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
        metrics.bytes_sent.inc(len(packed))
        return 200, packed

    app = FastAPI(title="shardrag kv-node", version="1",
                  description="KV-cache blocks in memory, shared by the generator processes.")
    install_error_handlers(app)

    @app.get("/v1/stats", summary="Blocks, bytes, evictions")
    async def stats() -> Response:
        return json_response(pool.stats())

    @app.get("/healthz", summary="Liveness")
    async def healthz() -> Response:
        return json_response({"status": "ok", **pool.stats()})

    add_metrics_route(app, metrics.registry)

    routes: dict[tuple[str, str], HotHandler] = {("POST", "/v1/blocks/put"): put, ("POST", "/v1/blocks/get"): get}
    fast = FastPathApp(app, routes, max_body_bytes=max_body_bytes, content_types={"/v1/blocks/get": BINARY})
    return guard_from_env(fast, internal_policy)  # SHARDRAG_INTERNAL_TOKEN: only generators may call
