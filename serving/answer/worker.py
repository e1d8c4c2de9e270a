"""A generator worker process: one model, generating one request at a time in a worker thread
(so its HTTP loop stays responsive), with the KV cache tiers of serving.kv_client.

    POST /v1/generate  {messages | prompt_ids, max_new_tokens, greedy, temperature, top_p, seed,
                        stream, use_cache, passages, kv_reuse, recompute_fraction}
                       → {text, token_ids, cache: {...}} or an SSE stream of `token` events and
                        a final `done` event with the same stats
    GET  /v1/info, /healthz, /metrics
"""

from __future__ import annotations

import asyncio
import contextvars
import json
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, model_validator

from httpkit import tracing
from httpkit.api import ERROR_RESPONSES, JSON_INTEGER, JsonInt
from httpkit.auth import guard_from_env, internal_policy
from httpkit.errors import install_error_handlers
from httpkit.metrics import add_metrics_route
from httpkit.responses import EVENT_STREAM, json_response, sse_event
from retrieval.errors import InvalidRequest
from serving.answer.blend import SegmentedPrompt
from serving.answer.generator import Generator
from serving.answer.metrics import GeneratorMetrics
from serving.answer.passages import segment_chat
from serving.answer.result import GenerationResult


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    role: str = Field(pattern="^(system|user|assistant)$")
    content: str = Field(max_length=32_000)


class GenerateRequest(BaseModel):
    # strict, as the gateway's bodies: "false" is not a boolean nor true a token id
    model_config = ConfigDict(extra="forbid", strict=True)
    messages: list[Message] | None = Field(None, min_length=1, description="chat messages (the model's template)")
    prompt_ids: list[JsonInt] | None = Field(None, min_length=1, max_length=8192, description="or raw token ids")
    max_new_tokens: Annotated[int, JSON_INTEGER] = Field(64, ge=1, le=1024)
    greedy: bool = True
    temperature: float = Field(0.7, gt=0, le=5)
    top_p: float = Field(0.9, gt=0, le=1)
    seed: JsonInt | None = None
    stream: bool = False
    use_cache: bool = Field(True, description="false: prefill everything (the cold baseline)")
    passages: list[str] | None = Field(None, max_length=64, description="the passages as they appear verbatim "
                                       "in the messages, in order: lets their KV be reused wherever they sit")
    kv_reuse: Literal["prefix", "passage"] | None = Field(None, description="default: the server's --kv-reuse")
    recompute_fraction: float | None = Field(None, ge=0, le=1, description="passage reuse: share recomputed")

    @model_validator(mode="after")
    def _one_prompt(self) -> GenerateRequest:
        if (self.messages is None) == (self.prompt_ids is None):
            raise ValueError("give exactly one of messages and prompt_ids")
        if self.passages is not None and self.messages is None:
            raise ValueError("passages go with messages, not prompt_ids")
        if self.kv_reuse == "passage" and self.passages is None:
            raise ValueError("kv_reuse=passage needs passages")
        return self


