"""The pooled HTTP client against a real asyncio server: keep-alive reuse, and a pooled
connection whose peer went away is replaced, never an exception out of the pool (under uvloop a
write on a closed transport raises RuntimeError — that once became a 500 in the chaos test)."""

from __future__ import annotations

import asyncio

import pytest
import uvloop

from serving.transport.http_pool import HttpError, HttpPool

RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok"


async def _server() -> tuple[asyncio.AbstractServer, int, list[asyncio.StreamWriter]]:
    writers: list[asyncio.StreamWriter] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length")), 0)
                await reader.readexactly(length)
                writer.write(RESPONSE)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], writers


def test_reuse_and_recovery_from_a_dead_pooled_connection():
    async def scenario() -> None:
        server, port, writers = await _server()
        pool = HttpPool()
        url = f"http://127.0.0.1:{port}/x"
        assert await pool.request("POST", url, b"abc", timeout_s=5) == (200, b"ok")
        assert await pool.request("POST", url, b"abc", timeout_s=5) == (200, b"ok")
        assert len(writers) == 1  # kept alive and reused
        # the pooled connection dies under us: close our side's transport without telling the pool
        idle = next(iter(pool._idle.values()))[0]  # noqa: SLF001 - white-box: make the stale case happen
        idle.transport.close()
        assert await pool.request("POST", url, b"abc", timeout_s=5) == (200, b"ok")
        # and a server that went away entirely is an HttpError, never something else
        server.close()
        for writer in writers:
            writer.close()
        await server.wait_closed()
        with pytest.raises(HttpError):
            for _ in range(3):
                await pool.request("POST", url, b"abc", timeout_s=5)
        pool.close()

    uvloop.run(scenario())


def test_send_on_a_closed_transport_fails_the_request_not_the_caller():
    async def scenario() -> None:
        server, port, _ = await _server()
        pool = HttpPool()
        connection = await pool._connect("127.0.0.1", port)  # noqa: SLF001
        connection.transport.close()
        await asyncio.sleep(0)
        waiter = connection.send(b"POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
        with pytest.raises(HttpError):
            await waiter
        server.close()

    uvloop.run(scenario())
