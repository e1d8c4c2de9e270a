"""A model load runs niced, and the threads it starts get their priority back when it ends."""

from __future__ import annotations

import os
import threading

from serving.encoding.priority import LOAD_NICENESS, background_priority, can_restore_priority


def _nice(tid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, tid)


def test_a_load_is_niced_and_what_it_started_is_put_back():
    seen: dict[str, object] = {}

    def load() -> None:  # on its own thread, as the worker's loads are: pytest's thread keeps its priority
        me = threading.get_native_id()
        base = _nice(me)
        release, started = threading.Event(), threading.Event()
        pool_thread: list[int] = []

        def pool() -> None:  # what ONNX Runtime's session creation does: start threads that outlive the load
            pool_thread.append(threading.get_native_id())
            started.set()
            release.wait(10)

        with background_priority() as lowered:
            seen["lowered"] = lowered
            seen["inside"] = _nice(me)
            worker = threading.Thread(target=pool)
            worker.start()
            started.wait(10)
            seen["started_inside"] = _nice(pool_thread[0])
        seen["after"] = _nice(me)
        seen["started_after"] = _nice(pool_thread[0])
        seen["base"] = base
        release.set()
        worker.join()

    thread = threading.Thread(target=load)
    thread.start()
    thread.join()
    base = seen["base"]
    assert isinstance(base, int)
    assert seen["lowered"] == can_restore_priority()
    if seen["lowered"]:
        assert seen["inside"] == seen["started_inside"] == min(base + LOAD_NICENESS, 19)
    else:  # without the right to raise a priority back nothing is lowered at all
        assert seen["inside"] == seen["started_inside"] == base
    assert seen["after"] == seen["started_after"] == base
