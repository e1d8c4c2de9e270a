"""Python client of the gateway's REST API (httpx, imported when a client is made).

    with ShardragClient("http://127.0.0.1:8000") as client:
        response = client.query(text="how do I open a file", k=5)
        for hit in response["hits"]: ...

Errors come back as the shardrag error the gateway named (status → class), with its field.
"""

from __future__ import annotations

from typing import Any, Sequence

from retrieval.errors import (
    DeadlineExceeded,
    EncoderError,
    Forbidden,
    InvalidRequest,
    MalformedBody,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    ShardragError,
    ShardUnavailable,
    Unauthorized,
    VersionConflict,
)

_BY_STATUS: dict[int, type[ShardragError]] = {
    400: MalformedBody, 401: Unauthorized, 403: Forbidden, 404: NotFound, 409: VersionConflict,
    413: PayloadTooLarge, 422: InvalidRequest,
    429: RateLimited, 503: ShardUnavailable, 504: DeadlineExceeded,
}


class ShardragClient:
    def __init__(self, base_url: str, *, timeout_s: float = 30.0, api_key: str | None = None,
                 verify: Any = None) -> None:
        """``api_key``: sent as ``Authorization: Bearer``; default ``$SHARDRAG_API_KEY`` (none if unset).
        ``verify``: for https URLs, a CA bundle path or SSLContext (default ``$SHARDRAG_TLS_CA``, else the
        system's trust store)."""
        import os

        import httpx

        self.base_url = base_url.rstrip("/")
        key = api_key if api_key is not None else os.environ.get("SHARDRAG_API_KEY")
        headers = {"authorization": f"Bearer {key}"} if key else {}
        if verify is None:
            verify = os.environ.get("SHARDRAG_TLS_CA") or True
        if isinstance(verify, str):
            import ssl

            verify = ssl.create_default_context(cafile=verify)
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout_s, headers=headers, verify=verify)

    def __enter__(self) -> ShardragClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _check(self, response: Any) -> Any:
        if response.status_code == 200:
            return response.json()
        try:
            error = response.json().get("error", {})
        except ValueError:
            error = {}
        cls = _BY_STATUS.get(response.status_code, ShardragError)
        if cls is ShardUnavailable and error.get("code") == EncoderError.code:
            cls = EncoderError
        message = error.get("message", response.text[:200])
        if cls is RateLimited:
            exc: ShardragError = RateLimited(message, retry_after_s=float(response.headers.get("retry-after", "1")))
        else:
            exc = cls(message, field=error.get("field"), shard=error.get("shard"))
        exc.status_code = response.status_code
        raise exc

    def query(
        self,
        *,
        text: str | None = None,
        vector: Sequence[float] | None = None,
        k: int | None = None,
        top_m: int | None = None,
        nprobe: int | None = None,
        ef_search: int | None = None,
        timeout_ms: int | None = None,
        with_text: bool = True,
        version: str | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"with_text": with_text}
        for name, value in (("text", text), ("k", k), ("top_m", top_m), ("nprobe", nprobe), ("ef_search", ef_search),
                            ("timeout_ms", timeout_ms), ("version", version)):
            if value is not None:
                body[name] = value
        if vector is not None:
            body["vector"] = [float(x) for x in vector]
        return self._check(self._http.post("/v1/query", json=body))

    def cluster(self) -> dict[str, Any]:
        return self._check(self._http.get("/v1/cluster"))

    def health(self) -> dict[str, Any]:
        return self._check(self._http.get("/healthz"))
