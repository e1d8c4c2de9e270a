"""Python clients of the gateway's REST API (httpx, imported when a client is made): sync and async,
with the same methods.

    with ShardragClient("http://127.0.0.1:8000") as client:
        response = client.query(text="how do I open a file", k=5)
        for hit in response["hits"]: ...
        for event in client.answer_stream("how do I open a file"):   # RetrievalEvent, TokenEvent..., DoneEvent
            ...

        docs = client.collection("docs")                             # the same data methods, on one collection
        client.create_collection("docs", dim=384, tenant_field="tenant")

    async with AsyncShardragClient("http://127.0.0.1:8000") as client:
        answer = await client.answer("how do I open a file")      # an Answer
        async for event in client.answer_stream("..."): ...

Errors come back as the shardrag error the gateway named (status → class), with its field.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from retrieval import env
from retrieval.client_retry import asend, keyed, send
from retrieval.client_types import (
    ROLLOUT_ACTIONS,
    Answer,
    AnswerEvent,
    SSEDecoder,
    answer_body,
    backup_path,
    check,
    check_bytes,
    collection_body,
    collection_path,
    query_body,
    query_defaults_body,
    rollout_body,
    rollout_error,
    scroll_body,
    tune_body,
    tune_path,
    write_body,
)


def _connection(api_key: str | None, verify: Any) -> tuple[dict[str, str], Any]:
    key = api_key if api_key is not None else env.read("SHARDRAG_API_KEY")
    headers = {"authorization": f"Bearer {key}"} if key else {}
    if verify is None:
        verify = env.tls_ca() or True
    if isinstance(verify, str):
        import ssl

        verify = ssl.create_default_context(cafile=verify)
    return headers, verify


def _json(body: dict[str, Any]) -> bytes:
    """orjson: ~15x faster than json.dumps for batches of vectors."""
    import orjson

    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


JSON = {"content-type": "application/json"}


def _retries(retries: int) -> int:
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(f"retries must be an integer ≥ 0, got {retries!r}")
    return retries


class ShardragClient:
    def __init__(self, base_url: str, *, timeout_s: float = 30.0, api_key: str | None = None,
                 verify: Any = None, retries: int = 0) -> None:
        """``api_key``: sent as ``Authorization: Bearer``; default ``$SHARDRAG_API_KEY`` (none if unset).
        ``verify``: for https URLs, a CA bundle path or SSLContext (default ``$SHARDRAG_TLS_CA``, else the
        system's trust store). ``retries``: how many more times a request is sent when that is safe —
        a refused connection, a 429 (after its Retry-After), a read's or a keyed write's 503 or lost
        connection — with every upsert and delete by id then given an idempotency key, so it is applied once
        (``retrieval.client_retry``; 0: never, as before)."""
        import httpx

        self.retries = _retries(retries)
        self.base_url = base_url.rstrip("/")
        headers, verify = _connection(api_key, verify)
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout_s, headers=headers, verify=verify)
        self._data = "/v1"  # where query and documents live: the launched collection's paths
        self._rollout = "/admin/rollout"  # where its rollouts are run

    def collection(self, name: str) -> ShardragClient:
        """The same client on collection ``name`` (``/v1/collections/{name}/...``): query, upsert,
        delete, get, answer and rollouts go there. It shares this client's connection (close this one)."""
        view = copy.copy(self)
        view._data = collection_path(name)
        view._rollout = f"{view._data}/rollout"
        return view

    # -- collections (create and drop need an admin key) ----------------------------------
    def create_collection(self, name: str, *, dim: int | None = None, model: str | None = None, metric: str = "ip",
                          shards: int = 1, replicas: int = 1, factory: str = "Flat", tenant_field: str | None = None,
                          max_documents: int = 0, max_rps: float = 0.0,
                          lexical_language: str | None = None, ef_construction: int | None = None,
                          query_defaults: dict[str, Any] | None = None) -> dict[str, Any]:
        """Create an empty collection (``dim``: vector-only; ``model``: text, embedded by that encoder;
        ``lexical_language``: how lexical search analyses its texts, default english;
        ``ef_construction``: an HNSW factory's build breadth, default FAISS's 40; ``query_defaults``:
        :func:`~retrieval.client_types.query_defaults_body`'s form); answers once every shard's
        replicas serve it."""
        body = collection_body(dim=dim, model=model, metric=metric, shards=shards, replicas=replicas,
                               factory=factory, tenant_field=tenant_field, max_documents=max_documents,
                               max_rps=max_rps, lexical_language=lexical_language, ef_construction=ef_construction,
                               query_defaults=query_defaults)
        return self._check(self._http.put(collection_path(name), content=_json(body), headers=JSON))

    def set_query_defaults(self, name: str, *, mode: str = "dense", fusion: str = "weighted",
                           weights: dict[str, float] | None = None, rrf_k: int = 60) -> dict[str, Any]:
        """What a query of collection ``name`` that names no mode (fusion, weights, rrf_k) gets — the
        whole set; a weight measured with ``shardrag eval --url``. Needs an admin key; answers the
        collection's definition."""
        body = query_defaults_body(mode=mode, fusion=fusion, weights=weights, rrf_k=rrf_k)
        return self._check(self._http.put(f"{collection_path(name)}/query-defaults", content=_json(body),
                                          headers=JSON))

    def list_collections(self) -> list[dict[str, Any]]:
        collections: list[dict[str, Any]] = self._check(self._http.get("/v1/collections"))["collections"]
        return collections

    def get_collection(self, name: str) -> dict[str, Any]:
        return self._check(self._http.get(collection_path(name)))

    def drop_collection(self, name: str) -> dict[str, Any]:
        return self._check(self._http.delete(collection_path(name)))

    def __enter__(self) -> ShardragClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _post(self, path: str, body: dict[str, Any], *, safe: bool = False) -> Any:
        content = _json(body)
        return send(lambda: self._http.post(path, content=content, headers=JSON), self.retries, safe=safe)

    def _check(self, response: Any) -> dict[str, Any]:
        return check(response.status_code, response.content, response.headers)

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
        min_seq: dict[str, int] | None = None,
        min_term: dict[str, int] | None = None,
        mode: str | None = None,
        fusion: str | None = None,
        rrf_k: int | None = None,
        weights: dict[str, float] | None = None,
        candidates: int | None = None,
        group_by: str | None = None,
        group_size: int | None = None,
    ) -> dict[str, Any]:
        """``filter``: only documents whose metadata match (``docs/filters.md``); ``with_metadata``:
        each hit carries its metadata; ``min_seq`` and ``min_term``: a session read — only replicas
        that hold these writes answer (pass the ``seq`` and ``term`` an :meth:`upsert` or
        :meth:`delete` returned; the term keeps out a replica whose log diverged in a failover).
        ``mode``: dense, lexical (BM25) or hybrid, fused by ``fusion`` (rrf with ``rrf_k``, or
        weighted with ``weights`` per leg) over ``candidates`` hits per leg (``docs/hybrid.md``);
        each left out is the collection's query default (dense unless set). ``group_by``: a metadata
        key — the ``k`` best groups of hits sharing its value, ``group_size`` hits each, each hit's
        ``group`` its value (``docs/filters.md``)."""
        body = query_body(text=text, vector=vector, k=k, top_m=top_m, nprobe=nprobe, ef_search=ef_search,
                          timeout_ms=timeout_ms, with_text=with_text, version=version, filter=filter,
                          with_metadata=with_metadata, min_seq=min_seq, min_term=min_term, mode=mode, fusion=fusion,
                          rrf_k=rrf_k, weights=weights, candidates=candidates, group_by=group_by,
                          group_size=group_size)
        return self._check(self._post(f"{self._data}/query", body, safe=True))

    def upsert(self, documents: Sequence[dict[str, Any]], *, write_ack: str = "majority",
               idempotency_key: str | None = None) -> dict[str, Any]:
        """Insert or replace documents (``{"id", "title"?, "text" | "vector", "metadata"?}``); returns
        ``{"ids", "seq", "term", "version"}`` once ``write_ack`` replicas of each touched shard have them
        fsynced. Needs a key with the ``write`` scope."""
        body = keyed(write_body(documents=documents, write_ack=write_ack, idempotency_key=idempotency_key),
                     self.retries)
        return self._check(self._post(f"{self._data}/documents", body, safe=True))

    def delete(self, ids: Sequence[str] | None = None, *, filter: dict[str, Any] | None = None,
               write_ack: str = "majority", idempotency_key: str | None = None) -> dict[str, Any]:
        """Delete by ``ids`` or by ``filter`` (every live document it selects); same reply as upsert."""
        body = keyed(write_body(ids, filter=filter, write_ack=write_ack, idempotency_key=idempotency_key),
                     self.retries if filter is None else 0)  # by filter: sent again as it is (client_retry.keyed)
        return self._check(self._post(f"{self._data}/documents/delete", body, safe=True))

    def get(self, doc_id: str) -> dict[str, Any]:
        """One document with its metadata and seq (raises NotFound when absent or deleted)."""
        from urllib.parse import quote

        path = f"{self._data}/documents/{quote(doc_id, safe='')}"
        return self._check(send(lambda: self._http.get(path), self.retries, safe=True))

    def scroll(self, *, filter: dict[str, Any] | None = None, limit: int = 100, offset: str | None = None,
               with_vectors: bool = False) -> dict[str, Any]:
        """One page of the live documents in id order (those ``filter`` selects): ``{"documents",
        "count", "next_offset", "version"}`` — ``count`` is how many the filter selects in all; give
        ``next_offset`` back as ``offset`` for the next page (None: the last page). Read on each
        shard's primary: the caller's acknowledged writes are there."""
        body = scroll_body(filter=filter, limit=limit, offset=offset, with_vectors=with_vectors)
        return self._check(self._post(f"{self._data}/documents/scroll", body, safe=True))

    def documents(self, *, filter: dict[str, Any] | None = None, page_size: int = 500,
                  with_vectors: bool = False) -> Iterator[dict[str, Any]]:
        """Every live document ``filter`` selects, in id order, a page at a time."""
        offset: str | None = None
        while True:
            page = self.scroll(filter=filter, limit=page_size, offset=offset, with_vectors=with_vectors)
            yield from page["documents"]
            offset = page["next_offset"]
            if offset is None:
                return

    def count(self, *, filter: dict[str, Any] | None = None) -> int:
        """How many live documents ``filter`` selects (all of them without one): exact."""
        return int(self.scroll(filter=filter, limit=0)["count"])

    def backup_shard(self, shard: int) -> bytes:
        """On ``client.collection(name)`` (admin key): shard ``shard``'s live documents as of one seq
        of its primary (``retrieval.records.Snapshot`` bytes), a backup's part (``retrieval.backup``)."""
        response = self._http.get(backup_path(self._data, shard))
        return check_bytes(response.status_code, response.content, response.headers)

    # -- rollout (admin scope) ---------------------------------------------------------------
    def rollout_status(self) -> dict[str, Any]:
        """The rollout state (active / staged / previous, generation, models) and each loaded
        version's replicas and query encoder."""
        return self._check(self._http.get(self._rollout))

    def rollout(self, action: str, version: str | None, **body: Any) -> dict[str, Any]:
        """One rollout command: ``stage`` (``model=``), ``activate`` (``queries=``, ``qrels=``,
        ``force=``), ``retire``, ``abort`` or ``rollback``. A quality-gate refusal raises the
        409 error with the gate's numbers on its ``gate`` attribute. On a created collection
        (``client.collection(name)``) ``stage`` takes the model alone (``version=None``): the reply's
        ``state.staged`` names the version it made."""
        if action not in ROLLOUT_ACTIONS:
            raise ValueError(f"unknown rollout action {action!r}")
        response = self._post(f"{self._rollout}/{action}", rollout_body(version, body))
        if response.status_code == 200:
            payload: dict[str, Any] = response.json()
            return payload
        raise rollout_error(response.status_code, response.content)

    def tune(self, *, recall: float = 0.95, k: int = 10, sample: int = 200, max_value: int | None = None,
             dry_run: bool = False) -> dict[str, Any]:
        """On ``client.collection(name)`` (admin key): measure the running replicas, choose the
        cheapest ef_search / nprobe whose recall@k meets ``recall`` and make it every replica's
        default (``POST /v1/collections/{name}/tune``; ``dry_run``: report only)."""
        return self._check(self._post(tune_path(self._data), tune_body(recall, k, sample, max_value, dry_run)))

    def cluster(self) -> dict[str, Any]:
        return self._check(self._http.get("/v1/cluster"))

    def health(self) -> dict[str, Any]:
        return self._check(self._http.get("/healthz"))

    # -- answers (POST /v1/answer) -------------------------------------------------------------
    def answer(self, question: str, *, k: int = 3, max_new_tokens: int = 64, use_cache: bool = True,
               kv_reuse: str | None = None, recompute_fraction: float | None = None,
               timeout_ms: int | None = None, mode: str | None = None, fusion: str | None = None,
               group_by: str | None = None) -> Answer:
        """A grounded answer: the text, its citations (doc ids), timings and KV-cache statistics.
        ``kv_reuse`` "prefix" | "passage" (default: the generators' setting; docs/rag-cache.md);
        ``mode`` (dense, lexical, hybrid) and ``fusion`` (rrf, weighted): how the passages are
        retrieved (default: the collection's query defaults; docs/hybrid.md); ``group_by``: a
        metadata key — the best passage of each of the ``k`` best groups sharing its value
        (``"source"``: ``k`` different files; docs/filters.md)."""
        body = answer_body(question, k=k, max_new_tokens=max_new_tokens, stream=False, use_cache=use_cache,
                           kv_reuse=kv_reuse, recompute_fraction=recompute_fraction, timeout_ms=timeout_ms,
                           mode=mode, fusion=fusion, group_by=group_by)
        return Answer.from_json(self._check(self._post(f"{self._data}/answer", body, safe=True)))

    def answer_stream(self, question: str, *, k: int = 3, max_new_tokens: int = 64, use_cache: bool = True,
                      kv_reuse: str | None = None, recompute_fraction: float | None = None,
                      timeout_ms: int | None = None, mode: str | None = None,
                      fusion: str | None = None, group_by: str | None = None) -> Iterator[AnswerEvent]:
        """The answer as it is generated: a RetrievalEvent, TokenEvents, then a DoneEvent."""
        body = answer_body(question, k=k, max_new_tokens=max_new_tokens, stream=True, use_cache=use_cache,
                           kv_reuse=kv_reuse, recompute_fraction=recompute_fraction, timeout_ms=timeout_ms,
                           mode=mode, fusion=fusion, group_by=group_by)
        request = self._http.build_request("POST", f"{self._data}/answer", content=_json(body), headers=JSON)
        # sent again (retries) only until the stream starts: never after an event was given
        response = send(lambda: self._http.send(request, stream=True), self.retries, safe=True)
        try:
            if response.status_code != 200:
                response.read()
                self._check(response)
            decoder = SSEDecoder()
            for line in response.iter_lines():
                event = decoder.feed(line)
                if event is not None:
                    yield event
        finally:
            response.close()


