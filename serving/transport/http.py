"""The production shard client: our lean keep-alive HTTP/1.1 pool (``http_pool``, asyncio +
httptools), the cheapest per call of the clients measured (``docs/transport.md``; the aiohttp and
httpx clients it was measured against live in ``benchmarks/transports.py``).

Vectors go out as little-endian float32 (``retrieval.wire``); the caller's remaining budget
rides in ``x-shardrag-timeout-ms`` so the shard drops work that expired while it queued; the
internal token (``x-shardrag-token``) is written into every request.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import numpy as np
import orjson

from httpkit.auth import internal_headers
from retrieval.bm25 import LexicalQuery, encode_lexical_queries
from retrieval.contract import (
    TIMEOUT_HEADER,
    HealthInfo,
    ReplicaInfo,
    SearchParams,
    SearchReply,
    StageReply,
    UnloadReply,
    WriteReply,
)
from retrieval.errors import DeadlineExceeded, ShardUnavailable, error_for_status
from retrieval.records import ScanPage
from retrieval.wire import encode_vectors
from serving.transport.client import ShardClient, ShardReply
from serving.transport.http_pool import HttpError, HttpPool


def search_body(vectors: np.ndarray, params: SearchParams, lexical: Sequence[LexicalQuery]) -> bytes:
    """A search call's body: the query vectors, or with ``params.lexical`` the lexical queries (and
    a hybrid call's vectors after them)."""
    if params.lexical:
        return encode_lexical_queries(lexical, encode_vectors(vectors) if vectors.size else b"")
    return encode_vectors(vectors)


class JsonControlClient(ShardClient):
    """The shard's control API (info, health, stage, unload) over any client that can send one
    JSON request (``_json``); the HTTP clients of benchmarks/transports.py share it."""

    async def _json(self, replica: str, method: str, path: str, body: dict[str, Any] | None,
                    timeout_s: float) -> dict[str, Any]:
        raise NotImplementedError

    async def info(self, replica: str, timeout_s: float) -> ReplicaInfo:
        return ReplicaInfo.from_dict(await self._json(replica, "GET", "/v1/info", None, timeout_s))

    async def health(self, replica: str, timeout_s: float) -> HealthInfo:
        return HealthInfo.from_dict(await self._json(replica, "GET", "/healthz", None, timeout_s))

    async def stage(self, replica: str, version: str, timeout_s: float) -> StageReply:
        return StageReply.from_dict(await self._json(replica, "POST", "/admin/versions", {"version": version},
                                                     timeout_s))

    async def unload(self, replica: str, version: str, timeout_s: float) -> UnloadReply:
        return UnloadReply.from_dict(await self._json(replica, "DELETE", f"/admin/versions/{quote(version, safe='')}",
                                                      None, timeout_s))


