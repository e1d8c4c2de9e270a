"""Game-day fault injection through the gateway (admin scope): the gateway forwards to a replica's
``/admin/faults`` with the internal token, which operators never see.

    GET    /admin/faults                          every replica's fault settings and counts
    PUT    /admin/faults/{shard}/{replica}        {"spec": "stall=0.05:100,..."} or the settings
                                                  object (index_shards.faults); {} turns them off
    DELETE /admin/faults                          every replica's faults off
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import FastAPI, Path, Request, Response

from httpkit.api import ERROR_RESPONSES, ErrorResponse
from httpkit.asgi import read_request_body
from httpkit.auth import internal_headers
from httpkit.responses import json_response
from httpkit.tls import client_ssl_context
from retrieval.errors import NotFound, ShardUnavailable, error_for_status

FAULT_BODY_LIMIT = 64 * 1024


async def _call(method: str, url: str, body: bytes | None = None) -> dict[str, Any]:
    import httpx

    if not url.startswith(("http://", "https://")):
        raise NotFound(f"replica {url} is not a shard server process (it runs in the gateway or on Ray): fault "
                       "injection is a feature of shard server processes (shardrag serve --backend process)",
                       field="replica")

    async with httpx.AsyncClient(timeout=10.0, headers=internal_headers(), verify=client_ssl_context()) as http:
        try:
            response = await http.request(method, f"{url}/admin/faults", content=body,
                                          headers={"content-type": "application/json"} if body is not None else None)
        except httpx.TransportError as exc:
            raise ShardUnavailable(f"replica {url} did not answer: {exc!r}") from exc
    if response.status_code != 200:
        raise error_for_status(response.status_code, response.content, peer=url)
    payload: dict[str, Any] = response.json()
    return payload


def add_fault_routes(app: FastAPI, replicas_of: Callable[[], list[tuple[str, ...]]]) -> None:
    """``replicas_of()``: each shard's replica URLs, in shard order."""

    def replica_url(shard: int, replica: int) -> str:
        shards = replicas_of()
        if not 0 <= shard < len(shards):
            raise NotFound(f"no shard {shard}: shards are 0..{len(shards) - 1}", field="shard")
        if not 0 <= replica < len(shards[shard]):
            raise NotFound(f"shard {shard} has no replica {replica}: replicas are 0..{len(shards[shard]) - 1}",
                           field="replica")
        return shards[shard][replica]

    async def each(method: str, body: bytes | None = None) -> list[dict[str, Any]]:
        targets = [(s, r, url) for s, urls in enumerate(replicas_of()) for r, url in enumerate(urls)]

        async def one(shard: int, replica: int, url: str) -> dict[str, Any]:
            try:
                return {"shard": shard, "replica": replica, "url": url, **await _call(method, url, body)}
            except Exception as exc:  # noqa: BLE001 - a dead replica is reported, not fatal to the listing
                return {"shard": shard, "replica": replica, "url": url, "error": str(exc)}

        return list(await asyncio.gather(*(one(*target) for target in targets)))

    # one route for both methods, so a 405 on this path lists both in its Allow header
    @app.api_route("/admin/faults", methods=["GET", "DELETE"], responses=ERROR_RESPONSES,
                   summary="GET: every replica's fault injection settings and counts; DELETE: all off")
    async def faults_all(request: Request) -> Response:
        if request.method == "DELETE":
            return json_response({"replicas": await each("PUT", b"{}")})
        return json_response({"replicas": await each("GET")})

    @app.put("/admin/faults/{shard}/{replica}", summary="Set one replica's fault injection (game days)",
             responses={**ERROR_RESPONSES, 404: {"model": ErrorResponse, "description": "no such shard or replica"}})
    async def faults_set(request: Request, shard: Annotated[int, Path(ge=0)],
                         replica: Annotated[int, Path(ge=0)]) -> Response:
        url = replica_url(shard, replica)
        body = await read_request_body(request, FAULT_BODY_LIMIT) or b"{}"
        return json_response({"shard": shard, "replica": replica, "url": url, **await _call("PUT", url, body)})