class AsyncShardragClient:
    """The async twin of :class:`ShardragClient` (``httpx.AsyncClient``): the same methods, awaited;
    ``answer_stream`` is an async iterator."""

    def __init__(self, base_url: str, *, timeout_s: float = 30.0, api_key: str | None = None,
                 verify: Any = None, retries: int = 0) -> None:
        import httpx

        self.retries = _retries(retries)
        self.base_url = base_url.rstrip("/")
        headers, verify = _connection(api_key, verify)
        self._http = httpx.AsyncClient(base_url=self.base_url, timeout=timeout_s, headers=headers, verify=verify)
        self._data = "/v1"
        self._rollout = "/admin/rollout"

    def collection(self, name: str) -> AsyncShardragClient:
        view = copy.copy(self)
        view._data = collection_path(name)
        view._rollout = f"{view._data}/rollout"
        return view

    async def create_collection(self, name: str, *, dim: int | None = None, model: str | None = None,
                                metric: str = "ip", shards: int = 1, replicas: int = 1, factory: str = "Flat",
                                tenant_field: str | None = None, max_documents: int = 0,
                                max_rps: float = 0.0, lexical_language: str | None = None,
                                ef_construction: int | None = None,
                                query_defaults: dict[str, Any] | None = None) -> dict[str, Any]:
        body = collection_body(dim=dim, model=model, metric=metric, shards=shards, replicas=replicas,
                               factory=factory, tenant_field=tenant_field, max_documents=max_documents,
                               max_rps=max_rps, lexical_language=lexical_language, ef_construction=ef_construction,
                               query_defaults=query_defaults)
        response = await self._http.put(collection_path(name), content=_json(body), headers=JSON)
        return check(response.status_code, response.content, response.headers)

    async def set_query_defaults(self, name: str, *, mode: str = "dense", fusion: str = "weighted",
                                 weights: dict[str, float] | None = None, rrf_k: int = 60) -> dict[str, Any]:
        body = query_defaults_body(mode=mode, fusion=fusion, weights=weights, rrf_k=rrf_k)
        response = await self._http.put(f"{collection_path(name)}/query-defaults", content=_json(body), headers=JSON)
        return check(response.status_code, response.content, response.headers)

    async def list_collections(self) -> list[dict[str, Any]]:
        collections: list[dict[str, Any]] = (await self._get("/v1/collections"))["collections"]
        return collections

    async def get_collection(self, name: str) -> dict[str, Any]:
        return await self._get(collection_path(name))

    async def drop_collection(self, name: str) -> dict[str, Any]:
        response = await self._http.delete(collection_path(name))
        return check(response.status_code, response.content, response.headers)

    async def __aenter__(self) -> AsyncShardragClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def _post(self, path: str, body: dict[str, Any], *, safe: bool = False) -> dict[str, Any]:
        content = _json(body)
        response = await asend(lambda: self._http.post(path, content=content, headers=JSON), self.retries, safe=safe)
        return check(response.status_code, response.content, response.headers)

    async def _get(self, path: str, *, safe: bool = False) -> dict[str, Any]:
        response = await asend(lambda: self._http.get(path), self.retries, safe=safe)
        return check(response.status_code, response.content, response.headers)

    async def query(self, *, text: str | None = None, vector: Sequence[float] | None = None, k: int | None = None,
                    top_m: int | None = None, nprobe: int | None = None, ef_search: int | None = None,
                    timeout_ms: int | None = None, with_text: bool = True, version: str | None = None,
                    filter: dict[str, Any] | None = None, with_metadata: bool = False,
                    min_seq: dict[str, int] | None = None, min_term: dict[str, int] | None = None,
                    mode: str | None = None, fusion: str | None = None, rrf_k: int | None = None,
                    weights: dict[str, float] | None = None, candidates: int | None = None,
                    group_by: str | None = None, group_size: int | None = None) -> dict[str, Any]:
        return await self._post(f"{self._data}/query", safe=True, body=query_body(
            text=text, vector=vector, k=k, top_m=top_m, nprobe=nprobe, ef_search=ef_search, timeout_ms=timeout_ms,
            with_text=with_text, version=version, filter=filter, with_metadata=with_metadata, min_seq=min_seq,
            min_term=min_term, mode=mode, fusion=fusion, rrf_k=rrf_k, weights=weights, candidates=candidates,
            group_by=group_by, group_size=group_size))

    async def upsert(self, documents: Sequence[dict[str, Any]], *, write_ack: str = "majority",
                     idempotency_key: str | None = None) -> dict[str, Any]:
        body = keyed(write_body(documents=documents, write_ack=write_ack, idempotency_key=idempotency_key),
                     self.retries)
        return await self._post(f"{self._data}/documents", body, safe=True)

    async def delete(self, ids: Sequence[str] | None = None, *, filter: dict[str, Any] | None = None,
                     write_ack: str = "majority", idempotency_key: str | None = None) -> dict[str, Any]:
        body = keyed(write_body(ids, filter=filter, write_ack=write_ack, idempotency_key=idempotency_key),
                     self.retries if filter is None else 0)  # by filter: sent again as it is (client_retry.keyed)
        return await self._post(f"{self._data}/documents/delete", body, safe=True)

    async def get(self, doc_id: str) -> dict[str, Any]:
        from urllib.parse import quote

        return await self._get(f"{self._data}/documents/{quote(doc_id, safe='')}", safe=True)

    async def scroll(self, *, filter: dict[str, Any] | None = None, limit: int = 100, offset: str | None = None,
                     with_vectors: bool = False) -> dict[str, Any]:
        return await self._post(f"{self._data}/documents/scroll", scroll_body(
            filter=filter, limit=limit, offset=offset, with_vectors=with_vectors), safe=True)

    async def documents(self, *, filter: dict[str, Any] | None = None, page_size: int = 500,
                        with_vectors: bool = False) -> AsyncIterator[dict[str, Any]]:
        offset: str | None = None
        while True:
            page = await self.scroll(filter=filter, limit=page_size, offset=offset, with_vectors=with_vectors)
            for document in page["documents"]:
                yield document
            offset = page["next_offset"]
            if offset is None:
                return

    async def count(self, *, filter: dict[str, Any] | None = None) -> int:
        return int((await self.scroll(filter=filter, limit=0))["count"])

    async def backup_shard(self, shard: int) -> bytes:
        response = await self._http.get(backup_path(self._data, shard))
        return check_bytes(response.status_code, response.content, response.headers)

    async def rollout_status(self) -> dict[str, Any]:
        return await self._get(self._rollout)

    async def rollout(self, action: str, version: str | None, **body: Any) -> dict[str, Any]:
        if action not in ROLLOUT_ACTIONS:
            raise ValueError(f"unknown rollout action {action!r}")
        response = await self._http.post(f"{self._rollout}/{action}", content=_json(rollout_body(version, body)),
                                         headers=JSON)
        if response.status_code == 200:
            payload: dict[str, Any] = response.json()
            return payload
        raise rollout_error(response.status_code, response.content)

    async def tune(self, *, recall: float = 0.95, k: int = 10, sample: int = 200, max_value: int | None = None,
                   dry_run: bool = False) -> dict[str, Any]:
        return await self._post(tune_path(self._data), tune_body(recall, k, sample, max_value, dry_run))

    async def cluster(self) -> dict[str, Any]:
        return await self._get("/v1/cluster")

    async def health(self) -> dict[str, Any]:
        return await self._get("/healthz")

    async def answer(self, question: str, *, k: int = 3, max_new_tokens: int = 64, use_cache: bool = True,
                     kv_reuse: str | None = None, recompute_fraction: float | None = None,
                     timeout_ms: int | None = None, mode: str | None = None, fusion: str | None = None,
                     group_by: str | None = None) -> Answer:
        body = answer_body(question, k=k, max_new_tokens=max_new_tokens, stream=False, use_cache=use_cache,
                           kv_reuse=kv_reuse, recompute_fraction=recompute_fraction, timeout_ms=timeout_ms,
                           mode=mode, fusion=fusion, group_by=group_by)
        return Answer.from_json(await self._post(f"{self._data}/answer", body, safe=True))

    async def answer_stream(self, question: str, *, k: int = 3, max_new_tokens: int = 64, use_cache: bool = True,
                            kv_reuse: str | None = None, recompute_fraction: float | None = None,
                            timeout_ms: int | None = None, mode: str | None = None,
                            fusion: str | None = None, group_by: str | None = None) -> AsyncIterator[AnswerEvent]:
        body = answer_body(question, k=k, max_new_tokens=max_new_tokens, stream=True, use_cache=use_cache,
                           kv_reuse=kv_reuse, recompute_fraction=recompute_fraction, timeout_ms=timeout_ms,
                           mode=mode, fusion=fusion, group_by=group_by)
        request = self._http.build_request("POST", f"{self._data}/answer", content=_json(body), headers=JSON)
        response = await asend(lambda: self._http.send(request, stream=True), self.retries, safe=True)
        try:
            if response.status_code != 200:
                await response.aread()
                check(response.status_code, response.content, response.headers)
            decoder = SSEDecoder()
            async for line in response.aiter_lines():
                event = decoder.feed(line)
                if event is not None:
                    yield event
        finally:
            await response.aclose()
