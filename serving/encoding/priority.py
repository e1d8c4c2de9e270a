"""Run a model load at a lower CPU priority than the live encodes next to it.

A new version's encoder loads on a side thread of a worker that keeps encoding live queries (and
on a small host, next to the gateway and the shard replicas). Loading is CPU work nobody waits on
yet, so it runs niced: Linux schedules threads individually, and a thread's nice value applies to
it alone. Threads the load starts (ONNX Runtime creates its intra-op pool with the session) inherit
the lowered priority; they serve live queries later, so they are put back when the load ends —
which needs the right to raise a priority (root, CAP_SYS_NICE or RLIMIT_NICE). Where that right is
missing nothing is lowered, rather than leaving the new version's encodes behind for good.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from functools import cache

LOAD_NICENESS = 10  # added to the loading thread's nice value (19 is the lowest priority)


def _threads() -> set[int]:
    return {int(name) for name in os.listdir("/proc/self/task")}


@cache
def can_restore_priority() -> bool:
    """Whether this process may raise a thread's priority back after lowering it (probed once, on a
    throwaway thread, so no thread that matters is ever left lowered)."""
    if not sys.platform.startswith("linux"):
        return False
    allowed: list[bool] = []

    def probe() -> None:
        tid = threading.get_native_id()
        base = os.getpriority(os.PRIO_PROCESS, tid)
        try:
            os.setpriority(os.PRIO_PROCESS, tid, min(base + 1, 19))
            os.setpriority(os.PRIO_PROCESS, tid, base)
            allowed.append(True)
        except OSError:
            allowed.append(False)

    thread = threading.Thread(target=probe, name="nice-probe")
    thread.start()
    thread.join()
    return bool(allowed and allowed[0])


@contextlib.contextmanager
def background_priority(niceness: int = LOAD_NICENESS) -> Iterator[bool]:
    """Lower the calling thread's priority for the block; every thread started inside is put back to
    the caller's priority at the end, and so is the caller. Yields whether anything was lowered."""
    if not can_restore_priority():
        yield False
        return
    tid = threading.get_native_id()
    base = os.getpriority(os.PRIO_PROCESS, tid)
    before = _threads()
    os.setpriority(os.PRIO_PROCESS, tid, min(base + niceness, 19))
    try:
        yield True
    finally:
        for thread in _threads() - before:
            with contextlib.suppress(OSError):  # a thread that has ended meanwhile
                if os.getpriority(os.PRIO_PROCESS, thread) != base:
                    os.setpriority(os.PRIO_PROCESS, thread, base)
        os.setpriority(os.PRIO_PROCESS, tid, base)
