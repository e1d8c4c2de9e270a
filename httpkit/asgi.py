"""The fast path of every shardrag server, and the one request-body reader.

:class:`FastPathApp` answers a few hot (method, path) routes with plain handlers and passes
everything else (docs, admin, lifespan) to the wrapped FastAPI app. On the query path
FastAPI's middleware stack, routing and dependency solving cost as much CPU as the work
itself; the hot handlers do their own validation and raise ShardragError, which becomes the
same JSON error the FastAPI routes give. The FastAPI app keeps equivalent routes (reading
their body with :func:`read_body` too), so OpenAPI describes these endpoints as well.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson

from retrieval.errors import MalformedBody, PayloadTooLarge, ShardragError

logger = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
HotHandler = Callable[[Scope, bytes, Receive], Awaitable[tuple[int, bytes]]]
"""(scope, body, receive) → (status, body bytes) of a fast-path route."""

INTERNAL_ERROR_BODY = b'{"error":{"code":"internal_error","message":"internal error"}}'


class ClientDisconnected(Exception):
    """The client went away while its request waited (e.g. a cancelled hedge): send nothing."""


DRAIN_LIMIT_BYTES = 64 << 20
"""How much of an oversize body is read and dropped before the 413 goes out. A client that sends
its whole body before reading the answer (Python's urllib, many simple clients) sees a
connection reset instead of the 413 when the server closes while it is still sending; up to
this size it gets the 413. Past it the connection is closed anyway (no unbounded reading)."""


async def _drain(receive: Receive, budget_bytes: int) -> None:
    drained = 0
    while drained <= budget_bytes:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        drained += len(message.get("body", b""))
        if not message.get("more_body", False):
            return


async def read_body(scope: Scope, receive: Receive, limit_bytes: int) -> bytes:
    """The request body, refused with 413 as soon as it exceeds ``limit_bytes`` (a declared
    ``Content-Length`` is checked first, so an oversize upload is never kept in memory; it is
    drained, up to ``DRAIN_LIMIT_BYTES``, so that every client reads the 413)."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                declared = int(value)
            except ValueError:
                raise MalformedBody(f"Content-Length {value.decode('latin-1')!r} is not a number",
                                    field="content-length") from None
            if declared > limit_bytes:
                if declared <= DRAIN_LIMIT_BYTES:
                    await _drain(receive, declared)
                raise PayloadTooLarge(f"body of {declared} bytes is over the limit of {limit_bytes}", field="body")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise MalformedBody("client disconnected before the body was complete", field="body")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit_bytes:
            if message.get("more_body", False):
                await _drain(receive, DRAIN_LIMIT_BYTES - size)
            raise PayloadTooLarge(f"body is over the limit of {limit_bytes} bytes", field="body")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def read_request_body(request: Any, limit_bytes: int) -> bytes:
    """:func:`read_body` for a Starlette ``Request`` whose body nothing has read yet."""
    return await read_body(request.scope, request.receive, limit_bytes)


class LazyApp:
    """An ASGI app built on its first request (or attribute read) instead of up front.

    A node hosts a replica per (collection, shard) placed on it; building each replica's FastAPI
    app (its docs and admin routes: tens of pydantic-checked routes) holds the GIL for tens of
    milliseconds and keeps about half a MiB, while the replica's traffic (search, writes, info,
    role) is served by the fast path. Built here, it is paid only by a replica whose admin
    routes are called."""

    def __init__(self, build: Callable[[], Any]) -> None:
        self._build: Callable[[], Any] | None = build
        self._app: Any = None

    @property
    def built(self) -> Any:
        if self._build is not None:
            self._app, self._build = self._build(), None
        return self._app

    def __getattr__(self, name: str) -> Any:
        return getattr(self.built, name)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.built(scope, receive, send)


class FastPathApp:
    def __init__(self, app: Any, routes: dict[tuple[str, str], HotHandler], *, max_body_bytes: int,
                 on_result: Callable[[str, int], None] | None = None,
                 content_types: dict[str, bytes] | None = None, body_limits: dict[str, int] | None = None) -> None:
        self.app = app
        self.routes = routes
        self.max_body_bytes = max_body_bytes
        self.body_limits = body_limits or {}  # path → its own body limit (default max_body_bytes)
        self.on_result = on_result
        self.content_types = content_types or {}  # path → content type of its 200 answers (default JSON)

    def __getattr__(self, name: str) -> Any:  # behave like the FastAPI app for everything else
        return getattr(self.app, name)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        handler = self.routes.get((scope.get("method", ""), scope.get("path", ""))) if scope["type"] == "http" else None
        if handler is None:
            await self.app(scope, receive, send)
            return
        try:
            body = await read_body(scope, receive, self.body_limits.get(scope["path"], self.max_body_bytes))
            status, payload = await handler(scope, body, receive)
        except ClientDisconnected:
            if self.on_result is not None:
                self.on_result(scope["path"], 499)  # nginx's "client closed request"
            return
        except ShardragError as exc:
            status, payload = exc.status_code, orjson.dumps(exc.to_dict())
        except Exception:  # noqa: BLE001 - a bug must not take the server down
            logger.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
            status, payload = 500, INTERNAL_ERROR_BODY
        if self.on_result is not None:
            self.on_result(scope["path"], status)
        content_type = b"application/json"
        if status == 200:
            content_type = self.content_types.get(scope["path"], content_type)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", content_type), (b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})
