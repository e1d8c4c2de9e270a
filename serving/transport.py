"""The one seam between the gateway and the shards' wire.

:class:`ShardTransport` sends a batch of query vectors to one replica and returns its reply;
the balancer, batching and fan-out above it never see HTTP. Implementations:

* :class:`PooledHttpTransport` — the default: our lean keep-alive HTTP/1.1 client
  (``serving.http_pool``, asyncio + httptools), the cheapest per call of the three measured;
* :class:`AiohttpTransport` — pooled aiohttp session;
* :class:`HttpxTransport` — pooled httpx.AsyncClient (the slowest on this hop);
* ``serving.embedded.InProcessTransport`` — calls a loaded shard directly (tests, one box).

Errors are mapped here: connection failures → ShardUnavailable, the shard's 409 →
VersionConflict, its 4xx → InvalidRequest (field kept), 5xx → ShardUnavailable, timeouts →
DeadlineExceeded. Vectors go out as little-endian float32 (``retrieval.wire``).
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import numpy as np
import orjson

from retrieval.errors import (
    DeadlineExceeded,
    DimensionMismatch,
    InvalidRequest,
    NotFound,
    ResourceExhausted,
    ShardUnavailable,
    VersionConflict,
)
from retrieval.auth import internal_headers
from retrieval.tls import client_ssl_context
from retrieval.wire import CONTENT_TYPE, encode_vectors

TIMEOUT_HEADER = "x-shardrag-timeout-ms"  # the caller's remaining budget; shards drop expired work


@dataclass(slots=True, frozen=True)
class SearchParams:
    """Everything but the vectors; queries with equal params can share one shard call."""

    k: int
    version: str
    nprobe: int | None = None
    ef_search: int | None = None
    with_text: bool = True

    def query_string(self) -> str:
        params: dict[str, Any] = {"k": self.k, "version": self.version}
        if self.nprobe is not None:
            params["nprobe"] = self.nprobe
        if self.ef_search is not None:
            params["ef_search"] = self.ef_search
        if not self.with_text:
            params["with_text"] = "false"
        return urlencode(params)


@dataclass(slots=True, frozen=True)
class ShardReply:
    shard_id: int
    version: str
    replica: str
    results: list[dict[str, list[Any]]]  # per query: doc_ids, scores, titles, texts (best first)
    latency_ms: float


class ShardTransport(ABC):
    @abstractmethod
    async def search(
        self, replica: str, shard_id: int, vectors: np.ndarray, params: SearchParams, timeout_s: float
    ) -> ShardReply: ...

    @abstractmethod
    async def request_json(self, replica: str, method: str, path: str, body: dict[str, Any] | None,
                           timeout_s: float) -> dict[str, Any]:
        """A JSON request to a replica's control API (info, health, admin)."""

    async def get_json(self, replica: str, path: str, timeout_s: float) -> dict[str, Any]:
        return await self.request_json(replica, "GET", path, None, timeout_s)

    async def close(self) -> None:  # noqa: B027 - optional
        pass


def error_from_status(status: int, body: bytes, shard_id: int, replica: str) -> Exception:
    try:
        detail = orjson.loads(body).get("error", {})
    except (orjson.JSONDecodeError, AttributeError):
        detail = {}
    message = detail.get("message") or body[:200].decode("utf-8", "replace")
    where = f"shard {shard_id} ({replica})" if shard_id >= 0 else replica
    if status == 404:
        return NotFound(f"{where}: {message}", field=detail.get("field"), shard=shard_id if shard_id >= 0 else None)
    if status == 507:
        return ResourceExhausted(f"{where}: {message}", field=detail.get("field"),
                                 shard=shard_id if shard_id >= 0 else None)
    if status == 409:
        return VersionConflict(f"{where}: {message}", field=detail.get("field", "version"), shard=shard_id)
    if status == 422 and detail.get("code") == "dimension_mismatch":
        return DimensionMismatch(f"{where}: {message}", field="vector", shard=shard_id)
    if 400 <= status < 500:
        return InvalidRequest(f"{where}: {message}", field=detail.get("field"), shard=shard_id)
    return ShardUnavailable(f"{where} answered {status}: {message}", shard=shard_id)


def _json_or_error(status: int, payload: bytes, replica: str) -> dict[str, Any]:
    if not 200 <= status < 300:
        raise error_from_status(status, payload, -1, replica)
    return orjson.loads(payload)


def parse_reply(body: bytes, shard_id: int, replica: str, started: float) -> ShardReply:
    payload = orjson.loads(body)
    return ShardReply(
        shard_id=shard_id,
        version=payload["version"],
        replica=replica,
        results=payload["results"],
        latency_ms=(time.perf_counter() - started) * 1000.0,
    )


