"""A lean keep-alive HTTP/1.1 client for the gateway→shard hop: asyncio protocol + httptools.

It speaks only what the hop needs — POST/GET with a Content-Length body to servers we run —
so a call is one ``transport.write`` and one parse, with no per-request tasks, timers objects
or header dictionaries. Measured against aiohttp and httpx in benchmarks/query_latency.py.

Connections are pooled per (host, port). A call that times out or is cancelled closes its
connection (a half-read response cannot be reused). A reused connection that the server had
already closed is retried once on a fresh one, before any byte of the answer arrived.
"""

from __future__ import annotations

import asyncio
from collections import deque
from urllib.parse import urlsplit

import httptools

from httpkit import tracing


class HttpError(Exception):
    """The connection failed (refused, reset, closed early, unparseable answer)."""


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self._body: list[bytes] = []
        self._received_any = False

    # asyncio.Protocol ---------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._received_any = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(HttpError(f"unparseable response: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(HttpError(f"connection closed{f': {exc}' if exc else ''}"))

    # httptools callbacks --------------------------------------------------------------------
    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        waiter, self._waiter = self._waiter, None
        body = b"".join(self._body)
        self._body = []
        if not self._parser.should_keep_alive():
            self.close()
        if waiter is not None and not waiter.done():
            waiter.set_result((self._parser.get_status_code(), body))

    # use --------------------------------------------------------------------------------------
    def _fail(self, exc: Exception) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    @property
    def usable(self) -> bool:
        """Open on both ends as far as we know (a peer that died may not have been noticed yet)."""
        return not self.closed and self.transport is not None and not self.transport.is_closing()

    def send(self, request: bytes) -> asyncio.Future[tuple[int, bytes]]:
        assert self.transport is not None
        self._received_any = False
        waiter = self._waiter = asyncio.get_running_loop().create_future()
        try:
            self.transport.write(request)
        except (RuntimeError, OSError) as exc:  # the transport closed under us (uvloop raises RuntimeError)
            self.closed = True
            self._fail(HttpError(f"connection closed before the request was sent: {exc}"))
        return waiter

    @property
    def received_any(self) -> bool:
        return self._received_any

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class HttpPool:
    def __init__(self, *, max_idle_per_host: int = 64) -> None:
        self._idle: dict[tuple[str, int, bool], deque[_Connection]] = {}
        self._max_idle = max_idle_per_host

    async def _connect(self, host: str, port: int, tls: bool = False) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            if tls:
                from httpkit.tls import client_ssl_context

                _, connection = await loop.create_connection(_Connection, host, port, ssl=client_ssl_context(),
                                                             server_hostname=host)
            else:
                _, connection = await loop.create_connection(_Connection, host, port)
        except OSError as exc:
            raise HttpError(f"cannot connect to {host}:{port}: {exc.strerror or exc}") from exc
        return connection

    async def request(self, method: str, url: str, body: bytes = b"", *, content_type: str = "application/octet-stream",
                      timeout_s: float, headers: str = "") -> tuple[int, bytes]:
        """(status, body) of one request; raises HttpError or asyncio.TimeoutError.

        ``headers``: extra header lines, each ending in CRLF.
        """
        parts = urlsplit(url)
        tls = parts.scheme == "https"
        host, port = parts.hostname or "127.0.0.1", parts.port or (443 if tls else 80)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        if tracing.recording():  # the caller's span travels as W3C traceparent
            carrier: dict[str, str] = {}
            tracing.inject(carrier)
            headers += "".join(f"{name}: {value}\r\n" for name, value in carrier.items())
        head = (f"{method} {target} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\n{headers}\r\n").encode("latin-1")
        request = head + body
        key = (host, port, tls)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        for attempt in (0, 1):
            idle = self._idle.get(key)
            reused = False
            connection = None
            while idle:
                candidate = idle.pop()
                if candidate.usable:
                    connection, reused = candidate, True
                    break
                candidate.close()
            if connection is None:
                connection = await asyncio.wait_for(self._connect(host, port, tls), max(deadline - loop.time(), 0.001))
            waiter = connection.send(request)
            timer = loop.call_later(max(deadline - loop.time(), 0.0), _expire, waiter)
            try:
                status, payload = await waiter
            except HttpError:
                connection.close()
                if reused and attempt == 0 and not connection.received_any:
                    continue  # the server had closed this idle connection: once more, fresh
                raise
            except BaseException:  # timeout or cancellation: the connection is mid-response
                connection.close()
                raise
            finally:
                timer.cancel()
            if not connection.closed:
                pool = self._idle.setdefault(key, deque())
                if len(pool) < self._max_idle:
                    pool.append(connection)
                else:
                    connection.close()
            return status, payload
        raise HttpError("unreachable")  # pragma: no cover

    def close(self) -> None:
        for pool in self._idle.values():
            while pool:
                pool.pop().close()
        self._idle.clear()


def _expire(waiter: asyncio.Future[tuple[int, bytes]]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())
