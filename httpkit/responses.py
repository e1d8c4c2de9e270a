"""Responses every shardrag server sends: JSON (orjson) and server-sent events."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response

JSON = "application/json"
EVENT_STREAM = "text/event-stream"


def json_response(payload: object, status_code: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(payload), status_code=status_code, media_type=JSON, headers=headers)


def sse_event(event: str, payload: Any) -> bytes:
    """One server-sent event: ``event: NAME`` and one ``data:`` line of JSON, then a blank line."""
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"
