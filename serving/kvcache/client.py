"""The generator's view of the KV cache: a local pool, then the kv-nodes.

Keys are placed on nodes by rendezvous hashing (each key goes to the node with the highest
hash(node, key)), so adding or losing a node moves only that node's keys. A lookup walks the
chain in the local pool first, then asks every node for its keys of the rest in one batched
request each (concurrently), and keeps the longest run of consecutive hits. New blocks go to
the local pool at once and to the nodes from a background thread, so writing back never
delays the first token. A node that cannot be reached is a miss, never an error; it is skipped
for ``retry_after_s`` and then tried again.
"""

from __future__ import annotations

import hashlib
import logging
import queue
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from httpkit import tracing
from httpkit.auth import internal_headers
from httpkit.tls import client_ssl_context
from serving.kvcache.blocks import BlockKey, pack_puts, unpack_blocks
from serving.kvcache.pool import BlockPool

logger = logging.getLogger(__name__)


def owner(key: bytes, nodes: Sequence[str]) -> str:
    """Rendezvous (highest random weight) hashing."""
    return max(nodes, key=lambda node: hashlib.blake2b(node.encode() + key, digest_size=8).digest())


@dataclass(slots=True)
class FetchResult:
    payloads: list[bytes]  # the longest cached prefix, first block first
    local_blocks: int
    remote_blocks: int
    remote_bytes: int = 0


@dataclass
class KVStats:
    lookups: int = 0
    local_hit_blocks: int = 0
    remote_hit_blocks: int = 0
    miss_blocks: int = 0
    bytes_fetched: int = 0
    bytes_written: int = 0
    node_errors: int = 0
    writes_dropped: int = 0
    per_node_errors: dict[str, int] = field(default_factory=dict)


