"""The local coordinator: the cluster state of one machine in one file, behind the same
:class:`~clusterstate.kv.KV` seam as etcd.

Every process of a local cluster (the gateway, each shard server) opens the same file. A change
takes an exclusive ``flock`` on ``<file>.lock``, reads the file and writes it back crash-safely
(temp file, fsync, rename, directory fsync), so a put is durable when it returns and two
processes never interleave a read-modify-write. A read takes no lock: the rename makes it see the
state before a change or after it, and it parses the file again only when it changed. Leases expire by the wall clock,
which every process on the machine shares; a lapsed lease's keys are dropped at the next change
and hidden from reads before that.

The file is small (the collection's layout, rollout state, per shard its primary and in-sync set,
the live processes) and changes only on control-plane events; writes never touch it.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import secrets
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from clusterstate.kv import KV, Entry, LeaseExpired
from retrieval.atomic import atomic_write_bytes
from retrieval.errors import CoordinatorUnavailable

T = TypeVar("T")
LOCAL_STATE_FILE = "cluster-state.json"  # the local coordinator's file, in a collection's folder


class LocalKV(KV):
    def __init__(self, path: str | Path, *, clock: Callable[[], float] = time.time, private: bool = False) -> None:
        self.path = Path(path)
        # private: the folder is this process's own scratch (a lone gateway's state), removed on close
        self._private = private
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock_path = self.path.with_name(self.path.name + ".lock")
        self._clock = clock
        self._cache: tuple[tuple[int, int, int, int], dict[str, Any]] | None = None

    def __repr__(self) -> str:
        return f"LocalKV({str(self.path)!r})"

    def close(self) -> None:
        if self._private:
            shutil.rmtree(self.path.parent, ignore_errors=True)

    # -- the file ----------------------------------------------------------------------------
    @contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            handle = open(self._lock_path, "a+")  # noqa: SIM115 - closed below
        except OSError as exc:
            raise CoordinatorUnavailable(f"the local coordinator {self.path} cannot be opened: {exc}") from exc
        try:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield
        finally:
            handle.close()  # releases the lock

    def _read(self) -> dict[str, Any]:
        return self._load()[1]

    def _load(self) -> tuple[tuple[int, int, int, int] | None, dict[str, Any]]:
        """(the file's stamp, its state), both of one version of the file (read through one open
        descriptor: a change renames a new file over it and never writes into this one)."""
        try:
            with open(self.path, "rb") as handle:
                status = os.fstat(handle.fileno())
                data = json.loads(handle.read())
        except FileNotFoundError:
            return None, {"revision": 0, "leases": {}, "keys": {}}
        except (OSError, ValueError) as exc:
            raise CoordinatorUnavailable(f"the local coordinator {self.path} is unreadable: {exc}") from exc
        return (status.st_ino, status.st_mtime_ns, status.st_ctime_ns, status.st_size), dict(data)

    def _read_shared(self) -> dict[str, Any]:
        """The state for a read that changes nothing: parsed again only when the file changed, and
        without the lock. Every change replaces the file by a rename (a new inode, new times), so an
        unchanged (inode, mtime, ctime, size) is an unchanged state, and a read sees either the
        state before a change or after it, never a part — many replicas polling their shard's
        record every tick neither parse the file each time nor queue on the lock behind each
        other's reads and the writers. Never mutated."""
        try:
            status = os.stat(self.path)
        except FileNotFoundError:
            return {"revision": 0, "leases": {}, "keys": {}}
        except OSError as exc:
            raise CoordinatorUnavailable(f"the local coordinator {self.path} is unreadable: {exc}") from exc
        stamp = (status.st_ino, status.st_mtime_ns, status.st_ctime_ns, status.st_size)
        cached = self._cache
        if cached is not None and cached[0] == stamp:
            return cached[1]
        loaded, state = self._load()  # may be a newer version than ``stamp``: cached under its own
        if loaded is not None:
            self._cache = (loaded, state)
        return state

    def _write(self, state: dict[str, Any]) -> None:
        atomic_write_bytes(self.path, json.dumps(state, separators=(",", ":")).encode())

    def _live(self, state: dict[str, Any], item: dict[str, Any]) -> bool:
        lease = int(item.get("lease", 0))
        if not lease:
            return True
        expires = state["leases"].get(str(lease))
        return expires is not None and float(expires) > self._clock()

    def _change(self, change: Callable[[dict[str, Any]], T]) -> T:
        """Run ``change`` on the state under the lock; written back (lapsed leases dropped) when it
        bumped the revision or touched a lease."""
        with self._locked():
            state = self._read()
            before = json.dumps(state, sort_keys=True)
            result = change(state)
            now = self._clock()
            lapsed = {lease for lease, expires in state["leases"].items() if float(expires) <= now}
            if lapsed:
                for lease in lapsed:
                    del state["leases"][lease]
                    state.get("ttls", {}).pop(lease, None)
                gone = [key for key, item in state["keys"].items() if str(item.get("lease", 0)) in lapsed]
                if gone:
                    state["revision"] += 1
                    for key in gone:
                        del state["keys"][key]
            if json.dumps(state, sort_keys=True) != before:
                self._write(state)
                self._cache = None  # this process reads its own writes from the file
            return result

    def _entry(self, key: str, item: dict[str, Any]) -> Entry:
        return Entry(key, base64.b64decode(item["v"]), int(item["rev"]), int(item.get("lease", 0)))

    # -- the seam ----------------------------------------------------------------------------
    def get(self, key: str) -> Entry | None:
        state = self._read_shared()
        item = state["keys"].get(key)
        return self._entry(key, item) if item is not None and self._live(state, item) else None

    def prefix(self, prefix: str) -> list[Entry]:
        state = self._read_shared()
        return [self._entry(key, item) for key, item in sorted(state["keys"].items())
                if key.startswith(prefix) and self._live(state, item)]

    def put(self, key: str, value: bytes, *, expect_revision: int | None = None, lease: int = 0) -> int | None:
        def change(state: dict[str, Any]) -> int | None:
            item = state["keys"].get(key)
            current = int(item["rev"]) if item is not None and self._live(state, item) else 0
            if expect_revision is not None and current != expect_revision:
                return None
            expires = state["leases"].get(str(lease)) if lease else None
            if lease and (expires is None or float(expires) <= self._clock()):  # lapsed, if not yet dropped
                raise LeaseExpired(f"lease {lease} has expired", field="lease")
            state["revision"] += 1
            state["keys"][key] = {"v": base64.b64encode(value).decode(), "rev": state["revision"], "lease": lease}
            return int(state["revision"])

        return self._change(change)

    def delete(self, key: str, *, expect_revision: int | None = None) -> bool:
        def change(state: dict[str, Any]) -> bool:
            item = state["keys"].get(key)
            if item is None or not self._live(state, item):
                return False
            if expect_revision is not None and int(item["rev"]) != expect_revision:
                return False
            del state["keys"][key]
            state["revision"] += 1
            return True

        return self._change(change)

    def grant(self, ttl_s: float) -> int:
        lease = secrets.randbelow(2**62) + 1

        def change(state: dict[str, Any]) -> int:
            state["leases"][str(lease)] = self._clock() + ttl_s
            state.setdefault("ttls", {})[str(lease)] = ttl_s
            return lease

        return self._change(change)

    def keepalive(self, lease: int) -> float:
        def change(state: dict[str, Any]) -> float:
            expires = state["leases"].get(str(lease))
            if expires is None or float(expires) <= self._clock():
                raise LeaseExpired(f"lease {lease} has expired", field="lease")
            ttl = float(state.get("ttls", {}).get(str(lease), 0.0))
            state["leases"][str(lease)] = self._clock() + ttl
            return ttl

        return self._change(change)

    def revoke(self, lease: int) -> None:
        def change(state: dict[str, Any]) -> None:
            state["leases"][str(lease)] = 0.0  # lapsed: dropped with its keys by _change
            state.get("ttls", {}).pop(str(lease), None)

        self._change(change)

    def revision(self) -> int:
        state = self._read_shared()
        now = self._clock()
        # a lease that lapsed since the last change hides its keys: a change readers must see
        lapsed = sum(1 for expires in state["leases"].values() if float(expires) <= now)
        return int(state["revision"]) + lapsed
