"""How a shard's primary reaches the other replicas of its shard: replicate a batch, read a
replica's state, copy a log delta or a snapshot across. One small interface, two wires:

* :class:`HttpPeers` — shard server processes (``POST /v1/writes``, ``GET /v1/info``, ...), with
  the internal token on every call; a peer's error answer comes back as the same error class
  (``retrieval.errors.error_for_status``), an unreachable peer as ShardUnavailable;
* :class:`LocalPeers` — replicas loaded in one process (tests, the embedded backend), called
  directly.

Calls are synchronous: the primary sends to its replicas from a small thread pool while it
writes its own log, and the write lock it holds is a thread lock.
"""

from __future__ import annotations

import http.client
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING
from urllib.parse import quote, urlsplit

from httpkit import tracing
from httpkit.auth import internal_headers
from httpkit.tls import client_ssl_context
from index_shards.replica_log import Mark
from retrieval.contract import ReplicaInfo
from retrieval.errors import DeadlineExceeded, ShardUnavailable, error_for_status
from retrieval.records import Snapshot, decode_records

if TYPE_CHECKING:
    from index_shards.versions import ShardVersions

TERM_HEADER = "x-shardrag-term"  # the sender's primary term
PREV_HEADER = "x-shardrag-prev"  # seq:term:checksum of the record before the batch


def prev_header(prev: Mark | None) -> str:
    return f"{prev.seq}:{prev.term}:{prev.checksum}" if prev is not None else ""


def parse_prev(value: str | None) -> Mark | None:
    if not value:
        return None
    seq, term, checksum = (int(part) for part in value.split(":"))
    return Mark(seq, term, checksum)


class PeerClient(ABC):
    @abstractmethod
    def replicate(self, peer: str, version: str, term: int, prev: Mark | None, payload: bytes,
                  timeout_s: float) -> int:
        """Send framed records; the peer's applied seq after."""

    def send(self, peer: str, version: str, term: int, prev: Mark | None, payload: bytes,
             timeout_s: float) -> Callable[[float], int]:
        """Start :meth:`replicate` and return what waits for its answer (given the time left): a
        primary sends a batch to every replica, logs it itself, then collects the answers. Wires
        that cannot start a call without waiting for it make the call when the answer is asked for."""
        return lambda remaining_s: self.replicate(peer, version, term, prev, payload, remaining_s)

    @abstractmethod
    def info(self, peer: str, timeout_s: float) -> ReplicaInfo:
        """What the peer holds (versions with applied seq and last mark, its role)."""

    @abstractmethod
    def snapshot(self, peer: str, version: str, timeout_s: float) -> Snapshot:
        """The peer's whole state of ``version``."""

    @abstractmethod
    def restore(self, peer: str, version: str, term: int, snapshot: Snapshot, force: bool, timeout_s: float) -> int:
        """Replace the peer's state of ``version`` with ``snapshot``; its applied seq after."""

    def close(self) -> None:  # noqa: B027 - only wires that hold connections close them
        pass