class KVClient:
    def __init__(self, nodes: Sequence[str] = (), *, local_budget_bytes: int = 256 << 20, timeout_s: float = 2.0,
                 retry_after_s: float = 1.0, write_queue: int = 256) -> None:
        import httpx

        self.nodes = [n.rstrip("/") for n in nodes]
        self.local = BlockPool(local_budget_bytes)
        self.timeout_s = timeout_s
        self.retry_after_s = retry_after_s
        self.stats = KVStats()
        self._down_until: dict[str, float] = {}
        self._http = httpx.Client(timeout=timeout_s, limits=httpx.Limits(max_connections=32),
                                  headers=internal_headers(),
                                  verify=client_ssl_context())
        self._fetchers = ThreadPoolExecutor(max_workers=max(1, len(self.nodes)), thread_name_prefix="kv-fetch")
        self._writes: queue.Queue[list[tuple[bytes, bytes | None, bytes]] | None] = queue.Queue(write_queue)
        self._pending = 0  # batches queued or being sent
        self._idle = threading.Condition()
        self._writer = threading.Thread(target=self._write_loop, daemon=True, name="kv-writeback")
        self._writer.start()

    # -- node health ----------------------------------------------------------------------------
    def _available(self, node: str) -> bool:
        return time.monotonic() >= self._down_until.get(node, 0.0)

    def _failed(self, node: str, exc: Exception) -> None:
        self.stats.node_errors += 1
        self.stats.per_node_errors[node] = self.stats.per_node_errors.get(node, 0) + 1
        self._down_until[node] = time.monotonic() + self.retry_after_s
        logger.warning("kv-node %s unavailable (%s): treated as a miss for %.1f s", node, exc, self.retry_after_s)

    # -- lookups --------------------------------------------------------------------------------
    def fetch_prefix(self, keys: Sequence[BlockKey]) -> FetchResult:
        self.stats.lookups += 1
        payloads = self.local.prefix(list(keys))
        local = len(payloads)
        remote: list[bytes] = []
        moved = 0
        rest = list(keys[local:])
        if rest and self.nodes:
            remote, moved = self._remote_prefix(rest)
            for offset, payload in enumerate(remote):  # warm the local tier with what came over
                index = local + offset
                self.local.put(keys[index], payload, keys[index - 1] if index else None)
        self.stats.local_hit_blocks += local
        self.stats.remote_hit_blocks += len(remote)
        self.stats.miss_blocks += len(keys) - local - len(remote)
        self.stats.bytes_fetched += moved
        return FetchResult(payloads + remote, local, len(remote), moved)

    def fetch_many(self, keys: Sequence[BlockKey]) -> tuple[dict[BlockKey, bytes], set[BlockKey]]:
        """Whichever of ``keys`` are cached, in any tier (not a chain: each key stands alone), and
        the set of those that came from a kv-node. Remote payloads are not put in the local pool
        here: the caller validates them first (``store`` then warms the local tier)."""
        self.stats.lookups += 1
        found: dict[BlockKey, bytes] = {}
        for key in keys:
            payload = self.local.get(key)
            if payload is not None:
                found[key] = payload
        local = len(found)
        rest = [key for key in keys if key not in found]
        remote: set[BlockKey] = set()
        if rest and self.nodes:
            fetched, moved = self._remote_any(rest)
            found.update(fetched)
            remote = set(fetched)
            self.stats.bytes_fetched += moved
        self.stats.local_hit_blocks += local
        self.stats.remote_hit_blocks += len(remote)
        self.stats.miss_blocks += len(keys) - len(found)
        return found, remote

    def _remote_any(self, keys: list[BlockKey]) -> tuple[dict[BlockKey, bytes], int]:
        by_node: dict[str, list[BlockKey]] = {}
        for key in keys:
            by_node.setdefault(owner(key, self.nodes), []).append(key)
        asked = {node: wanted for node, wanted in by_node.items() if self._available(node)}
        carrier = {"content-type": "application/octet-stream"}
        tracing.inject(carrier)  # the generation's span, from this thread: the fetching threads have none
        futures = {node: self._fetchers.submit(self._get, node, wanted, carrier) for node, wanted in asked.items()}
        found: dict[BlockKey, bytes] = {}
        moved = 0
        for node, future in futures.items():
            try:
                body = future.result()
                blocks = unpack_blocks(body)
            except Exception as exc:  # noqa: BLE001 - a dead node (or a garbled answer) is a miss
                self._failed(node, exc)
                continue
            moved += len(body)
            found.update(blocks)
        return found, moved

    def _remote_prefix(self, keys: list[BlockKey]) -> tuple[list[bytes], int]:
        found, moved = self._remote_any(keys)
        prefix = []
        for key in keys:
            payload = found.get(key)
            if payload is None:
                break
            prefix.append(payload)
        return prefix, moved

    def _get(self, node: str, keys: list[BlockKey], headers: dict[str, str]) -> bytes:
        response = self._http.post(f"{node}/v1/blocks/get", content=b"".join(keys), headers=headers)
        response.raise_for_status()
        return response.content

    # -- write-back -----------------------------------------------------------------------------
    def store(self, blocks: Sequence[tuple[BlockKey, BlockKey | None, bytes]]) -> None:
        """(key, parent, payload): into the local pool now, to the nodes in the background."""
        for key, parent, payload in blocks:
            self.local.put(key, payload, parent)
        if self.nodes and blocks:
            with self._idle:
                self._pending += 1
            try:
                self._writes.put_nowait(list(blocks))
            except queue.Full:
                self.stats.writes_dropped += len(blocks)  # never block generation on the cache
                self._done_one()

    def _done_one(self) -> None:
        with self._idle:
            self._pending -= 1
            self._idle.notify_all()

    def _write_loop(self) -> None:
        while True:
            batch = self._writes.get()
            if batch is None:
                return
            try:
                self._send(batch)
            finally:
                self._done_one()

    def _send(self, batch: list[tuple[bytes, bytes | None, bytes]]) -> None:
        by_node: dict[str, list[tuple[bytes, bytes | None, bytes]]] = {}
        for block in batch:
            by_node.setdefault(owner(block[0], self.nodes), []).append(block)
        for node, blocks in by_node.items():
            if not self._available(node):
                continue
            body = pack_puts(blocks)
            try:
                self._http.post(f"{node}/v1/blocks/put", content=body,
                                headers={"content-type": "application/octet-stream"}).raise_for_status()
                self.stats.bytes_written += len(body)
            except Exception as exc:  # noqa: BLE001 - the cache is best effort
                self._failed(node, exc)

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until every queued write-back has been sent (tests, benchmarks, shutdown)."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout=timeout_s)

    def close(self) -> None:
        self._writes.put(None)
        self._writer.join(timeout=5)
        self._fetchers.shutdown(wait=False)
        self._http.close()
