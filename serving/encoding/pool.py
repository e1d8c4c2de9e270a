"""The gateway's encoder worker processes.

Each worker is ``python -m serving.encoding.worker`` with a reader thread in the gateway that
turns its reply frames into resolved futures on the event loop. A batch goes to the least busy
worker that holds the version's model. When a worker dies (kill -9, OOM), its in-flight batches
fail with :class:`WorkerLost`, which :meth:`EncoderPool.encode` retries on another worker — or
on this one once it is back — until the caller's deadline; the pool restarts it (with backoff
when it keeps dying) and reloads every registered model into it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from retrieval.errors import DeadlineExceeded, EncoderError
from retrieval.types import EmbeddingVersion
from serving.encoding.protocol import read_frame, write_frame
from serving.encoding.settings import EncoderSettings

logger = logging.getLogger(__name__)

_INLINE_FRAME_BYTES = 16 << 10  # larger requests are written from a thread: a full pipe must not block the loop
_RESTART_BACKOFF_S = (0.0, 1.0, 2.0, 5.0, 10.0, 30.0)
_STABLE_S = 60.0  # a worker that lived this long resets the backoff


class WorkerLost(EncoderError):
    """The encoder worker running a batch exited before answering (retried by the pool)."""


@dataclass(slots=True)
class _Worker:
    index: int
    process: subprocess.Popen[bytes]
    started_at: float
    loop: asyncio.AbstractEventLoop
    ready: dict[str, EmbeddingVersion] = field(default_factory=dict)
    loading: dict[str, asyncio.Future[EmbeddingVersion]] = field(default_factory=dict)
    inflight: dict[int, asyncio.Future[np.ndarray]] = field(default_factory=dict)
    write_lock: threading.Lock = field(default_factory=threading.Lock)
    alive: bool = True

    @property
    def pid(self) -> int:
        return self.process.pid

    def send(self, message: tuple[Any, ...], size_hint: int = 0) -> None:
        stdin = self.process.stdin
        assert stdin is not None
        if size_hint < _INLINE_FRAME_BYTES:
            with self.write_lock:
                write_frame(stdin, message)
        else:
            threading.Thread(target=self._send_locked, args=(message,), daemon=True).start()

    def _send_locked(self, message: tuple[Any, ...]) -> None:
        stdin = self.process.stdin
        assert stdin is not None
        try:
            with self.write_lock:
                write_frame(stdin, message)
        except (BrokenPipeError, ValueError, OSError):
            pass  # the worker is gone: its reader thread reports that


class EncoderPool:
    def __init__(self, settings: EncoderSettings, *, python: str = sys.executable) -> None:
        self.settings = settings
        count = settings.worker_count()
        self._argv = [python, "-m", "serving.encoding.worker", "--device", settings.device,
                      "--threads", str(settings.threads_per_worker()), "--runtime", settings.runtime]
        self._models: dict[str, str] = {}  # key (version id) → model ("default" or a checkpoint dir)
        self._holders: dict[str, int] = {}  # key → encoders that use it (serving.encoding.backends.PoolBackend)
        self._workers: list[_Worker | None] = [None] * count
        self._restarts = [0] * count
        self._failures = [0] * count  # quick deaths in a row (backoff)
        self._exit_codes: list[int | None] = [None] * count
        self._req_ids = itertools.count(1)
        self._changed: asyncio.Event | None = None
        self._closed = False
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def parallelism(self) -> int:
        return len(self._workers)

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        """Spawn the workers (in the running loop); models load as they are registered."""
        self._changed = asyncio.Event()
        for index in range(len(self._workers)):
            if self._workers[index] is None:
                self._spawn(index)

    def _spawn(self, index: int) -> None:
        loop = asyncio.get_running_loop()
        # The launcher gives the gateway OMP_NUM_THREADS=1 (meant for FAISS); a worker's OpenMP
        # pool is sized for its own share of the cores.
        env = {**os.environ, "OMP_NUM_THREADS": self._argv[self._argv.index("--threads") + 1]}
        process = subprocess.Popen(self._argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        worker = _Worker(index, process, time.monotonic(), loop)
        self._workers[index] = worker
        threading.Thread(target=self._read, args=(worker,), name=f"encoder-reader-{index}", daemon=True).start()
        for key, model in self._models.items():
            self._request_load(worker, key, model)
        logger.info("encoder worker %d started (pid %d)", index, process.pid)

    def _read(self, worker: _Worker) -> None:
        """The reader thread: every reply to the loop, then the exit."""
        stdout = worker.process.stdout
        assert stdout is not None
        try:
            while (message := read_frame(stdout)) is not None:
                worker.loop.call_soon_threadsafe(self._deliver, worker, message)
        except (ValueError, OSError, EOFError) as exc:
            logger.error("encoder worker %d: unreadable reply (%s); restarting it", worker.index, exc)
            worker.process.kill()
        code = worker.process.wait()
        try:
            worker.loop.call_soon_threadsafe(self._on_exit, worker, code)
        except RuntimeError:
            pass  # the loop is closed: the gateway is gone

    def _deliver(self, worker: _Worker, message: tuple[Any, ...]) -> None:
        if message[0] == "vectors":
            _, req_id, vectors, error = message
            future = worker.inflight.pop(req_id, None)
            if future is None or future.done():
                return
            if error is not None:
                future.set_exception(EncoderError(f"encoder worker {worker.index}: {error}", field="text"))
            else:
                future.set_result(vectors)
        elif message[0] == "loaded":
            _, key, version, error = message
            loading = worker.loading.pop(key, None)
            if error is None and key in self._models:
                worker.ready[key] = EmbeddingVersion.from_dict(version)
            if loading is not None and not loading.done():
                if error is None:
                    loading.set_result(EmbeddingVersion.from_dict(version))
                else:
                    loading.set_exception(EncoderError(error, field="model"))
            self._notify()

    def _on_exit(self, worker: _Worker, code: int) -> None:
        worker.alive = False
        lost = WorkerLost(f"encoder worker {worker.index} (pid {worker.pid}) exited with code {code}")
        futures: list[asyncio.Future[Any]] = [*worker.inflight.values(), *worker.loading.values()]
        for future in futures:
            if not future.done():
                future.set_exception(lost)
                future.add_done_callback(_retrieve)
        worker.inflight.clear()
        worker.loading.clear()
        self._exit_codes[worker.index] = code
        self._notify()
        if self._closed or self._workers[worker.index] is not worker:
            return
        lived = time.monotonic() - worker.started_at
        self._failures[worker.index] = 0 if lived > _STABLE_S else self._failures[worker.index] + 1
        delay = _RESTART_BACKOFF_S[min(self._failures[worker.index], len(_RESTART_BACKOFF_S) - 1)]
        logger.warning("encoder worker %d (pid %d) exited with code %d after %.1f s; restarting in %.0f s",
                       worker.index, worker.pid, code, lived, delay)
        task = asyncio.ensure_future(self._restart(worker.index, delay))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _restart(self, index: int, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        if not self._closed:
            self._restarts[index] += 1
            self._spawn(index)

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = asyncio.Event()

    def close(self) -> None:
        self._closed = True
        for task in self._tasks:
            task.cancel()
        workers = [w for w in self._workers if w is not None]
        for worker in workers:
            try:
                if worker.process.stdin is not None:
                    worker.process.stdin.close()  # the worker exits at end of input
            except OSError:
                pass
        deadline = time.monotonic() + 3.0
        for worker in workers:
            try:
                worker.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait()

    # -- models ----------------------------------------------------------------------------------
    def _request_load(self, worker: _Worker, key: str, model: str) -> asyncio.Future[EmbeddingVersion]:
        future = worker.loading.get(key)
        if future is None:
            future = worker.loop.create_future()
            worker.loading[key] = future
            try:
                worker.send(("load", key, model))
            except (BrokenPipeError, OSError):
                pass  # the reader thread reports the exit and fails the future
        return future

    async def load(self, key: str, model: str) -> EmbeddingVersion:
        """Load ``model`` as ``key`` into every worker (and every worker started later), one worker
        at a time: the others keep serving at full speed, and a worker that is loading gets no
        batches while another can take them. Returns the version once one worker has it; raises
        when every live worker failed to load it."""
        self._models[key] = model
        first: asyncio.Future[EmbeddingVersion] = asyncio.get_running_loop().create_future()
        task = asyncio.ensure_future(self._load_one_by_one(key, model, first))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return await first

    async def _load_one_by_one(self, key: str, model: str, first: asyncio.Future[EmbeddingVersion]) -> None:
        errors: list[str] = []
        for worker in self._live():
            if key not in self._models:
                break  # unloaded meanwhile
            try:
                version = await self._request_load(worker, key, model)
            except EncoderError as exc:
                errors.append(exc.message)
                continue
            if not first.done():
                first.set_result(version)
        if not first.done():
            first.set_exception(EncoderError(
                f"no encoder worker could load {model}: {'; '.join(errors) or 'no worker alive'}", field="model"))

    def hold(self, key: str) -> None:
        """One more encoder uses ``key``: it stays loaded until every holder released it."""
        self._holders[key] = self._holders.get(key, 0) + 1

    def release(self, key: str) -> None:
        """A holder of ``key`` is done with it; the last one unloads it from every worker."""
        left = self._holders.get(key, 0) - 1
        if left > 0:
            self._holders[key] = left
            return
        self._holders.pop(key, None)
        self.unload(key)

    def unload(self, key: str) -> None:
        self._models.pop(key, None)
        for worker in self._live():
            worker.ready.pop(key, None)
            try:
                worker.send(("unload", key))
            except (BrokenPipeError, OSError):
                pass

    def _live(self) -> list[_Worker]:
        return [w for w in self._workers if w is not None and w.alive]

    # -- encoding --------------------------------------------------------------------------------
    async def encode(self, key: str, kind: str, texts: Sequence[str], deadline: float) -> np.ndarray:
        """Vectors of ``texts`` (kind "query" or "document") by ``key``'s model; ``deadline`` is a
        ``time.monotonic()`` instant. Survives a worker dying under the batch."""
        size = sum(len(t) for t in texts)
        while True:
            candidates = [w for w in self._live() if key in w.ready]
            if not candidates:
                await self._wait_for_change(key, deadline)
                continue
            # a worker loading another model shares its CPU and interpreter with that load
            worker = min(candidates, key=lambda w: (bool(w.loading), len(w.inflight)))
            req_id = next(self._req_ids)
            future: asyncio.Future[np.ndarray] = worker.loop.create_future()
            worker.inflight[req_id] = future
            try:
                worker.send(("encode", req_id, key, kind, list(texts)), size)
            except (BrokenPipeError, OSError):
                pass  # the reader thread reports the exit and fails the future with WorkerLost
            try:
                return await future
            except WorkerLost as exc:
                if time.monotonic() >= deadline:
                    raise DeadlineExceeded(f"encoding did not finish before the deadline: {exc.message}",
                                           field="text") from exc
                logger.warning("%s; retrying its batch of %d", exc.message, len(texts))

    async def _wait_for_change(self, key: str, deadline: float) -> None:
        if key not in self._models:
            raise EncoderError(f"no encoder registered for {key}", field="text")
        remaining = deadline - time.monotonic()
        if remaining <= 0 or self._changed is None:
            raise DeadlineExceeded(f"no encoder worker holds {key} ready before the deadline "
                                   f"(workers: {self.describe()})", field="text")
        try:
            await asyncio.wait_for(self._changed.wait(), remaining)
        except TimeoutError:
            pass

    def describe(self) -> list[dict[str, Any]]:
        """Per worker: pid, alive, restarts, last exit code, batches in flight, models ready."""
        rows: list[dict[str, Any]] = []
        for index, worker in enumerate(self._workers):
            rows.append({
                "worker": index, "pid": worker.pid if worker else None, "alive": bool(worker and worker.alive),
                "restarts": self._restarts[index], "last_exit_code": self._exit_codes[index],
                "inflight": len(worker.inflight) if worker else 0,
                "ready": sorted(worker.ready) if worker else [],
                "loading": sorted(worker.loading) if worker else [],
            })
        return rows


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
