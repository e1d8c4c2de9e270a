"""The one error tree of shardrag.

Every package raises these; foreign errors (FAISS, SQLite, httpx, OS) are mapped at the
boundary with ``raise ... from exc``. HTTP handlers turn them into a status code and a JSON
body ``{"error": {"code", "message", "field"?, "shard"?}}`` using ``status_code`` and
:meth:`ShardragError.to_dict`; every client turns such an answer back into the same class with
:func:`error_for_status` (the one mapping, used by the shard client and the Python client).

    ShardragError
    ├── InvalidRequest              400/422  bad input; ``field`` names the culprit
    │   ├── MalformedBody           400      JSON or binary body that does not parse
    │   └── DimensionMismatch       422      vector length differs from the index dimension
    ├── PayloadTooLarge             413      body over the configured limit
    ├── Unauthorized                401      no API key / internal token, or an unknown one
    ├── Forbidden                   403      a key whose scope does not cover the endpoint
    ├── RateLimited                 429      the key's rate limit is exceeded (``retry_after_s``)
    │   └── QuotaExceeded           429      a collection's or key's quota (documents, requests/s) is used up
    ├── NotFound                    404      unknown collection / version / document
    ├── Conflict                    409      a name already taken (a collection created twice)
    ├── VersionConflict             409      embedding version not held / not mergeable
    │   └── RolloutRefused          409      a rollout command that makes no sense now (reason given)
    ├── ReplicaBehind               409      a replica has not applied the writes a request needs yet
    ├── WriteRefused                409      a write that cannot be taken as sent: re-route or retry it
    │   ├── NotPrimary              409      this replica does not order the shard's writes (now)
    │   ├── StaleTerm               409      a record from a primary term this replica knows has ended
    │   ├── Diverged                409      a seq this replica holds with other content
    │   └── StaleView               409      the writer's cluster view (rollout generation) is out of date
    ├── ResourceExhausted           507      not enough memory to hold another version
    ├── ConfigError                 --       bad configuration or command-line value
    │   └── HeldElsewhere                    a data dir or collection already held by another process
    ├── BuildError                  --       building or publishing a collection failed
    ├── IndexIntegrityError         --       a shard on disk is damaged or incomplete
    │   ├── ManifestMissing                  no manifest: the directory is never served
    │   └── ChecksumMismatch                 a file's sha256 differs from the manifest
    ├── EncoderError                503      the embedding model cannot be loaded / used
    ├── ShardUnavailable            503      no replica of a shard answered
    │   ├── CoordinatorUnavailable  503      the cluster state (etcd, the local coordinator) did not answer
    │   └── GeneratorUnavailable    503      no answer generator is configured, or none answered
    └── DeadlineExceeded            504      the request's deadline passed
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


class ShardragError(Exception):
    """Base of every shardrag error. ``status_code`` is the HTTP status it maps to."""

    status_code: int = 500
    code: str = "internal_error"

    def __init__(self, message: str, *, field: str | None = None, shard: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.shard = shard

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.field is not None:
            body["field"] = self.field
        if self.shard is not None:
            body["shard"] = self.shard
        return {"error": body}


class InvalidRequest(ShardragError):
    status_code = 422
    code = "invalid_request"


class MalformedBody(InvalidRequest):
    status_code = 400
    code = "malformed_body"


class DimensionMismatch(InvalidRequest):
    status_code = 422
    code = "dimension_mismatch"


class PayloadTooLarge(ShardragError):
    status_code = 413
    code = "payload_too_large"


class Unauthorized(ShardragError):
    """No credentials, or credentials that match no key."""

    status_code = 401
    code = "unauthorized"


class Forbidden(ShardragError):
    """A valid key whose scope does not cover the endpoint."""

    status_code = 403
    code = "forbidden"


class RateLimited(ShardragError):
    status_code = 429
    code = "rate_limited"

    def __init__(self, message: str, *, retry_after_s: float, field: str | None = "rate_limit") -> None:
        super().__init__(message, field=field)
        self.retry_after_s = retry_after_s


class QuotaExceeded(RateLimited):
    """A quota of a collection or key is used up; the message names the limit."""

    code = "quota_exceeded"


class Conflict(ShardragError):
    status_code = 409
    code = "conflict"


class NotFound(ShardragError):
    status_code = 404
    code = "not_found"


class VersionConflict(ShardragError):
    status_code = 409
    code = "version_conflict"


class ReplicaBehind(ShardragError):
    """A replica that has not applied the sequence number a request needs (session reads, a write
    that would leave a gap): another replica may answer, or this one after it caught up."""

    status_code = 409
    code = "replica_behind"


class WriteRefused(ShardragError):
    """A write that cannot be taken as sent; the sender re-routes it (another primary), refreshes
    its view, or repairs the replica — it is never silently accepted."""

    status_code = 409
    code = "write_refused"


class NotPrimary(WriteRefused):
    code = "not_primary"


class StaleTerm(WriteRefused):
    code = "stale_term"


class Diverged(WriteRefused):
    code = "diverged"


class StaleView(WriteRefused):
    code = "stale_view"


class ResourceExhausted(ShardragError):
    status_code = 507
    code = "resource_exhausted"


class ConfigError(ShardragError):
    status_code = 500
    code = "config_error"


class HeldElsewhere(ConfigError):
    code = "held_elsewhere"


class BuildError(ShardragError):
    status_code = 500
    code = "build_error"


class IndexIntegrityError(ShardragError):
    status_code = 500
    code = "index_integrity"


class ManifestMissing(IndexIntegrityError):
    code = "manifest_missing"


class ChecksumMismatch(IndexIntegrityError):
    code = "checksum_mismatch"


class EncoderError(ShardragError):
    status_code = 503
    code = "encoder_unavailable"


class ShardUnavailable(ShardragError):
    status_code = 503
    code = "shard_unavailable"


class CoordinatorUnavailable(ShardUnavailable):
    code = "coordinator_unavailable"


class GeneratorUnavailable(ShardUnavailable):
    code = "generator_unavailable"


class DeadlineExceeded(ShardragError):
    status_code = 504
    code = "deadline_exceeded"


def _field_of(location: Any) -> str:
    parts = [str(part) for part in location or ()]
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    return ".".join(parts) or "body"


def validation_error_body(errors: list[dict[str, Any]]) -> tuple[int, dict[str, Any]]:
    """Map pydantic/FastAPI validation errors to (status, body) naming the first bad field.

    Malformed JSON is a 400 on ``body``; everything else is a 422 whose ``field`` is the
    dotted location without the ``body``/``query`` prefix (``vector.3``, ``k``).
    """
    if not errors:
        return 422, InvalidRequest("invalid request").to_dict()
    first = errors[0]
    field = _field_of(first.get("loc"))
    message = str(first.get("msg", "invalid value"))
    if first.get("type") == "json_invalid":
        return 400, MalformedBody(f"request body is not valid JSON: {message}", field="body").to_dict()
    if first.get("type") == "extra_forbidden":
        message = f"unknown field {field!r}"
    elif first.get("type") == "missing":
        message = f"field {field!r} is required"
    else:
        message = f"{field}: {message}"
    body = InvalidRequest(message, field=field).to_dict()
    body["error"]["details"] = [{"field": _field_of(e.get("loc")), "message": str(e.get("msg", ""))}
                                for e in errors[:10]]
    return 422, body


_BY_STATUS: dict[int, type[ShardragError]] = {
    400: MalformedBody, 401: Unauthorized, 403: Forbidden, 404: NotFound, 409: VersionConflict,
    413: PayloadTooLarge, 422: InvalidRequest, 429: RateLimited, 503: ShardUnavailable, 504: DeadlineExceeded,
    507: ResourceExhausted,
}


def _classes_by_code() -> dict[str, type[ShardragError]]:
    found: dict[str, type[ShardragError]] = {}
    pending: list[type[ShardragError]] = [ShardragError]
    while pending:
        cls = pending.pop()
        found.setdefault(cls.code, cls)  # a subclass that keeps its parent's code maps to the parent
        pending.extend(cls.__subclasses__())
    return found


def _error_detail(body: bytes | Mapping[str, Any] | None) -> dict[str, Any]:
    if body is None:
        return {}
    if isinstance(body, Mapping):
        payload: Any = body
    else:
        try:
            payload = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            return {"message": body[:200].decode("utf-8", "replace")}
    detail = payload.get("error") if isinstance(payload, Mapping) else None
    return dict(detail) if isinstance(detail, Mapping) else {}


def error_for_status(status: int, body: bytes | Mapping[str, Any] | None = None, *, peer: str | None = None,
                     shard: int | None = None, retry_after_s: float | None = None) -> ShardragError:
    """The error a non-2xx answer of a shardrag server stands for (its JSON body
    ``{"error": {"code", "message", "field"?, "shard"?}}`` is parsed when present).

    The class comes from the body's ``code`` when it names one of this tree, else from the status.
    ``peer`` says the answer came over an internal hop (a shard replica, a kv-node) and names it:
    the message is prefixed with where it came from, and what the peer failed at itself — a 5xx
    other than 507, or refusing our credentials — is :class:`ShardUnavailable`, because for the
    caller that replica is unavailable, not the request wrong. The returned error's
    ``status_code`` is the status received.
    """
    detail = _error_detail(body)
    message = str(detail.get("message") or f"HTTP {status}")
    field = detail.get("field")
    shard = shard if shard is not None else detail.get("shard")
    code = detail.get("code")
    cls = _classes_by_code().get(code) if isinstance(code, str) else None
    if cls is None or cls.status_code != status and not (cls is InvalidRequest and 400 <= status < 500):
        cls = _BY_STATUS.get(status) or (InvalidRequest if 400 <= status < 500 else ShardragError)
    if cls is ShardUnavailable and code == EncoderError.code:
        cls = EncoderError
    if peer is not None:
        where = f"shard {shard} ({peer})" if shard is not None else peer
        if (status >= 500 and status != 507) or status in (401, 403):
            error: ShardragError = ShardUnavailable(f"{where} answered {status}: {message}", shard=shard)
            error.status_code = ShardUnavailable.status_code
            return error
        message = f"{where}: {message}"
    if issubclass(cls, RateLimited):
        error = cls(message, retry_after_s=retry_after_s if retry_after_s is not None else 1.0)
    else:
        error = cls(message, field=field, shard=shard)
    error.status_code = status
    return error
