"""The cluster state in a real etcd cluster, through etcd's gRPC-JSON gateway (``/v3/...``) with
httpx.

Why the JSON gateway and httpx rather than a gRPC client library: every etcd since 3.3 serves it
on the client port, httpx is already a dependency (no grpcio and protobuf stubs to keep in step
with the server), and shardrag uses a handful of calls — range, a compare-and-swap transaction,
delete, and leases — all control-plane and rare (never per write).

Several endpoints (the members of an etcd cluster) are tried in turn: a member that is down, cut
off or without quorum answers an error or nothing within ``timeout_s``, and the call moves on to
the next one, round after round for up to ``retry_s`` (a leader election takes about a second),
so the cluster state stays reachable while a minority of members is lost. When no member
answers, :class:`~retrieval.errors.CoordinatorUnavailable`. A compare-and-swap whose answer was
lost may have been applied: callers of ``put(..., expect_revision=...)`` re-read and recognise
their own change (``ClusterState.update_shard`` does).

    kv = EtcdKV(["http://10.0.0.5:2379", "http://10.0.0.6:2379", "http://10.0.0.7:2379"])
"""

from __future__ import annotations

import base64
import logging
import math
import threading
import time
from collections.abc import Sequence
from typing import Any

import httpx

from clusterstate.kv import KV, Entry, LeaseExpired
from retrieval.errors import ConfigError, CoordinatorUnavailable

logger = logging.getLogger(__name__)


def _b64(data: bytes | str) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def _range_end(prefix: str) -> str:
    """The key just past every key that starts with ``prefix`` (etcd's prefix range)."""
    raw = bytearray(prefix.encode())
    for index in range(len(raw) - 1, -1, -1):
        if raw[index] < 0xFF:
            raw[index] += 1
            return _b64(bytes(raw[:index + 1]))
    return _b64(b"\0")


class EtcdKV(KV):
    def __init__(self, endpoints: Sequence[str], *, timeout_s: float = 2.0, retry_s: float = 5.0) -> None:
        if not endpoints:
            raise ConfigError("give at least one etcd endpoint", field="coordinator")
        self.endpoints = [e.rstrip("/") for e in endpoints]
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self._client = httpx.Client(timeout=timeout_s)
        self._preferred = 0  # the endpoint that answered last: asked first next time
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"EtcdKV({self.endpoints!r})"

    def _call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        errors: list[str] = []
        count = len(self.endpoints)
        give_up = time.monotonic() + self.retry_s
        attempt = 0
        while True:
            if attempt and attempt % count == 0:
                if time.monotonic() >= give_up:
                    break
                time.sleep(0.1)
                errors = []
            index = (self._preferred + attempt) % count
            attempt += 1
            endpoint = self.endpoints[index]
            try:
                response = self._client.post(f"{endpoint}{path}", json=body)
            except httpx.HTTPError as exc:
                errors.append(f"{endpoint}: {type(exc).__name__}")
                continue
            try:
                payload: dict[str, Any] = response.json()
            except ValueError:
                payload = {}
            if response.status_code == 200 and "error" not in payload:
                self._preferred = index
                return payload
            message = str(payload.get("message") or payload.get("error") or response.text[:200])
            if "lease not found" in message:
                raise LeaseExpired(f"etcd: {message}", field="lease")
            errors.append(f"{endpoint}: {response.status_code} {message}")
        raise CoordinatorUnavailable(f"no etcd member answered {path}: {'; '.join(errors)}", field="coordinator")

    @staticmethod
    def _entry(kv: dict[str, Any]) -> Entry:
        return Entry(base64.b64decode(kv["key"]).decode(), base64.b64decode(kv.get("value", "")),
                     int(kv.get("mod_revision", 0)), int(kv.get("lease", 0)))

    def get(self, key: str) -> Entry | None:
        found = self._call("/v3/kv/range", {"key": _b64(key)}).get("kvs") or []
        return self._entry(found[0]) if found else None

    def prefix(self, prefix: str) -> list[Entry]:
        found = self._call("/v3/kv/range", {"key": _b64(prefix), "range_end": _range_end(prefix)}).get("kvs") or []
        return [self._entry(kv) for kv in found]

    def put(self, key: str, value: bytes, *, expect_revision: int | None = None, lease: int = 0) -> int | None:
        request: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease:
            request["lease"] = str(lease)
        if expect_revision is None:
            answer = self._call("/v3/kv/put", request)
            return int(answer["header"]["revision"])
        answer = self._call("/v3/kv/txn", {
            "compare": [{"key": _b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": str(expect_revision)}],
            "success": [{"request_put": request}]})
        return int(answer["header"]["revision"]) if answer.get("succeeded") else None

    def delete(self, key: str, *, expect_revision: int | None = None) -> bool:
        request = {"key": _b64(key)}
        if expect_revision is None:
            return int(self._call("/v3/kv/deleterange", request).get("deleted", 0)) > 0
        answer = self._call("/v3/kv/txn", {
            "compare": [{"key": _b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": str(expect_revision)}],
            "success": [{"request_delete_range": request}]})
        if not answer.get("succeeded"):
            return False
        responses = answer.get("responses") or [{}]
        return int(responses[0].get("response_delete_range", {}).get("deleted", 0)) > 0

    def grant(self, ttl_s: float) -> int:
        answer = self._call("/v3/lease/grant", {"TTL": str(max(1, math.ceil(ttl_s)))})
        return int(answer["ID"])

    def keepalive(self, lease: int) -> float:
        answer = self._call("/v3/lease/keepalive", {"ID": str(lease)})
        ttl = int((answer.get("result") or {}).get("TTL", 0))
        if ttl <= 0:
            raise LeaseExpired(f"lease {lease} has expired", field="lease")
        return float(ttl)

    def revoke(self, lease: int) -> None:
        try:
            self._call("/v3/lease/revoke", {"ID": str(lease)})
        except LeaseExpired:
            pass

    def revision(self) -> int:
        answer = self._call("/v3/kv/range", {"key": _b64("/"), "count_only": True})
        return int(answer["header"]["revision"])

    def close(self) -> None:
        with self._lock:
            self._client.close()
