"""When the Python clients send a request again (retrieval/client_retry.py), against real HTTP
servers on 127.0.0.1: one that is not up yet, one that answers 503 or 429 a few times first. The
gateway's own 429 is in tests/integration/test_auth.py."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from retrieval.client import AsyncShardragClient, ShardragClient
from retrieval.client_retry import MAX_WAIT_S, keyed, wait_s
from retrieval.errors import RateLimited, ShardUnavailable


class Flaky(ThreadingHTTPServer):
    """Answers ``status`` to the first ``failures`` requests (a Retry-After of 0 on a 429), then 200
    with what it received; keeps every request body."""

    def __init__(self, port: int, status: int, failures: int) -> None:
        self.status, self.failures, self.bodies, self.paths = status, failures, [], []
        super().__init__(("127.0.0.1", port), Handler)


class Handler(BaseHTTPRequestHandler):
    server: Flaky

    def _answer(self) -> None:
        size = int(self.headers.get("content-length") or 0)
        body = json.loads(self.rfile.read(size)) if size else None
        self.server.bodies.append(body)
        self.server.paths.append(self.path)
        failing = len(self.server.bodies) <= self.server.failures
        status = self.server.status if failing else 200
        payload = ({"error": {"code": "shard_unavailable" if status == 503 else "rate_limited",
                              "message": "not now", "field": None}} if failing
                   else {"hits": [], "ids": [], "seq": {}, "term": {}, "version": "v", "documents": [],
                         "count": 0, "next_offset": None, "id": "d", "echo": body})
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        if failing and status == 429:
            self.send_header("retry-after", "0")
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serving(server: Flaky) -> Iterator[Flaky]:
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture()
def unavailable_twice() -> Iterator[Flaky]:
    yield from serving(Flaky(free_port(), 503, 2))


def test_a_read_and_a_keyed_write_are_sent_again_after_503s_and_the_write_keeps_its_key(unavailable_twice):
    url = f"http://127.0.0.1:{unavailable_twice.server_address[1]}"
    with ShardragClient(url, retries=3) as client:
        client.query(vector=[0.1, 0.2], k=1)
        assert len(unavailable_twice.bodies) == 3
        client.upsert([{"id": "a", "text": "x"}])
        writes = unavailable_twice.bodies[3:]
        assert len(writes) == 1 and writes[0]["idempotency_key"].startswith("client-")
    unavailable_twice.failures = len(unavailable_twice.bodies) + 2
    with ShardragClient(url, retries=3) as client:
        client.delete(["a"], idempotency_key="mine")
    keys = {body["idempotency_key"] for body in unavailable_twice.bodies[4:]}
    assert keys == {"mine"} and len(unavailable_twice.bodies) == 7  # three tries, one key
    # a delete by filter goes again as it is: keyed, one that matched nothing would write on every shard
    unavailable_twice.failures = len(unavailable_twice.bodies) + 2
    with ShardragClient(url, retries=3) as client:
        client.delete(filter={"must": [{"key": "k", "match": {"value": 1}}]})
    assert len(unavailable_twice.bodies) == 10
    assert all("idempotency_key" not in body for body in unavailable_twice.bodies[7:])


def test_a_streamed_answer_is_sent_again_until_its_stream_starts(unavailable_twice):
    url = f"http://127.0.0.1:{unavailable_twice.server_address[1]}"
    with ShardragClient(url, retries=2) as client:
        assert list(client.answer_stream("q")) == []  # the 200 is JSON here, no event in it
    assert len(unavailable_twice.bodies) == 3 and all(b["stream"] for b in unavailable_twice.bodies)
    unavailable_twice.failures = len(unavailable_twice.bodies) + 2

    async def run() -> list:
        async with AsyncShardragClient(url, retries=2) as client:
            return [event async for event in client.answer_stream("q")]

    assert asyncio.run(run()) == [] and len(unavailable_twice.bodies) == 6
    unavailable_twice.failures = len(unavailable_twice.bodies) + 2
    with ShardragClient(url, retries=1) as client, pytest.raises(ShardUnavailable):
        list(client.answer_stream("q"))  # two tries, both refused


def test_without_retries_a_503_comes_back_at_once_and_writes_get_no_key(unavailable_twice):
    url = f"http://127.0.0.1:{unavailable_twice.server_address[1]}"
    with ShardragClient(url) as client:
        with pytest.raises(ShardUnavailable):
            client.upsert([{"id": "a", "text": "x"}])
    assert len(unavailable_twice.bodies) == 1 and "idempotency_key" not in unavailable_twice.bodies[0]


def test_a_429_is_sent_again_after_its_retry_after_even_where_a_503_would_not_be():
    for server in serving(Flaky(free_port(), 429, 2)):
        url = f"http://127.0.0.1:{server.server_address[1]}"
        with ShardragClient(url, retries=2) as client:
            client.collection("c").tune(dry_run=True)  # an admin call: a 429 was refused before anything ran
        assert len(server.bodies) == 3
        server.failures = len(server.bodies) + 3
        with ShardragClient(url, retries=2) as client, pytest.raises(RateLimited):
            client.query(vector=[0.1], k=1)  # one try and two more, all refused


def test_the_async_client_follows_the_same_rules(unavailable_twice):
    url = f"http://127.0.0.1:{unavailable_twice.server_address[1]}"

    async def run() -> None:
        async with AsyncShardragClient(url, retries=2) as client:
            await client.scroll(limit=1)
            await client.upsert([{"id": "a", "text": "x"}])

    asyncio.run(run())
    assert len(unavailable_twice.bodies) == 4 and "idempotency_key" in unavailable_twice.bodies[3]


def test_a_refused_connection_is_tried_again_until_the_server_is_up():
    port = free_port()
    server = Flaky(port, 200, 0)
    server.server_close()  # the port, not listening yet

    def start_late() -> None:
        time.sleep(0.25)
        late = Flaky(port, 200, 0)
        threading.Thread(target=late.serve_forever, daemon=True).start()
        started.append(late)

    started: list[Flaky] = []
    threading.Thread(target=start_late, daemon=True).start()
    try:
        with ShardragClient(f"http://127.0.0.1:{port}", retries=8) as client:
            assert client.get("d")["id"] == "d"
        with ShardragClient(f"http://127.0.0.1:{free_port()}", retries=0) as client, \
                pytest.raises(httpx.ConnectError):
            client.get("d")
    finally:
        for late in started:
            late.shutdown()
            late.server_close()


def test_waits_follow_retry_after_within_a_cap_else_a_short_doubling_backoff():
    def answered(retry_after: str | None) -> httpx.Response:
        return httpx.Response(429, headers={"retry-after": retry_after} if retry_after is not None else {})

    assert wait_s(0, answered("3")) == 3.0 and wait_s(0, answered("3600")) == MAX_WAIT_S
    assert 0.05 <= wait_s(0, None) <= 0.1 and 1.0 <= wait_s(10, answered(None)) <= 2.0
    assert 0.05 <= wait_s(0, answered("Wed, 21 Oct 2026 07:28:00 GMT")) <= 0.1
    assert keyed({"idempotency_key": None}, 0) == {"idempotency_key": None}
    assert keyed({"idempotency_key": "k"}, 3) == {"idempotency_key": "k"}
    with pytest.raises(ValueError, match="retries must be an integer ≥ 0"):
        ShardragClient("http://127.0.0.1:1", retries=-1)
