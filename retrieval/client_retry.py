"""When the Python clients send a request again: the rules, shared by the sync and async clients.

A request is sent again (up to ``retries`` more times) when it cannot have done anything, or when
doing it twice is harmless:

* the connection could not be made (``ConnectError``, ``ConnectTimeout``): it was never sent;
* the gateway answered 429 (the key's rate limit: refused before anything was done), after the
  ``Retry-After`` it gave;
* a *safe* request — a read (query, listing, one document), a write that carries an idempotency
  key (the clients give every upsert and delete by id one when retries are on: :func:`keyed`), a
  delete by filter — met a 503 (a shard or the cluster state unavailable for a moment; a write's
  outcome unknown) or lost its connection after it was sent.

Anything else comes back at once, as it did. A streamed answer is sent again only until its
stream starts: never after an event was given. Waits: the ``Retry-After`` when given (at most
:data:`MAX_WAIT_S`), else 0.1 s doubling up to 2 s, each with jitter.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx

MAX_WAIT_S = 30.0
RATE_LIMITED, UNAVAILABLE = 429, 503


def wait_s(attempt: int, response: httpx.Response | None) -> float:
    """How long to wait before attempt ``attempt + 1`` (``response``: the last answer, if any)."""
    if response is not None:
        given: str | None = response.headers.get("retry-after")
        try:
            return min(max(float(given), 0.0), MAX_WAIT_S) if given is not None else _backoff(attempt)
        except ValueError:  # an HTTP date: not what the gateway sends
            return _backoff(attempt)
    return _backoff(attempt)


def _backoff(attempt: int) -> float:
    return min(2.0, 0.1 * 2.0 ** attempt) * random.uniform(0.5, 1.0)


def _again(error: Exception | None, response: httpx.Response | None, safe: bool) -> bool:
    import httpx

    if error is not None:
        return isinstance(error, httpx.ConnectError | httpx.ConnectTimeout) or (
            safe and isinstance(error, httpx.TransportError))
    assert response is not None
    return response.status_code == RATE_LIMITED or (safe and response.status_code == UNAVAILABLE)


def _given_back(attempt: int, retries: int, error: Exception | None,
                response: httpx.Response | None, safe: bool) -> httpx.Response | None:
    """The answer to give back (the error raised) when no try follows; None: try again."""
    if attempt < retries and _again(error, response, safe):
        return None
    if error is not None:
        raise error
    return response


def send(request: Callable[[], httpx.Response], retries: int, *, safe: bool) -> httpx.Response:
    """``request()``, sent again by the rules above."""
    for attempt in itertools.count():
        try:
            response, error = request(), None
        except Exception as exc:  # noqa: BLE001 - judged by _again, raised again when not retried
            response, error = None, exc
        if (answer := _given_back(attempt, retries, error, response, safe)) is not None:
            return answer
        if response is not None:
            response.close()  # a streamed answer's connection, before the next try
        time.sleep(wait_s(attempt, response))
    raise AssertionError("unreachable")


async def asend(request: Callable[[], Awaitable[httpx.Response]], retries: int, *, safe: bool) -> httpx.Response:
    """:func:`send` for the async client."""
    for attempt in itertools.count():
        try:
            response, error = await request(), None
        except Exception as exc:  # noqa: BLE001 - judged by _again, raised again when not retried
            response, error = None, exc
        if (answer := _given_back(attempt, retries, error, response, safe)) is not None:
            return answer
        if response is not None:
            await response.aclose()
        await asyncio.sleep(wait_s(attempt, response))
    raise AssertionError("unreachable")


def keyed(body: dict[str, Any], retries: int) -> dict[str, Any]:
    """A write's body, given an idempotency key when retries are on and it has none: a write sent
    again is then applied once (the gateway answers a key it has applied with the first outcome).

    The clients key upserts and deletes by id, not deletes by filter: deleting what a filter
    selects again leaves the same documents (what matches then is deleted; its reply lists those),
    while a keyed one that matched nothing would record its key on every shard — a write each, as
    a ``clear()`` or ``shardrag ingest --sync`` that finds nothing to delete would then make every
    time."""
    if retries > 0 and body.get("idempotency_key") is None:
        import uuid

        return {**body, "idempotency_key": f"client-{uuid.uuid4().hex}"}
    return body
