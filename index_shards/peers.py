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

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING
from urllib.parse import quote

import httpx

from httpkit.auth import internal_headers
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
    def __init__(self) -> None:
        self._client = httpx.Client(headers=internal_headers(), timeout=10.0)

    def _request(self, method: str, url: str, peer: str, timeout_s: float, body: bytes | None = None,
                 headers: dict[str, str] | None = None) -> bytes:
        """One call to ``peer``; its error answer comes back as the error it names, an unreachable
        or silent peer as ShardUnavailable / DeadlineExceeded."""
        try:
            response = self._client.request(method, url, content=body, headers=headers, timeout=timeout_s)
        except httpx.TimeoutException as exc:
            raise DeadlineExceeded(f"{peer} did not answer in {timeout_s:.1f} s") from exc
        except httpx.HTTPError as exc:
            raise ShardUnavailable(f"{peer} unreachable: {type(exc).__name__}") from exc
        if response.status_code != 200:
            raise error_for_status(response.status_code, response.content, peer=peer)
        return response.content

    def replicate(self, peer: str, version: str, term: int, prev: Mark | None, payload: bytes,
                  timeout_s: float) -> int:
        import orjson

        answer = self._request("POST", f"{peer}/v1/writes?version={quote(version, safe='')}", peer, timeout_s,
                               payload, {TERM_HEADER: str(term), PREV_HEADER: prev_header(prev),
                                         "content-type": "application/octet-stream"})
        return int(orjson.loads(answer)["applied_seq"])

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
        self._client.close()


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
