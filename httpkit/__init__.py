"""The HTTP kit: what every shardrag server shares, between the core and the servers.

    serve      bind the port (0 = any free one), run uvicorn, report the real address with one
               ``SHARDRAG_READY {json}`` line (and a port file); parse that line
    asgi       the fast-path ASGI wrapper for hot routes, and the one request-body reader
    errors     JSON error handlers: ShardragError → its status, validation → 400/422 naming the field
    responses  JSON (orjson) and server-sent-event responses
    auth       API keys with scopes, the internal token, per-key rate limits, the ASGI guard
    tls        HTTPS for servers, the CA internal clients verify with
    metrics    the one ``/metrics`` route of every server
    tracing    OpenTelemetry (optional, off by default): a server span per traced request, spans
               inside it, W3C traceparent in and out, OTLP export

Environment variables are read by ``retrieval.env`` (the one module that reads ``SHARDRAG_*``).

May import: ``retrieval`` and the web stack (fastapi, starlette, uvicorn, orjson, prometheus_client).
Imported by ``index_shards`` and ``serving``; never by ``retrieval`` or ``training``.
"""
