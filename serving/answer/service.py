"""``POST /v1/answer``: retrieve (through the injected retrieve function — the gateway's query
path), lay out the prompt (``prompt``), and generate on a generator worker process, so
generation never blocks the query path.

The worker is chosen by ``serving.answer.routing``: the one that owns most of the retrieved
passages (so their KV is in its local pool), unless it is over its load bound or down; other
workers still find the blocks on the kv-nodes. A worker that cannot be reached hands the request
to the next one in that order.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from httpkit import tracing
from httpkit.api import JSON_INTEGER, PositiveInt
from httpkit.auth import internal_headers
from httpkit.responses import sse_event
from httpkit.tls import client_ssl_context
from retrieval.blank import NON_BLANK_PATTERN, is_blank
from retrieval.errors import ConfigError, GeneratorUnavailable, InvalidRequest
from serving.answer.prompt import build_messages, passage_texts
from serving.answer.routing import AffinityRouter

RetrieveFn = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
"""A ``/v1/query`` body (:func:`retrieval_query`) → the query response (hits with title and text,
version, partial)."""


@dataclass(slots=True, frozen=True)
class AnswerSettings:
    timeout_s: float = 300.0  # how long a generator may take for one answer
    load_factor: float = 1.25  # a generator takes ≤ load_factor × the mean load in flight (serving.answer.routing)
    down_for_s: float = 5.0  # a generator that failed a call is skipped this long

    def validate(self) -> None:
        if self.timeout_s <= 0:
            raise ConfigError("answer.timeout_s must be > 0", field="answer.timeout_s")
        if self.load_factor < 1.0:
            raise ConfigError("answer.load_factor must be ≥ 1", field="answer.load_factor")
        if self.down_for_s < 0:
            raise ConfigError("answer.down_for_s must be ≥ 0", field="answer.down_for_s")


# What a gateway without generator workers answers on the answer routes (a 404: the routes are not
# in its schema), so that a user who read about /v1/answer learns how to turn it on.
ANSWERS_OFF = ("no answer generator runs behind this gateway: POST /v1/answer (and a collection's "
               "/answer) exists when the cluster is started with --generators N (README, \"RAG answers with "
               "a distributed KV cache\")")


class AnswerRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    question: str = Field(min_length=1, max_length=4096, json_schema_extra={"pattern": NON_BLANK_PATTERN},
                          description="not blank (retrieval.blank)")
    k: Annotated[int, Field(ge=1, le=10), JSON_INTEGER] = Field(3, description="passages retrieved into the prompt")
    max_new_tokens: Annotated[int, Field(ge=1, le=512), JSON_INTEGER] = Field(64)
    stream: bool = Field(False, description="server-sent events: retrieval, token..., done")
    greedy: bool = True
    use_cache: bool = Field(True, description="false: recompute the whole prompt (the cold baseline)")
    timeout_ms: PositiveInt | None = Field(None, description="retrieval deadline (generation has its own)")
    kv_reuse: Literal["prefix", "passage"] | None = Field(
        None, description="prefix: reuse the longest cached prompt prefix (exact); passage: reuse each passage's "
                          "cached KV wherever it ranks, recomputing a fraction of its tokens (default: the "
                          "generators' --kv-reuse)")
    recompute_fraction: float | None = Field(None, ge=0, le=1, description="passage reuse: share of the reused "
                                             "tokens recomputed (default: the generators' setting, 0.15)")
    mode: Literal["dense", "lexical", "hybrid"] | None = Field(
        None, description="how the passages are retrieved, as /v1/query's mode (default: the collection's query "
                          "defaults, dense unless set; docs/hybrid.md)")
    fusion: Literal["rrf", "weighted"] | None = Field(None, description="hybrid retrieval: how the legs are fused "
                                                      "(default: the collection's, weighted unless set)")
    group_by: str | None = Field(None, min_length=1, max_length=128, description="a metadata key: the k passages "
                                 "are the best of the k best groups sharing its value (e.g. source: k different "
                                 "files), as /v1/query's group_by with group_size 1")


def retrieval_query(request: AnswerRequest) -> dict[str, Any]:
    """The ``/v1/query`` body an answer's retrieval sends: the mode, fusion and grouping it named
    (left out: the collection's query defaults)."""
    body: dict[str, Any] = {"text": request.question, "k": request.k, "timeout_ms": request.timeout_ms}
    for name in ("mode", "fusion", "group_by"):
        if (value := getattr(request, name)) is not None:
            body[name] = value
    return body


# /v1/answer's 200, as the OpenAPI schema states it: the JSON answer, or with "stream": true the
# server-sent events; the stream's schema is one event's (its name, and its data: a JSON text)
ANSWER_OK: dict[int | str, dict[str, Any]] = {200: {
    "description": "the answer (JSON), or with \"stream\": true its server-sent events: retrieval, token..., "
                   "done (or error)",
    "content": {"application/json": {"schema": {"type": "object"}},
                "text/event-stream": {"schema": {
                    "type": "object", "required": ["event", "data"],
                    "properties": {"event": {"enum": ["retrieval", "token", "done", "error"]},
                                   "data": {"type": "string", "description": "the event's body, as JSON"}}}}}}}


class AnswerService:
    def __init__(self, generators: Sequence[str], retrieve: RetrieveFn, *,
                 settings: AnswerSettings | None = None) -> None:
        import httpx

        self.generators = [g.rstrip("/") for g in generators]
        self.retrieve = retrieve
        settings = settings or AnswerSettings()
        self.router = AffinityRouter(self.generators, load_factor=settings.load_factor,
                                     down_for_s=settings.down_for_s)
        self._http = httpx.AsyncClient(timeout=settings.timeout_s, headers=internal_headers(),
                                       verify=client_ssl_context())

    async def close(self) -> None:
        await self._http.aclose()

    async def _retrieve(self, request: AnswerRequest,
                        retrieve: RetrieveFn | None) -> tuple[dict[str, Any], list[dict[str, str]], float]:
        if not self.generators:
            raise GeneratorUnavailable("no generator is configured for /v1/answer (start the cluster with "
                                       "generators)", field="question")
        if is_blank(request.question):
            raise InvalidRequest("question is empty or white space only", field="question")
        if request.mode is not None and request.mode != "hybrid" and request.fusion is not None:
            raise InvalidRequest(f"fusion shapes a hybrid retrieval, and mode is {request.mode} (send \"mode\": "
                                 "\"hybrid\", or leave fusion out)", field="fusion")
        started = time.perf_counter()
        retrieved = await (retrieve or self.retrieve)(retrieval_query(request))
        retrieval_ms = (time.perf_counter() - started) * 1000.0
        return retrieved, build_messages(request.question, retrieved["hits"]), retrieval_ms

    def _body(self, request: AnswerRequest, retrieved: dict[str, Any], messages: list[dict[str, str]],
              stream: bool) -> dict[str, Any]:
        body = {"messages": messages, "max_new_tokens": request.max_new_tokens, "greedy": request.greedy,
                "stream": stream, "use_cache": request.use_cache, "passages": passage_texts(retrieved["hits"])}
        if request.kv_reuse is not None:
            body["kv_reuse"] = request.kv_reuse
        if request.recompute_fraction is not None:
            body["recompute_fraction"] = request.recompute_fraction
        return body

    @staticmethod
    def _summary(retrieved: dict[str, Any], retrieval_ms: float, generated: dict[str, Any], url: str,
                 started: float) -> dict[str, Any]:
        cache = generated["cache"]
        return {
            "answer": generated["text"],
            "citations": [h["doc_id"] for h in retrieved["hits"]],
            "passages": [{"n": n, "doc_id": h["doc_id"], "title": h["title"], "score": h["score"]}
                         for n, h in enumerate(retrieved["hits"], start=1)],
            "version": retrieved["version"],
            "partial_retrieval": retrieved["partial"],
            "timings": {"retrieval_ms": retrieval_ms, "ttft_ms": cache["ttft_ms"],
                        "generation_ms": cache["total_ms"], "tokens_per_s": cache["tokens_per_s"],
                        "total_ms": (time.perf_counter() - started) * 1000.0},
            "cache": {k: cache[k] for k in ("prompt_tokens", "hit_tokens", "local_hit_tokens", "remote_hit_tokens",
                                            "hit_rate", "tier", "bytes_fetched", "kv_reuse", "recomputed_tokens",
                                            "blended_tokens")
                      if k in cache},
            "generator": url,
        }

    async def answer(self, request: AnswerRequest, retrieve: RetrieveFn | None = None) -> dict[str, Any]:
        """``retrieve``: where the passages come from (default: the gateway's collection; a created
        collection's, confined to a key's tenant, for /v1/collections/{name}/answer)."""
        import httpx

        started = time.perf_counter()
        retrieved, messages, retrieval_ms = await self._retrieve(request, retrieve)
        errors = []
        order, preferred = self.router.order([h["doc_id"] for h in retrieved["hits"]])
        for url in order:
            with self.router.call(url, preferred):
                try:
                    with tracing.span("answer.generate", **{"shardrag.generator": url}):
                        response = await self._http.post(f"{url}/v1/generate", headers=_traced(),
                                                         json=self._body(request, retrieved, messages, False))
                except httpx.TransportError as exc:
                    self.router.mark_down(url)
                    errors.append(f"{url}: {exc!r}")
                    continue
            if response.status_code != 200:
                if response.status_code >= 500:
                    self.router.mark_down(url)
                errors.append(f"{url}: HTTP {response.status_code} {response.text[:200]}")
                continue
            return self._summary(retrieved, retrieval_ms, response.json(), url, started)
        raise GeneratorUnavailable("no generator answered: " + "; ".join(errors))

    async def stream(self, request: AnswerRequest, retrieve: RetrieveFn | None = None) -> AsyncIterator[bytes]:
        """SSE: `retrieval` (passages), `token`..., then `done` with the same body as the JSON answer.
        The request is checked and its passages retrieved *before* the stream starts (awaiting this
        does both): a bad request or a failed retrieval is then an HTTP error with its status and
        field, not a 200 whose stream breaks off."""
        started = time.perf_counter()
        retrieved, messages, retrieval_ms = await self._retrieve(request, retrieve)
        return self._events(request, retrieved, messages, retrieval_ms, started)

    async def _events(self, request: AnswerRequest, retrieved: dict[str, Any], messages: list[dict[str, str]],
                      retrieval_ms: float, started: float) -> AsyncIterator[bytes]:
        import httpx

        yield sse_event("retrieval", {"version": retrieved["version"], "retrieval_ms": retrieval_ms,
                                      "passages": [{"n": n, "doc_id": h["doc_id"], "title": h["title"]}
                                                   for n, h in enumerate(retrieved["hits"], start=1)]})
        errors = []
        order, preferred = self.router.order([h["doc_id"] for h in retrieved["hits"]])
        for url in order:
            try:
                with self.router.call(url, preferred):
                    # the gateway's span is the generator's parent (no span of its own: one held open
                    # across this generator's yields would be closed in another context)
                    async with self._http.stream("POST", f"{url}/v1/generate", headers=_traced(),
                                                 json=self._body(request, retrieved, messages, True)) as response:
                        if response.status_code != 200:
                            if response.status_code >= 500:
                                self.router.mark_down(url)
                            errors.append(f"{url}: HTTP {response.status_code}")
                            continue
                        event = None
                        async for line in response.aiter_lines():
                            if line.startswith("event: "):
                                event = line[7:]
                            elif line.startswith("data: "):
                                payload = json.loads(line[6:])
                                if event == "done":
                                    yield sse_event("done", self._summary(retrieved, retrieval_ms, payload, url,
                                                                          started))
                                else:
                                    yield sse_event(event or "message", payload)
                        return
            except httpx.TransportError as exc:
                self.router.mark_down(url)
                errors.append(f"{url}: {exc!r}")
        yield sse_event("error", {"message": "no generator answered: " + "; ".join(errors)})


def _traced() -> dict[str, str]:
    """The current span's traceparent for a generator request (empty when not tracing)."""
    headers: dict[str, str] = {}
    tracing.inject(headers)
    return headers