def create_generator_app(generator: Generator, *, kv_reuse: str = "prefix", recompute_fraction: float = 0.15) -> Any:
    """``kv_reuse`` and ``recompute_fraction``: the defaults for requests that do not choose."""
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="generate")
    metrics = GeneratorMetrics.create(generator.kv)
    kv = generator.kv

    def observe(result: GenerationResult) -> None:
        metrics.ttft.observe(result.ttft_s)
        metrics.prompt_tokens.inc(result.prompt_tokens)
        metrics.hit_tokens.labels(tier="local").inc(result.local_hit_tokens)
        metrics.hit_tokens.labels(tier="remote").inc(result.remote_hit_tokens)

    def prompt_of(request: GenerateRequest) -> list[int] | SegmentedPrompt:
        if request.prompt_ids is not None:
            return request.prompt_ids
        messages = [m.model_dump() for m in request.messages or []]
        if request.passages is not None and generator.tokenizer is not None:
            return segment_chat(generator.tokenizer, messages, request.passages)  # the same ids in every mode
        return generator.chat_ids(messages)

    def run(request: GenerateRequest, on_token: Callable[[int, str], None] | None = None) -> GenerationResult:
        fraction = recompute_fraction if request.recompute_fraction is None else request.recompute_fraction
        with tracing.span("generate", **{"shardrag.max_new_tokens": request.max_new_tokens,
                                         "shardrag.kv_reuse": request.kv_reuse or kv_reuse}) as span:
            result = generator.generate(prompt_of(request), max_new_tokens=request.max_new_tokens,
                                        greedy=request.greedy, temperature=request.temperature, top_p=request.top_p,
                                        seed=request.seed, use_cache=request.use_cache, on_token=on_token,
                                        kv_reuse=request.kv_reuse or kv_reuse, recompute_fraction=fraction)
            if span is not None:
                span.set_attributes({"shardrag.prompt_tokens": result.prompt_tokens,
                                     "shardrag.new_tokens": len(result.token_ids),
                                     "shardrag.local_hit_tokens": result.local_hit_tokens,
                                     "shardrag.remote_hit_tokens": result.remote_hit_tokens,
                                     "shardrag.ttft_ms": round(result.ttft_s * 1000.0, 3)})
        return result

    app = FastAPI(title="shardrag generator", version="1",
                  description="Answer generation with KV-cache reuse across requests and processes.")
    install_error_handlers(app)

    @app.post("/v1/generate", summary="Generate (JSON, or SSE with stream=true)", responses=ERROR_RESPONSES)
    async def generate(request: GenerateRequest) -> Response:
        loop = asyncio.get_running_loop()
        if request.prompt_ids is not None:
            vocab = generator.model.config.vocab_size
            if any(not 0 <= t < vocab for t in request.prompt_ids):
                raise InvalidRequest(f"token ids must be in [0, {vocab})", field="prompt_ids")
        if not request.stream:
            # the request's context (its trace) goes with it to the generating thread
            result = await loop.run_in_executor(executor, contextvars.copy_context().run, run, request)
            observe(result)
            return json_response({"text": result.text, "token_ids": result.token_ids, "cache": result.stats()})
        queue: asyncio.Queue[bytes | None] = asyncio.Queue()

        def on_token(token: int, piece: str) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, sse_event("token", {"token": token, "text": piece}))

        def run_stream() -> None:
            try:
                result = run(request, on_token)
                observe(result)
                loop.call_soon_threadsafe(queue.put_nowait, sse_event("done", {"text": result.text,
                                                                               "cache": result.stats()}))
            except Exception as exc:  # noqa: BLE001 - reported to the client as an event
                loop.call_soon_threadsafe(queue.put_nowait, sse_event("error", {"message": str(exc)}))
            finally:
                loop.call_soon_threadsafe(queue.put_nowait, None)

        loop.run_in_executor(executor, contextvars.copy_context().run, run_stream)

        async def events() -> AsyncIterator[bytes]:
            while (chunk := await queue.get()) is not None:
                yield chunk

        return StreamingResponse(events(), media_type=EVENT_STREAM)

    @app.get("/v1/info", summary="Model, block size, cache tiers")
    async def info() -> Response:
        payload = {"model_id": generator.model_id, "block_size": generator.block_size, "dtype": generator.dtype,
                   "kv_reuse": kv_reuse, "recompute_fraction": recompute_fraction,
                   "kv_nodes": kv.nodes if kv else [], "local_pool": kv.local.stats() if kv else None,
                   "kv_stats": vars(kv.stats) if kv else None}
        return Response(json.dumps(payload, default=str), media_type="application/json")

    @app.get("/healthz", summary="Liveness")
    async def healthz() -> Response:
        return json_response({"status": "ok", "model_id": generator.model_id})

    add_metrics_route(app, metrics.registry)

    return guard_from_env(app, internal_policy)  # SHARDRAG_INTERNAL_TOKEN: only the gateway may call