class HttpPeers(PeerClient):
    """Peers over HTTP/1.1 keep-alive connections of the standard library's ``http.client``, one per
    (thread, peer): a primary replicates every write to every in-sync replica, and on a small host
    that client's CPU per request is what queries feel (httpx costs several times more)."""

    def __init__(self) -> None:
        self._headers = internal_headers()
        self._local = threading.local()

    def _connection(self, url: str, timeout_s: float) -> http.client.HTTPConnection:
        connections: dict[str, http.client.HTTPConnection] = self._local.__dict__.setdefault("connections", {})
        connection = connections.get(url)
        if connection is None:
            parts = urlsplit(url)
            host, port = parts.hostname or "127.0.0.1", parts.port
            connection = (http.client.HTTPSConnection(host, port, timeout=timeout_s, context=client_ssl_context())
                          if parts.scheme == "https" else http.client.HTTPConnection(host, port, timeout=timeout_s))
            connections[url] = connection
        connection.timeout = timeout_s
        if connection.sock is not None:
            connection.sock.settimeout(timeout_s)
        return connection

    def _drop(self, url: str) -> None:
        connection = self._local.__dict__.get("connections", {}).pop(url, None)
        if connection is not None:
            connection.close()

    def _start(self, method: str, url: str, peer: str, timeout_s: float, body: bytes | None = None,
               headers: dict[str, str] | None = None) -> Callable[[float], bytes]:
        """Send one call to ``peer`` now; what reads its answer (given the time left). Its error
        answer comes back as the error it names, an unreachable or silent peer as ShardUnavailable
        / DeadlineExceeded. A kept-alive connection the peer had closed is reopened once (every
        call here may be repeated: a replica skips the records it holds)."""
        parts = urlsplit(url)
        base = f"{parts.scheme}://{parts.netloc}"
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        every = {**self._headers, **(headers or {})}
        tracing.inject(every)  # the primary's span, when tracing is on

        def send() -> http.client.HTTPConnection:
            connection = self._connection(base, timeout_s)
            connection.request(method, target, body=body, headers=every)
            return connection

        def failed(exc: BaseException, waited_s: float) -> Exception:
            self._drop(base)
            if isinstance(exc, TimeoutError):
                return DeadlineExceeded(f"{peer} did not answer in {waited_s:.1f} s")
            return ShardUnavailable(f"{peer} unreachable: {type(exc).__name__}")

        try:
            connection = send()
        except (OSError, http.client.HTTPException):
            self._drop(base)
            try:
                connection = send()
            except (OSError, http.client.HTTPException) as again:
                raise failed(again, timeout_s) from again

        def answer(remaining_s: float) -> bytes:
            nonlocal connection
            for attempt in (1, 2):
                try:
                    if connection.sock is not None:
                        connection.sock.settimeout(max(remaining_s, 0.001))
                    response = connection.getresponse()
                    content = response.read()
                except TimeoutError as exc:
                    raise failed(exc, remaining_s) from exc
                except (OSError, http.client.HTTPException) as exc:
                    if attempt == 2:
                        raise failed(exc, remaining_s) from exc
                    self._drop(base)  # the peer had closed the kept-alive connection: once more
                    try:
                        connection = send()
                    except (OSError, http.client.HTTPException) as again:
                        raise failed(again, remaining_s) from again
                    continue
                if response.status != 200:
                    raise error_for_status(response.status, content, peer=peer)
                return content
            raise AssertionError("unreachable")

        return answer

    def _request(self, method: str, url: str, peer: str, timeout_s: float, body: bytes | None = None,
                 headers: dict[str, str] | None = None) -> bytes:
        return self._start(method, url, peer, timeout_s, body, headers)(timeout_s)

    def replicate(self, peer: str, version: str, term: int, prev: Mark | None, payload: bytes,
                  timeout_s: float) -> int:
        return self.send(peer, version, term, prev, payload, timeout_s)(timeout_s)

    def send(self, peer: str, version: str, term: int, prev: Mark | None, payload: bytes,
             timeout_s: float) -> Callable[[float], int]:
        import orjson

        answer = self._start("POST", f"{peer}/v1/writes?version={quote(version, safe='')}", peer, timeout_s,
                             payload, {TERM_HEADER: str(term), PREV_HEADER: prev_header(prev),
                                       "content-type": "application/octet-stream"})
        return lambda remaining_s: int(orjson.loads(answer(remaining_s))["applied_seq"])

    def info(self, peer: str, timeout_s: float) -> ReplicaInfo:
        import orjson

        return ReplicaInfo.from_dict(orjson.loads(self._request("GET", f"{peer}/v1/info", peer, timeout_s)))

    def snapshot(self, peer: str, version: str, timeout_s: float) -> Snapshot:
        return Snapshot.decode(self._request("GET", f"{peer}/v1/snapshot?version={quote(version, safe='')}", peer,
                                             timeout_s))

    def restore(self, peer: str, version: str, term: int, snapshot: Snapshot, force: bool, timeout_s: float) -> int:
        import orjson

        answer = self._request("POST", f"{peer}/admin/restore?version={quote(version, safe='')}&force="
                               f"{str(force).lower()}", peer, timeout_s, snapshot.encode(),
                               {TERM_HEADER: str(term), "content-type": "application/octet-stream"})
        return int(orjson.loads(answer)["applied_seq"])

    def close(self) -> None:
        for connection in self._local.__dict__.get("connections", {}).values():
            connection.close()


class LocalPeers(PeerClient):
    """Replicas in this process, by name."""

    def __init__(self, replicas: dict[str, ShardVersions] | None = None) -> None:
        self.replicas = replicas if replicas is not None else {}

    def _of(self, peer: str) -> ShardVersions:
        found = self.replicas.get(peer)
        if found is None:
            raise ShardUnavailable(f"no replica {peer!r} in this process")
        return found

    def replicate(self, peer: str, version: str, term: int, prev: Mark | None, payload: bytes,
                  timeout_s: float) -> int:
        from index_shards.writes import accept

        return accept(self._of(peer), version, term, prev, decode_records(payload))

    def info(self, peer: str, timeout_s: float) -> ReplicaInfo:
        return self._of(peer).info()

    def snapshot(self, peer: str, version: str, timeout_s: float) -> Snapshot:
        from index_shards import snapshots

        return snapshots.take(self._of(peer), version)

    def restore(self, peer: str, version: str, term: int, snapshot: Snapshot, force: bool, timeout_s: float) -> int:
        from index_shards import snapshots

        return snapshots.restore_from(self._of(peer), version, term, snapshot, force=force)