class HttpShardClient(JsonControlClient):
    def __init__(self) -> None:
        self._pool = HttpPool()
        # the internal token as a raw header line (the pool writes requests by hand)
        self._auth = "".join(f"{name}: {value}\r\n" for name, value in internal_headers().items())

    async def search(self, replica: str, shard_id: int, vectors: np.ndarray, params: SearchParams,
                     timeout_s: float, *, lexical: Sequence[LexicalQuery] = ()) -> ShardReply:
        started = time.perf_counter()
        body = search_body(vectors, params, lexical)
        try:
            status, body = await self._pool.request("POST", f"{replica}/v1/search?{params.query_string()}", body,
                                                    timeout_s=timeout_s,
                                                    headers=f"{TIMEOUT_HEADER}: {timeout_s * 1000:.1f}\r\n{self._auth}")
        except TimeoutError as exc:
            raise DeadlineExceeded(f"shard {shard_id} ({replica}) did not answer in {timeout_s:.3f}s",
                                   shard=shard_id) from exc
        except HttpError as exc:
            raise ShardUnavailable(f"shard {shard_id} ({replica}) unreachable: {exc}", shard=shard_id) from exc
        if status != 200:
            raise error_for_status(status, body, peer=replica, shard=shard_id)
        reply = SearchReply.from_dict(orjson.loads(body))
        return ShardReply(shard_id, reply.version, replica, reply.results, (time.perf_counter() - started) * 1000.0,
                          reply.took_ms, reply.stats, reply.dense)

    async def _json(self, replica: str, method: str, path: str, body: dict[str, Any] | None,
                    timeout_s: float) -> dict[str, Any]:
        try:
            status, payload = await self._pool.request(method, f"{replica}{path}",
                                                       orjson.dumps(body) if body is not None else b"",
                                                       content_type="application/json", timeout_s=timeout_s,
                                                       headers=self._auth)
        except (TimeoutError, HttpError) as exc:
            raise ShardUnavailable(f"{replica}{path} unreachable: {exc!r}") from exc
        if not 200 <= status < 300:
            raise error_for_status(status, payload, peer=replica)
        answer: dict[str, Any] = orjson.loads(payload)
        return answer

    async def primary_write(self, replica: str, shard_id: int, version: str, records: bytes, ack: str,
                            generation: int, timeout_s: float) -> WriteReply:
        path = f"/v1/primary/writes?version={quote(version, safe='')}&ack={ack}&generation={generation}"
        try:
            status, payload = await self._pool.request("POST", f"{replica}{path}", records, timeout_s=timeout_s,
                                                       headers=self._auth)
        except TimeoutError as exc:
            raise DeadlineExceeded(f"shard {shard_id} ({replica}) did not take the write in {timeout_s:.3f}s",
                                   shard=shard_id) from exc
        except HttpError as exc:
            raise ShardUnavailable(f"shard {shard_id} ({replica}) unreachable: {exc}", shard=shard_id) from exc
        if status != 200:
            raise error_for_status(status, payload, peer=replica, shard=shard_id)
        return WriteReply.from_dict(orjson.loads(payload))

    async def fence(self, replica: str, generation: int, hold_s: float, timeout_s: float) -> dict[str, Any]:
        return await self._json(replica, "POST", f"/admin/fence?generation={generation}&hold_s={hold_s}", None,
                                timeout_s)

    async def writes_after(self, replica: str, version: str, after_seq: int, timeout_s: float) -> bytes:
        return await self._get_bytes(replica, f"/v1/writes?version={quote(version, safe='')}&after={after_seq}",
                                     timeout_s)

    async def _get_bytes(self, replica: str, path: str, timeout_s: float) -> bytes:
        return await self._bytes("GET", replica, path, b"", timeout_s)

    async def _bytes(self, method: str, replica: str, path: str, body: bytes, timeout_s: float) -> bytes:
        try:
            status, payload = await self._pool.request(method, f"{replica}{path}", body, timeout_s=timeout_s,
                                                       headers=self._auth)
        except (TimeoutError, HttpError) as exc:
            raise ShardUnavailable(f"{replica}{path} unreachable: {exc!r}") from exc
        if status != 200:
            raise error_for_status(status, payload, peer=replica)
        return payload

    async def snapshot(self, replica: str, version: str, timeout_s: float) -> bytes:
        return await self._get_bytes(replica, f"/v1/snapshot?version={quote(version, safe='')}", timeout_s)

    async def tune_sample(self, replica: str, version: str, count: int, seed: int, timeout_s: float) -> bytes:
        return await self._bytes("POST", replica, f"/admin/tune/sample?version={quote(version, safe='')}&count={count}"
                                               f"&seed={seed}", b"", timeout_s)

    async def tune_evaluate(self, replica: str, version: str, queries: bytes, k: int, max_value: int | None,
                            timeout_s: float) -> bytes:
        path = f"/admin/tune/evaluate?version={quote(version, safe='')}&k={k}"
        return await self._bytes("POST", replica, path + (f"&max_value={max_value}" if max_value else ""), queries,
                                      timeout_s)

    async def set_search_defaults(self, replica: str, version: str, defaults: dict[str, Any],
                                  timeout_s: float) -> dict[str, Any]:
        return await self._json(replica, "PUT", f"/admin/search-defaults?version={quote(version, safe='')}", defaults,
                                timeout_s)

    async def matching_ids(self, replica: str, shard_id: int, version: str, filter_canonical: str, limit: int,
                           timeout_s: float) -> list[str]:
        path = (f"/v1/ids?version={quote(version, safe='')}&filter={quote(filter_canonical, safe='')}"
                f"&limit={limit}")
        try:
            status, payload = await self._pool.request("GET", f"{replica}{path}", timeout_s=timeout_s,
                                                       headers=self._auth)
        except (TimeoutError, HttpError) as exc:
            raise ShardUnavailable(f"shard {shard_id} ({replica}) unreachable: {exc!r}", shard=shard_id) from exc
        if status != 200:
            raise error_for_status(status, payload, peer=replica, shard=shard_id)
        return [str(doc_id) for doc_id in orjson.loads(payload)["ids"]]

    async def scan(self, replica: str, shard_id: int, version: str, filter_canonical: str, after: str, limit: int,
                   timeout_s: float) -> ScanPage:
        path = f"/v1/scan?version={quote(version, safe='')}&after={quote(after, safe='')}&limit={limit}"
        try:
            status, payload = await self._pool.request("POST", f"{replica}{path}", filter_canonical.encode(),
                                                       timeout_s=timeout_s, headers=self._auth)
        except (TimeoutError, HttpError) as exc:
            raise ShardUnavailable(f"shard {shard_id} ({replica}) unreachable: {exc!r}", shard=shard_id) from exc
        if status != 200:
            raise error_for_status(status, payload, peer=replica, shard=shard_id)
        try:
            return ScanPage.decode(payload)
        except ValueError as exc:
            raise ShardUnavailable(f"shard {shard_id} ({replica}) sent a scan page that does not parse: {exc}",
                                   shard=shard_id) from exc

    async def document(self, replica: str, shard_id: int, version: str, doc_id: str,
                       timeout_s: float) -> dict[str, Any] | None:
        path = f"/v1/documents/{quote(doc_id, safe='')}?version={quote(version, safe='')}"
        try:
            status, payload = await self._pool.request("GET", f"{replica}{path}", timeout_s=timeout_s,
                                                       headers=self._auth)
        except (TimeoutError, HttpError) as exc:
            raise ShardUnavailable(f"shard {shard_id} ({replica}) unreachable: {exc!r}", shard=shard_id) from exc
        if status == 404:
            return None
        if status != 200:
            raise error_for_status(status, payload, peer=replica, shard=shard_id)
        answer: dict[str, Any] = orjson.loads(payload)
        return answer

    async def close(self) -> None:
        self._pool.close()
