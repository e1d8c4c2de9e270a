"""One process at a time: an exclusive lock on a directory (a replica's data dir, a collection's
state), held for as long as the process runs.

The lock is ``fcntl.flock`` on a ``.lock`` file inside the directory, so the kernel releases it
when the holder exits however it dies (SIGKILL included) — no stale lock files to clean up. The
holder writes who it is (pid, command line, host, start time) into the file; a second process
that finds the lock taken is refused with :class:`~retrieval.errors.HeldElsewhere` naming it:

    with DirLock(data_dir, "replica data dir"):
        ...   # this process alone appends to the WAL under data_dir

Locks are per open file, so a second lock on the same directory from the same process is refused
too (two embedded stores over one data dir).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

from retrieval.errors import HeldElsewhere

LOCK_FILE = ".lock"


def describe_holder(holder: dict[str, Any]) -> str:
    """``pid 4242 (python -m index_shards serve ...) on host-a since 2026-12-03 10:00:00``."""
    if not holder:
        return "another process (it has not said who it is yet)"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(holder.get("since", 0))))
    command = str(holder.get("command", ""))
    if len(command) > 160:
        command = command[:157] + "..."
    return f"pid {holder.get('pid')} ({command}) on {holder.get('host')} since {since}"


class DirLock:
    def __init__(self, directory: str | Path, what: str) -> None:
        """``what`` names the directory in the refusal: "replica data dir", "collection state"."""
        self.directory = Path(directory)
        self.what = what
        self.path = self.directory / LOCK_FILE
        self._handle: TextIO | None = None

    def acquire(self) -> DirLock:
        """Take the lock or raise HeldElsewhere naming the holder."""
        self.directory.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+")  # noqa: SIM115 - held for the life of the lock
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = _parse(handle.read())
            handle.close()
            raise HeldElsewhere(f"{self.what} {self.directory} is in use by {describe_holder(holder)}; stop that "
                                "process first (two processes writing one directory would corrupt it)",
                                field="data_dir") from None
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps({"pid": os.getpid(), "command": " ".join(sys.argv), "host": socket.gethostname(),
                                 "since": time.time()}))
        handle.flush()
        self._handle = handle
        return self

    @property
    def held(self) -> bool:
        return self._handle is not None

    def release(self) -> None:
        if self._handle is not None:
            fcntl.flock(self._handle, fcntl.LOCK_UN)
            self._handle.close()
            self._handle = None

    def __enter__(self) -> DirLock:
        return self.acquire()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.release()


def _parse(text: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}
