"""Process plumbing shared by every shardrag server (shard server, gateway, kv-node, generator):
bind the port itself (0 = any free port), run uvicorn on that socket, and report the real
address once the server accepts connections — one ``SHARDRAG_READY {json}`` line on stdout
and, if asked, an atomically written port file. uvicorn is imported only when serving.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from retrieval.atomic import atomic_write_bytes
from retrieval.errors import ConfigError

logger = logging.getLogger(__name__)

READY_PREFIX = "SHARDRAG_READY "


def bind_socket(host: str, port: int, *, fallback_to_any_port: bool = False) -> socket.socket:
    """A listening socket on (host, port). With ``fallback_to_any_port``, a busy port gives way
    to any free one (the caller learns which from the ready line)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        if not (fallback_to_any_port and port and exc.errno == errno.EADDRINUSE):
            sock.close()
            raise ConfigError(f"cannot bind {host}:{port}: {exc.strerror}", field="port") from exc
        logger.warning("port %d is busy; taking a free one", port)
        sock.bind((host, 0))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def parse_ready_line(line: str) -> dict[str, Any] | None:
    """The payload of a ``SHARDRAG_READY`` line, or None for any other line."""
    if not line.startswith(READY_PREFIX):
        return None
    payload = json.loads(line[len(READY_PREFIX):])
    return payload if isinstance(payload, dict) else None


def serve_app(
    app: Any,
    *,
    host: str,
    port: int,
    name: str,
    port_file: str | Path | None = None,
    log_level: str = "warning",
    extra_ready: Callable[[], dict[str, Any]] | None = None,
    fallback_to_any_port: bool = False,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Run ``app`` until SIGINT/SIGTERM. Blocks. HTTPS when SHARDRAG_TLS_CERT/KEY are set.
    ``on_ready(url)``: called once the server listens, after the ready line."""
    import uvicorn

    from httpkit import tracing
    from httpkit.tls import server_tls

    role = name.split("-")[0]
    if tracing.configure(f"shardrag-{role}"):  # SHARDRAG_TRACING=on: a span per traced request
        app = tracing.asgi_middleware(app, roots=role == "gateway")

    tls = server_tls()
    scheme = "https" if tls else "http"
    sock = bind_socket(host, port, fallback_to_any_port=fallback_to_any_port)
    actual_port = sock.getsockname()[1]
    url_host = f"[{host}]" if ":" in host else host

    def report() -> None:
        payload = {"name": name, "url": f"{scheme}://{url_host}:{actual_port}", "port": actual_port, "pid": os.getpid()}
        if extra_ready:
            payload.update(extra_ready())
        if port_file:
            atomic_write_bytes(Path(port_file), json.dumps(payload).encode())
        sys.stdout.write(READY_PREFIX + json.dumps(payload) + "\n")
        sys.stdout.flush()
        if on_ready:
            on_ready(payload["url"])

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
