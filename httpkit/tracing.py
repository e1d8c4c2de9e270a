"""OpenTelemetry tracing for every shardrag process: one switch, W3C ``traceparent`` on every hop.

Off (the default) nothing of OpenTelemetry is imported and :func:`span` returns one shared
no-op context manager: the cost is a global read per span site. On (``SHARDRAG_TRACING=on``, or
:func:`configure` called with ``on``), each process has a ``TracerProvider`` named after its
role (``shardrag-gateway``, ``shardrag-shard``, ...); spans are exported over OTLP/HTTP when an
endpoint is configured (the standard ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_ENDPOINT``), else kept in the process (nothing leaves it).

**Sampling.** A request that arrives with a sampled ``traceparent`` is traced, whole, in every
process it reaches. A gateway request without one is traced at ``SHARDRAG_TRACING_SAMPLE``
(default 0.01: every span costs ~10–15 µs of CPU in the Python SDK and a query makes about 20
across the processes); shards and nodes never start traces of their own. An untraced request
makes no OpenTelemetry object at all: no span, no context, no ``traceparent`` onward.

* :func:`asgi_middleware` — a server span per request, child of the caller's ``traceparent``;
* :func:`span` — a span inside it (the encoder, the fan-out, each shard call attempt, the merge,
  a replica's apply);
* :func:`inject` — the current span's ``traceparent`` into an outgoing request's headers.

Install the ``tracing`` extra (opentelemetry-sdk, the OTLP/HTTP exporter) to turn it on.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

from retrieval import env
from retrieval.errors import ConfigError

logger = logging.getLogger(__name__)

_NOOP = contextlib.nullcontext()
_tracer: Any = None  # an opentelemetry Tracer while tracing is on
_provider: Any = None
_root_ratio = 0.0  # the share of requests without a traceparent a gateway traces
_current_span: Any = None  # opentelemetry.trace.get_current_span, bound once tracing is on (hot: every span site)


def enabled() -> bool:
    return _tracer is not None


def recording() -> bool:
    """Whether tracing is on and the current trace is sampled (spans made now are kept)."""
    return _tracer is not None and bool(_current_span().is_recording())


def configure(service: str, *, on: bool | None = None) -> bool:
    """Turn tracing on for this process as ``service`` when ``on`` (default: ``SHARDRAG_TRACING``
    is ``on``); whether it is on. Idempotent: a second call keeps the first provider."""
    global _tracer, _provider
    wanted = on if on is not None else (env.read("SHARDRAG_TRACING", "off") or "off").lower() in ("on", "1", "true")
    if not wanted or _tracer is not None:
        return _tracer is not None
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise ConfigError("SHARDRAG_TRACING=on needs OpenTelemetry: pip install 'shardrag[tracing]'",
                          field="tracing") from exc
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased

    global _root_ratio
    _root_ratio = float(env.read("SHARDRAG_TRACING_SAMPLE", "0.01") or "0.01")
    if not 0.0 <= _root_ratio <= 1.0:
        raise ConfigError(f"SHARDRAG_TRACING_SAMPLE must be between 0 and 1, got {_root_ratio}", field="tracing")
    # a root span is made only for a request the middleware chose to trace: it is always kept
    provider = TracerProvider(sampler=ParentBased(ALWAYS_ON),
                              resource=Resource.create({"service.name": service,
                                                        "service.instance.id": f"{service}-{os.getpid()}"}))
    if os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        # small batches, sent often: a trace is whole at the collector within a second
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(), schedule_delay_millis=200))
    from opentelemetry import trace

    global _current_span
    _current_span = trace.get_current_span
    _provider = provider
    _tracer = provider.get_tracer("shardrag")
    logger.info("tracing on as %s", service)
    return True


def shutdown() -> None:
    """Flush what is pending (a process about to exit)."""
    if _provider is not None:
        _provider.shutdown()


def span(name: str, **attributes: Any) -> contextlib.AbstractContextManager[Any]:
    """A span under the current one (the no-op context when tracing is off, or when the current
    trace is not sampled)."""
    if not recording():
        return _NOOP
    started: contextlib.AbstractContextManager[Any] = _tracer.start_as_current_span(
        name, attributes={k: v for k, v in attributes.items() if v is not None})
    return started


def inject(headers: MutableMapping[str, str]) -> None:
    """Add the current span's ``traceparent`` (and ``tracestate``) to ``headers`` (nothing when off,
    or outside a sampled trace: an untraced request makes no span, so it has nothing to pass on
    and its callees trace nothing either)."""
    if not recording():
        return
    from opentelemetry.propagate import inject as otel_inject

    otel_inject(headers)


def _traced(headers: list[tuple[bytes, bytes]], roots: bool) -> bool:
    """Whether to trace a request: its caller sampled it (``traceparent`` flags 01), or — with no
    ``traceparent`` at a process that starts traces (``roots``: the gateway) — a draw at the
    sampling ratio. A process called by another (a shard) never starts a trace of its own."""
    for key, value in headers:
        if key == b"traceparent":  # ASGI servers give header names in lower case
            return value[-2:] == b"01"
    return roots and _root_ratio > 0.0 and random.random() < _root_ratio


@contextlib.contextmanager
def server_span(name: str, headers: list[tuple[bytes, bytes]]) -> Iterator[Any]:
    """A server span for a request whose raw ASGI ``headers`` may carry a ``traceparent``."""
    from opentelemetry import context
    from opentelemetry.propagate import extract
    from opentelemetry.trace import SpanKind

    carrier = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in headers
               if k.lower() in (b"traceparent", b"tracestate")}
    token = context.attach(extract(carrier))
    try:
        with _tracer.start_as_current_span(name, kind=SpanKind.SERVER) as current:
            yield current
    finally:
        context.detach(token)


def asgi_middleware(app: Callable[..., Any], *, roots: bool) -> Callable[..., Any]:
    """``app`` with a server span per traced HTTP request (``app`` itself when tracing is off).
    ``roots``: this process starts traces (the gateway); others only continue their caller's."""
    if _tracer is None:
        return app

    async def traced(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") != "http" or not _traced(scope.get("headers", []), roots):
            await app(scope, receive, send)  # untraced: no OpenTelemetry object is made
            return
        with server_span(f"{scope.get('method', '')} {scope.get('path', '')}", scope.get("headers", [])) as current:

            async def record(message: dict[str, Any]) -> None:
                if message.get("type") == "http.response.start":
                    current.set_attribute("http.response.status_code", int(message.get("status", 0)))
                await send(message)

            await app(scope, receive, record)

    return traced