class AiohttpTransport(ShardTransport):
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

    async def search(
        self, replica: str, shard_id: int, vectors: np.ndarray, params: SearchParams, timeout_s: float
    ) -> ShardReply:
        import aiohttp

        started = time.perf_counter()
        url = f"{replica}/v1/search?{params.query_string()}"
        try:
            async with self._client().post(
                url, data=encode_vectors(vectors),
                headers={"Content-Type": CONTENT_TYPE, TIMEOUT_HEADER: f"{timeout_s * 1000:.1f}"},
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as response:
                body = await response.read()
                status = response.status
        except asyncio.TimeoutError as exc:
            raise DeadlineExceeded(f"shard {shard_id} ({replica}) did not answer in {timeout_s:.3f}s", shard=shard_id) from exc
        except aiohttp.ClientError as exc:
            raise ShardUnavailable(f"shard {shard_id} ({replica}) unreachable: {exc}", shard=shard_id) from exc
        if status != 200:
            raise error_from_status(status, body, shard_id, replica)
        return parse_reply(body, shard_id, replica, started)

    async def request_json(self, replica: str, method: str, path: str, body: dict[str, Any] | None,
                           timeout_s: float) -> dict[str, Any]:
        import aiohttp

        try:
            async with self._client().request(
                method, f"{replica}{path}", data=orjson.dumps(body) if body is not None else None,
                headers={"Content-Type": "application/json"}, timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as response:
                payload = await response.read()
                status = response.status
        except (asyncio.TimeoutError, aiohttp.ClientError) as exc:
            raise ShardUnavailable(f"{replica}{path} unreachable: {exc!r}") from exc
        return _json_or_error(status, payload, replica)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class HttpxTransport(ShardTransport):
    def __init__(self, *, max_connections: int = 512) -> None:
        import httpx

        self._client = httpx.AsyncClient(
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            timeout=None, headers=internal_headers(), verify=client_ssl_context(),
        )

    async def search(
        self, replica: str, shard_id: int, vectors: np.ndarray, params: SearchParams, timeout_s: float
    ) -> ShardReply:
        import httpx

        started = time.perf_counter()
        try:
            response = await self._client.post(
                f"{replica}/v1/search?{params.query_string()}", content=encode_vectors(vectors),
                headers={"Content-Type": CONTENT_TYPE, TIMEOUT_HEADER: f"{timeout_s * 1000:.1f}"}, timeout=timeout_s,
            )
        except httpx.TimeoutException as exc:
            raise DeadlineExceeded(f"shard {shard_id} ({replica}) did not answer in {timeout_s:.3f}s", shard=shard_id) from exc
        except httpx.TransportError as exc:
            raise ShardUnavailable(f"shard {shard_id} ({replica}) unreachable: {exc!r}", shard=shard_id) from exc
        if response.status_code != 200:
            raise error_from_status(response.status_code, response.content, shard_id, replica)
        return parse_reply(response.content, shard_id, replica, started)

    async def request_json(self, replica: str, method: str, path: str, body: dict[str, Any] | None,
                           timeout_s: float) -> dict[str, Any]:
        import httpx

        try:
            response = await self._client.request(method, f"{replica}{path}", json=body, timeout=timeout_s)
        except httpx.HTTPError as exc:
            raise ShardUnavailable(f"{replica}{path} unreachable: {exc!r}") from exc
        return _json_or_error(response.status_code, response.content, replica)

    async def close(self) -> None:
        await self._client.aclose()


class PooledHttpTransport(ShardTransport):
    def __init__(self) -> None:
        from serving.http_pool import HttpPool

        self._pool = HttpPool()
        # the internal token as a raw header line (the pool writes requests by hand)
        self._auth = "".join(f"{name}: {value}\r\n" for name, value in internal_headers().items())

    async def search(
        self, replica: str, shard_id: int, vectors: np.ndarray, params: SearchParams, timeout_s: float
    ) -> ShardReply:
        from serving.http_pool import HttpError

        started = time.perf_counter()
        try:
            status, body = await self._pool.request("POST", f"{replica}/v1/search?{params.query_string()}",
                                                    encode_vectors(vectors), timeout_s=timeout_s,
                                                    headers=f"{TIMEOUT_HEADER}: {timeout_s * 1000:.1f}\r\n{self._auth}")
        except asyncio.TimeoutError as exc:
            raise DeadlineExceeded(f"shard {shard_id} ({replica}) did not answer in {timeout_s:.3f}s", shard=shard_id) from exc
        except HttpError as exc:
            raise ShardUnavailable(f"shard {shard_id} ({replica}) unreachable: {exc}", shard=shard_id) from exc
        if status != 200:
            raise error_from_status(status, body, shard_id, replica)
        return parse_reply(body, shard_id, replica, started)

    async def request_json(self, replica: str, method: str, path: str, body: dict[str, Any] | None,
                           timeout_s: float) -> dict[str, Any]:
        from serving.http_pool import HttpError

        try:
            status, payload = await self._pool.request(method, f"{replica}{path}",
                                                       orjson.dumps(body) if body is not None else b"",
                                                       content_type="application/json", timeout_s=timeout_s,
                                                       headers=self._auth)
        except (asyncio.TimeoutError, HttpError) as exc:
            raise ShardUnavailable(f"{replica}{path} unreachable: {exc!r}") from exc
        return _json_or_error(status, payload, replica)

    async def close(self) -> None:
        self._pool.close()


TRANSPORTS = {"pooled": PooledHttpTransport, "aiohttp": AiohttpTransport, "httpx": HttpxTransport}
