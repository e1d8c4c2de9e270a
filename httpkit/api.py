"""Pieces of the public JSON APIs every shardrag server shares: the error body models (and the
``responses`` table that documents them in OpenAPI) and JSON-faithful field types."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, Field

FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]


def _json_integer(value: Any) -> Any:
    """JSON has one number type: 5.0 is the integer 5 (JSON Schema agrees); 5.5, "5" and true are not."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


JSON_INTEGER = BeforeValidator(_json_integer)
"""Annotate an int field with it (``Annotated[int, Field(ge=1), JSON_INTEGER]``): bounds land in the
JSON schema as minimum/maximum, and 5.0 is accepted as 5."""

JsonInt = Annotated[int, JSON_INTEGER]
PositiveInt = Annotated[int, Field(ge=1), JSON_INTEGER]


class ErrorDetail(BaseModel):
    code: str
    message: str
    field: str | None = None
    shard: int | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "malformed JSON body"},
    401: {"model": ErrorResponse, "description": "no API key, or an unknown one (when the gateway has keys)"},
    403: {"model": ErrorResponse, "description": "the API key's scope does not cover this endpoint"},
    429: {"model": ErrorResponse, "description": "this key's rate limit is exceeded; see Retry-After"},
    409: {"model": ErrorResponse, "description": "embedding version not served / encoder mismatch"},
    413: {"model": ErrorResponse, "description": "body over the size limit"},
    422: {"model": ErrorResponse, "description": "a field is invalid; `field` names it"},
    503: {"model": ErrorResponse, "description": "a shard or the encoder is unavailable"},
    504: {"model": ErrorResponse, "description": "shards missed the deadline and partial answers are not "
                                                "allowed (or none answered); the message names them"},
}
