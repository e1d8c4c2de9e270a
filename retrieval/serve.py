"""Process plumbing shared by every shardrag server (shard server, gateway, later kv-node):
bind the port itself (0 = any free port), run uvicorn on that socket, and report the real
address once the server accepts connections — one ``SHARDRAG_READY {json}`` line on stdout
and, if asked, an atomically written port file. uvicorn is imported only when serving.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
from pathlib import Path
from typing import Any, Callable

logger = logging.getLogger(__name__)

READY_PREFIX = "SHARDRAG_READY "


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _write_port_file(path: Path, payload: dict[str, Any]) -> None:
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temp.write_text(json.dumps(payload))
    os.replace(temp, path)


def parse_ready_line(line: str) -> dict[str, Any] | None:
    """The payload of a ``SHARDRAG_READY`` line, or None for any other line."""
    if not line.startswith(READY_PREFIX):
        return None
    return json.loads(line[len(READY_PREFIX):])


def serve_app(
    app: Any,
    *,
    host: str,
    port: int,
    name: str,
    port_file: str | Path | None = None,
    log_level: str = "warning",
    extra_ready: Callable[[], dict[str, Any]] | None = None,
) -> None:
    """Run ``app`` until SIGINT/SIGTERM. Blocks. HTTPS when SHARDRAG_TLS_CERT/KEY are set."""
    import uvicorn

    from retrieval.tls import server_tls

    tls = server_tls()
    scheme = "https" if tls else "http"
    sock = bind_socket(host, port)
    actual_port = sock.getsockname()[1]
    url_host = f"[{host}]" if ":" in host else host

    def report() -> None:
        payload = {"name": name, "url": f"{scheme}://{url_host}:{actual_port}", "port": actual_port, "pid": os.getpid()}
        if extra_ready:
            payload.update(extra_ready())
        if port_file:
            _write_port_file(Path(port_file), payload)
        sys.stdout.write(READY_PREFIX + json.dumps(payload) + "\n")
        sys.stdout.flush()

    class ReportingServer(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if not self.should_exit:
                report()

    try:
        import uvloop  # noqa: F401

        loop = "uvloop"
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        loop = "asyncio"
    config = uvicorn.Config(
        app,
        log_level=log_level,
        access_log=False,
        loop=loop,
        http="httptools",
        lifespan="on",
        timeout_graceful_shutdown=5,
        timeout_keep_alive=75,
        ssl_certfile=tls[0] if tls else None,
        ssl_keyfile=tls[1] if tls else None,
    )
    ReportingServer(config).run(sockets=[sock])


async def read_limited_body(request: Any, limit_bytes: int) -> bytes:
    """The request body, refused with 413 as soon as it exceeds ``limit_bytes``
    (``Content-Length`` checked first so an oversize upload is not read at all)."""
    from retrieval.errors import MalformedBody, PayloadTooLarge

    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            declared_bytes = int(declared)
        except ValueError:
            raise MalformedBody(f"Content-Length {declared!r} is not a number", field="content-length") from None
        if declared_bytes > limit_bytes:
            raise PayloadTooLarge(f"body of {declared_bytes} bytes is over the limit of {limit_bytes}", field="body")
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit_bytes:
            raise PayloadTooLarge(f"body is over the limit of {limit_bytes} bytes", field="body")
        chunks.append(chunk)
    return b"".join(chunks)


def install_error_handlers(app: Any) -> None:
    """JSON errors everywhere: ShardragError → its status; validation → 400/422 naming the field;
    anything else → 500 with the traceback logged (and a bug to fix)."""
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException
    from starlette.responses import JSONResponse

    from retrieval.errors import ShardragError, validation_error_body

    @app.exception_handler(ShardragError)
    async def _shardrag_error(request: Any, exc: ShardragError) -> JSONResponse:
        return JSONResponse(exc.to_dict(), status_code=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Any, exc: RequestValidationError) -> JSONResponse:
        status, body = validation_error_body(list(exc.errors()))
        return JSONResponse(body, status_code=status)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Any, exc: HTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return JSONResponse({"error": {"code": code, "message": str(exc.detail)}}, status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(request: Any, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error on %s %s", request.method, request.url.path)
        return JSONResponse({"error": {"code": "internal_error", "message": "internal error"}}, status_code=500)


HotHandler = Callable[[dict[str, Any], bytes, Any], Any]  # (scope, body, receive) → awaitable (status, JSON bytes)


class ClientDisconnected(Exception):
    """The client went away while its request waited (e.g. a cancelled hedge): send nothing."""


class FastPathApp:
    """ASGI wrapper that answers a few hot (method, path) routes with plain handlers and passes
    everything else (docs, admin, lifespan) to the wrapped FastAPI app.

    On the query path FastAPI's middleware stack, routing and dependency solving cost as much
    CPU as the work itself; the hot handlers do their own validation and raise ShardragError,
    which becomes the same JSON error the FastAPI routes give. The FastAPI app keeps
    equivalent routes, so OpenAPI describes these endpoints too.
    """

    def __init__(self, app: Any, routes: dict[tuple[str, str], HotHandler], *, max_body_bytes: int,
                 on_result: Callable[[str, int], None] | None = None,
                 content_types: dict[str, bytes] | None = None) -> None:
        self.app = app
        self.routes = routes
        self.max_body_bytes = max_body_bytes
        self.on_result = on_result
        self.content_types = content_types or {}  # path → content type of its 200 answers (default JSON)

    def __getattr__(self, name: str) -> Any:  # behave like the FastAPI app for everything else
        return getattr(self.app, name)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        handler = self.routes.get((scope.get("method", ""), scope.get("path", ""))) if scope["type"] == "http" else None
        if handler is None:
            await self.app(scope, receive, send)
            return
        from retrieval.errors import ShardragError

        try:
            body = await _read_asgi_body(scope, receive, self.max_body_bytes)
            status, payload = await handler(scope, body, receive)
        except ClientDisconnected:
            if self.on_result is not None:
                self.on_result(scope["path"], 499)  # nginx's "client closed request"
            return
        except ShardragError as exc:
            status, payload = exc.status_code, _dumps(exc.to_dict())
        except Exception:  # noqa: BLE001 - a bug must not take the server down
            logger.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
            status, payload = 500, b'{"error":{"code":"internal_error","message":"internal error"}}'
        if self.on_result is not None:
            self.on_result(scope["path"], status)
        content_type = self.content_types.get(scope["path"], b"application/json") if status == 200 else b"application/json"
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", content_type), (b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})


def _dumps(payload: Any) -> bytes:
    import orjson

    return orjson.dumps(payload)


async def _read_asgi_body(scope: dict[str, Any], receive: Any, limit_bytes: int) -> bytes:
    from retrieval.errors import MalformedBody, PayloadTooLarge

    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                declared = int(value)
            except ValueError:
                raise MalformedBody("Content-Length is not a number", field="content-length") from None
            if declared > limit_bytes:
                raise PayloadTooLarge(f"body of {declared} bytes is over the limit of {limit_bytes}", field="body")
    chunks = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise MalformedBody("client disconnected before the body was complete", field="body")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit_bytes:
            raise PayloadTooLarge(f"body is over the limit of {limit_bytes} bytes", field="body")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
