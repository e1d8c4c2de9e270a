"""Python client of the gateway's REST API (httpx, imported when a client is made).

    with ShardragClient("http://127.0.0.1:8000") as client:
        response = client.query(text="how do I open a file", k=5)
        for hit in response["hits"]: ...

Errors come back as the shardrag error the gateway named (status → class), with its field.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from retrieval import env
from retrieval.errors import error_for_status


class ShardragClient:
    def __init__(self, base_url: str, *, timeout_s: float = 30.0, api_key: str | None = None,
                 verify: Any = None) -> None:
        """``api_key``: sent as ``Authorization: Bearer``; default ``$SHARDRAG_API_KEY`` (none if unset).
        ``verify``: for https URLs, a CA bundle path or SSLContext (default ``$SHARDRAG_TLS_CA``, else the
        system's trust store)."""
        import httpx

        self.base_url = base_url.rstrip("/")
        key = api_key if api_key is not None else env.read("SHARDRAG_API_KEY")
        headers = {"authorization": f"Bearer {key}"} if key else {}
        if verify is None:
            verify = env.tls_ca() or True
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

    def _check(self, response: Any) -> dict[str, Any]:
        if response.status_code == 200:
            payload: dict[str, Any] = response.json()
            return payload
        raise error_for_status(response.status_code, response.content,
                               retry_after_s=float(response.headers.get("retry-after", "1")))

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
        filter: dict[str, Any] | None = None,
        with_metadata: bool = False,
    ) -> dict[str, Any]:
        """``filter``: only documents whose metadata match (``docs/filters.md``); ``with_metadata``:
        each hit carries its metadata."""
        body: dict[str, Any] = {"with_text": with_text}
        if with_metadata:
            body["with_metadata"] = True
        for name, value in (("text", text), ("k", k), ("top_m", top_m), ("nprobe", nprobe), ("ef_search", ef_search),
                            ("timeout_ms", timeout_ms), ("version", version), ("filter", filter)):
            if value is not None:
                body[name] = value
        if vector is not None:
            body["vector"] = [float(x) for x in vector]
        return self._check(self._http.post("/v1/query", json=body))

    def cluster(self) -> dict[str, Any]:
        return self._check(self._http.get("/v1/cluster"))

    def health(self) -> dict[str, Any]:
        return self._check(self._http.get("/healthz"))
