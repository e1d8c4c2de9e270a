"""The one ``GET /metrics`` route of every shardrag server (each app has its own registry, so
tests can run several servers in one process)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from starlette.responses import PlainTextResponse, Response


def add_metrics_route(app: FastAPI, registry: CollectorRegistry) -> None:
    async def prometheus() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    app.add_api_route("/metrics", prometheus, methods=["GET"], summary="Prometheus metrics",
                      response_class=PlainTextResponse,
                      responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}})


def status_counter(requests: Counter, endpoint: str,
                   endpoints: dict[str, str] | None = None) -> Callable[[str, int], None]:
    """``on_result`` for a fast path: count each answer in ``requests{endpoint, status}``, the
    endpoint named by ``endpoints[path]`` (default ``endpoint``). Children are resolved once per
    (path, status) (``labels()`` takes a lock and builds a dict on every call)."""
    children: dict[tuple[str, int], Any] = {}
    names = endpoints or {}

    def count(path: str, status: int) -> None:
        child = children.get((path, status))
        if child is None:
            child = children[(path, status)] = requests.labels(endpoint=names.get(path, endpoint), status=str(status))
        child.inc()

    return count
