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
    """Run ``app`` until SIGINT/SIGTERM. Blocks."""
    import uvicorn

    sock = bind_socket(host, port)
    actual_port = sock.getsockname()[1]
    url_host = f"[{host}]" if ":" in host else host

    def report() -> None:
        payload = {"name": name, "url": f"http://{url_host}:{actual_port}", "port": actual_port, "pid": os.getpid()}
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
