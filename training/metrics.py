"""Training metrics in the Prometheus text format, written by rank 0 to ``<out>/metrics.prom``
at every checkpoint (a node exporter's textfile collector, or a sidecar, can pick it up)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, write_to_textfile


class TrainMetrics:
    def __init__(self, rank: int) -> None:
        self.registry = CollectorRegistry()
        self.step = Gauge("shardrag_train_step", "Optimizer steps done", registry=self.registry)
        self.loss = Gauge("shardrag_train_loss", "Global-batch InfoNCE loss of the last step", registry=self.registry)
        self.samples = Gauge("shardrag_train_samples_per_second", "Training pairs per second (all ranks)",
                             registry=self.registry)
        self.local_step = Gauge("shardrag_train_rank_local_step_seconds",
                                "Each rank's local compute time of the last step", ["rank"], registry=self.registry)
        self.stragglers = Counter("shardrag_train_straggler_events_total",
                                  "Steps at which a rank was reported as a straggler", ["rank"],
                                  registry=self.registry)

    def observe(self, step: int, loss: float, rank_times_s: Sequence[float], samples_per_s: float,
                stragglers: Sequence[int]) -> None:
        self.step.set(step)
        self.loss.set(loss)
        self.samples.set(samples_per_s)
        for rank, seconds in enumerate(rank_times_s):
            self.local_step.labels(rank=str(rank)).set(seconds)
        for rank in stragglers:
            self.stragglers.labels(rank=str(rank)).inc()

    def write(self, out: Path) -> None:
        write_to_textfile(str(out / "metrics.prom"), self.registry)  # temp file + rename
