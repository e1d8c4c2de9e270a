"""The gateway→shard clients the production pooled client was measured against
(``docs/transport.md``): pooled aiohttp and pooled httpx, behind the same ShardClient seam.
They live here, not in production code, because production ships one shard client.

    python -m benchmarks.transports --client aiohttp --cluster CLUSTER.json --port 0

runs a gateway process that uses one of them (same flags and ready line as ``shardrag gateway``),
which ``benchmarks/query_latency.py`` starts next to a local cluster's own gateway.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson

from httpkit.auth import internal_headers
from httpkit.tls import client_ssl_context
from retrieval.bm25 import LexicalQuery
from retrieval.contract import TIMEOUT_HEADER, SearchParams, SearchReply, WriteReply
from retrieval.errors import DeadlineExceeded, ShardUnavailable, error_for_status
from retrieval.records import ScanPage
from retrieval.wire import CONTENT_TYPE
from serving.transport.client import ShardClient, ShardReply
from serving.transport.http import HttpShardClient, JsonControlClient, search_body


def _reply(body: bytes, shard_id: int, replica: str, started: float) -> ShardReply:
    reply = SearchReply.from_dict(orjson.loads(body))
    return ShardReply(shard_id, reply.version, replica, reply.results, (time.perf_counter() - started) * 1e3,
                      reply.took_ms, reply.stats, reply.dense)


class _WritesThroughThePooledClient(JsonControlClient):
    """The write path of these measured clients: the production pooled client's (what they are
    measured on is the search path; the seam needs every method on every client)."""

    _writes: HttpShardClient | None = None

    def _pooled(self) -> HttpShardClient:
        if self._writes is None:
            self._writes = HttpShardClient()
        return self._writes

    async def primary_write(self, replica: str, shard_id: int, version: str, records: bytes, ack: str,
                            generation: int, timeout_s: float) -> WriteReply:
        return await self._pooled().primary_write(replica, shard_id, version, records, ack, generation, timeout_s)

    async def writes_after(self, replica: str, version: str, after_seq: int, timeout_s: float) -> bytes:
        return await self._pooled().writes_after(replica, version, after_seq, timeout_s)

    async def snapshot(self, replica: str, version: str, timeout_s: float) -> bytes:
        return await self._pooled().snapshot(replica, version, timeout_s)

    async def fence(self, replica: str, generation: int, hold_s: float, timeout_s: float) -> dict[str, Any]:
        return await self._pooled().fence(replica, generation, hold_s, timeout_s)

    async def document(self, replica: str, shard_id: int, version: str, doc_id: str,
                       timeout_s: float) -> dict[str, Any] | None:
        return await self._pooled().document(replica, shard_id, version, doc_id, timeout_s)

    async def matching_ids(self, replica: str, shard_id: int, version: str, filter_canonical: str, limit: int,
                           timeout_s: float) -> list[str]:
        return await self._pooled().matching_ids(replica, shard_id, version, filter_canonical, limit, timeout_s)

    async def scan(self, replica: str, shard_id: int, version: str, filter_canonical: str, after: str, limit: int,
                   timeout_s: float) -> ScanPage:
        return await self._pooled().scan(replica, shard_id, version, filter_canonical, after, limit, timeout_s)

    async def tune_sample(self, replica: str, version: str, count: int, seed: int, timeout_s: float) -> bytes:
        return await self._pooled().tune_sample(replica, version, count, seed, timeout_s)

    async def tune_evaluate(self, replica: str, version: str, queries: bytes, k: int, max_value: int | None,
                            timeout_s: float) -> bytes:
        return await self._pooled().tune_evaluate(replica, version, queries, k, max_value, timeout_s)

    async def set_search_defaults(self, replica: str, version: str, defaults: dict[str, Any],
                                  timeout_s: float) -> dict[str, Any]:
        return await self._pooled().set_search_defaults(replica, version, defaults, timeout_s)

    async def close(self) -> None:
        if self._writes is not None:
            await self._writes.close()


class AiohttpShardClient(_WritesThroughThePooledClient):
    def __init__(self, *, max_connections: int = 512) -> None:
        self._max_connections = max_connections
        self._session: Any = None

    def _client(self) -> Any:
        if self._session is None:
            import aiohttp

            connector = aiohttp.TCPConnector(limit=self._max_connections, limit_per_host=0,
                                             keepalive_timeout=60, enable_cleanup_closed=True,
                                             ssl=client_ssl_context())
            self._session = aiohttp.ClientSession(connector=connector, skip_auto_headers=("User-Agent",),
                                                  headers=internal_headers())
        return self._session

    async def search(self, replica: str, shard_id: int, vectors: np.ndarray, params: SearchParams,
                     timeout_s: float, *, lexical: Sequence[LexicalQuery] = ()) -> ShardReply:
        import aiohttp

        started = time.perf_counter()
        try:
            async with self._client().post(
                f"{replica}/v1/search?{params.query_string()}", data=search_body(vectors, params, lexical),
                headers={"Content-Type": CONTENT_TYPE, TIMEOUT_HEADER: f"{timeout_s * 1000:.1f}"},
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as response:
                body = await response.read()
                status = response.status
        except TimeoutError as exc:
            raise DeadlineExceeded(f"shard {shard_id} ({replica}) did not answer in {timeout_s:.3f}s",
                                   shard=shard_id) from exc
        except aiohttp.ClientError as exc:
            raise ShardUnavailable(f"shard {shard_id} ({replica}) unreachable: {exc}", shard=shard_id) from exc
        if status != 200:
            raise error_for_status(status, body, peer=replica, shard=shard_id)
        return _reply(body, shard_id, replica, started)

    async def _json(self, replica: str, method: str, path: str, body: dict[str, Any] | None,
                    timeout_s: float) -> dict[str, Any]:
        import aiohttp

        try:
            async with self._client().request(
                method, f"{replica}{path}", data=orjson.dumps(body) if body is not None else None,
                headers={"Content-Type": "application/json"}, timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as response:
                payload = await response.read()
                status = response.status
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise ShardUnavailable(f"{replica}{path} unreachable: {exc!r}") from exc
        if not 200 <= status < 300:
            raise error_for_status(status, payload, peer=replica)
        answer: dict[str, Any] = orjson.loads(payload)
        return answer

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        await super().close()


class HttpxShardClient(_WritesThroughThePooledClient):
    def __init__(self, *, max_connections: int = 512) -> None:
        import httpx

        self._client = httpx.AsyncClient(
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            timeout=None, headers=internal_headers(), verify=client_ssl_context(),
        )

    async def search(self, replica: str, shard_id: int, vectors: np.ndarray, params: SearchParams,
                     timeout_s: float, *, lexical: Sequence[LexicalQuery] = ()) -> ShardReply:
        import httpx

        started = time.perf_counter()
        try:
            response = await self._client.post(
                f"{replica}/v1/search?{params.query_string()}", content=search_body(vectors, params, lexical),
                headers={"Content-Type": CONTENT_TYPE, TIMEOUT_HEADER: f"{timeout_s * 1000:.1f}"}, timeout=timeout_s,
            )
        except httpx.TimeoutException as exc:
            raise DeadlineExceeded(f"shard {shard_id} ({replica}) did not answer in {timeout_s:.3f}s",
                                   shard=shard_id) from exc
        except httpx.TransportError as exc:
            raise ShardUnavailable(f"shard {shard_id} ({replica}) unreachable: {exc!r}", shard=shard_id) from exc
        if response.status_code != 200:
            raise error_for_status(response.status_code, response.content, peer=replica, shard=shard_id)
        return _reply(response.content, shard_id, replica, started)

    async def _json(self, replica: str, method: str, path: str, body: dict[str, Any] | None,
                    timeout_s: float) -> dict[str, Any]:
        import httpx

        try:
            response = await self._client.request(method, f"{replica}{path}", json=body, timeout=timeout_s)
        except httpx.HTTPError as exc:
            raise ShardUnavailable(f"{replica}{path} unreachable: {exc!r}") from exc
        if not 200 <= response.status_code < 300:
            raise error_for_status(response.status_code, response.content, peer=replica)
        answer: dict[str, Any] = response.json()
        return answer

    async def close(self) -> None:
        await self._client.aclose()
        await super().close()


CLIENTS: dict[str, type[ShardClient]] = {"aiohttp": AiohttpShardClient, "httpx": HttpxShardClient}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.transports", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--client", choices=sorted(CLIENTS), required=True)
    parser.add_argument("--cluster", required=True, help="cluster spec JSON (as for `shardrag gateway`)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)

    from httpkit.serve import serve_app
    from serving.gateway.app import create_app
    from serving.gateway.config import ClusterSpec
    from serving.gateway.factory import GatewaySetup

    spec = ClusterSpec.load(args.cluster)
    setup = GatewaySetup(spec.gateway, spec.shards, shard_client=CLIENTS[args.client]())
    serve_app(create_app(setup), host=args.host, port=args.port, name=f"gateway-{args.client}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
