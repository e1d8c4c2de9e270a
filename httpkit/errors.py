"""JSON errors on every route of a shardrag server: ShardragError → its status and body;
validation → 400/422 naming the field; anything else → 500 with the traceback logged (a bug)."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse

from retrieval.errors import ShardragError, validation_error_body

logger = logging.getLogger(__name__)


def _allowed_methods(request: Request) -> str:
    """The methods of the path template the request's path resolves to (Starlette's first match):
    every route declared with that template, not only the first one's."""
    routes = [r for r in request.app.routes
              if getattr(r, "path_regex", None) is not None and r.path_regex.match(request.url.path)]
    if not routes:
        return ""
    template = routes[0].path
    return ", ".join(sorted({m for r in routes if r.path == template for m in (getattr(r, "methods", None) or ())}))


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ShardragError)
    async def _shardrag_error(request: Request, exc: ShardragError) -> JSONResponse:
        return JSONResponse(exc.to_dict(), status_code=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        status, body = validation_error_body(list(exc.errors()))
        return JSONResponse(body, status_code=status)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        headers: Any = getattr(exc, "headers", None)
        if exc.status_code == 405:  # every method some route takes on this path, not only the first route's
            headers = {**(headers or {}), "allow": _allowed_methods(request)}
        return JSONResponse({"error": {"code": code, "message": str(exc.detail)}}, status_code=exc.status_code,
                            headers=headers)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error on %s %s", request.method, request.url.path)
        return JSONResponse({"error": {"code": "internal_error", "message": "internal error"}}, status_code=500)
