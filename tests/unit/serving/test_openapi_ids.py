"""OpenAPI operationIds are unique: one per method where one route serves several, and a
duplicate across paths is refused when the schema is built."""

from __future__ import annotations

import warnings

import pytest
from fastapi import FastAPI

from serving.gateway.openapi import build_openapi


def test_a_route_with_two_methods_gets_an_id_per_method_and_no_warning():
    app = FastAPI()

    @app.api_route("/things", methods=["GET", "DELETE"])
    async def things() -> dict[str, str]:
        return {}

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        schema = build_openapi(title="t", version="1", routes=app.routes)
    operations = schema["paths"]["/things"]
    assert operations["get"]["operationId"] == "things_things_get"
    assert operations["delete"]["operationId"] == "things_things_delete"


def test_the_same_id_on_two_paths_is_refused():
    app = FastAPI()

    @app.get("/a", operation_id="same")
    async def a() -> dict[str, str]:
        return {}

    @app.get("/b", operation_id="same")
    async def b() -> dict[str, str]:
        return {}

    with pytest.raises(RuntimeError, match="'same' is used by GET /a and GET /b"):
        build_openapi(title="t", version="1", routes=app.routes)
