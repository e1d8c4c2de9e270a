"""FAISS indexes for one shard: build from any index-factory string with stable int64 ids,
read/write, search parameters, and the automatic GPU move.

FAISS is imported here and nowhere in ``retrieval``. Ids: IVF indexes store them natively;
every other factory (``Flat``, ``HNSW32``, ``PQ32``...) is wrapped in ``IndexIDMap2`` so the
int64 id of a document never depends on its position.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np

from retrieval.errors import BuildError, ConfigError, IndexIntegrityError, InvalidRequest

logger = logging.getLogger(__name__)

METRICS = {"ip": faiss.METRIC_INNER_PRODUCT, "l2": faiss.METRIC_L2}


def metric_code(metric: str) -> int:
    try:
        return METRICS[metric]
    except KeyError:
        raise ConfigError(f"unknown metric {metric!r}; use one of {sorted(METRICS)}", field="metric") from None


def gpu_count() -> int:
    """GPUs FAISS can use (0 with faiss-cpu, which still has the function)."""
    getter = getattr(faiss, "get_num_gpus", None)
    return int(getter()) if getter else 0


def build_index(vectors: np.ndarray, ids: np.ndarray, factory: str, metric: str = "ip") -> faiss.Index:
    """Train (when the factory needs it) and fill an index with ``vectors`` under ``ids``."""
    dim = vectors.shape[1]
    try:
        base = faiss.index_factory(dim, factory, metric_code(metric))
    except RuntimeError as exc:
        raise BuildError(f"FAISS cannot build index factory {factory!r}: {str(exc).strip().splitlines()[-1]}") from exc
    native_ids = faiss.try_extract_index_ivf(base) is not None or factory.replace(" ", "").upper().startswith("IDMAP")
    index = base if native_ids else faiss.IndexIDMap2(base)
    if not index.is_trained:
        if len(vectors) == 0:
            raise BuildError(f"index factory {factory!r} needs training vectors, this shard has none")
        try:
            index.train(vectors)
        except RuntimeError as exc:
            raise BuildError(
                f"training {factory!r} on {len(vectors)} vectors failed ({str(exc).strip().splitlines()[-1]}); "
                "use fewer lists/centroids or more documents per shard"
            ) from exc
    if len(vectors):
        index.add_with_ids(vectors, ids)
    return index


def write_index(index: faiss.Index, path: Path) -> None:
    faiss.write_index(index, str(path))


def read_index(path: Path) -> faiss.Index:
    try:
        return faiss.read_index(str(path))
    except RuntimeError as exc:
        raise IndexIntegrityError(f"{path} is not a readable FAISS index: {str(exc).strip()[:200]}") from exc


@dataclass(slots=True)
class SearchableIndex:
    """An index ready to search, on the GPU when FAISS has one and the index type allows it."""

    index: faiss.Index
    on_gpu: bool
    _space: faiss.ParameterSpace

    @classmethod
    def wrap(cls, index: faiss.Index, device: str = "auto") -> SearchableIndex:
        if device not in ("auto", "cpu", "gpu"):
            raise ConfigError(f"device must be auto, cpu or gpu, not {device!r}", field="device")
        want_gpu = device == "gpu" or (device == "auto" and gpu_count() > 0)
        if want_gpu:
            if gpu_count() == 0:
                raise ConfigError("device=gpu but FAISS reports no GPU (is faiss-gpu installed?)", field="device")
            try:
                gpu_index = faiss.index_cpu_to_all_gpus(index)
                return cls(gpu_index, True, faiss.GpuParameterSpace())
            except (RuntimeError, AttributeError) as exc:
                # HNSW and a few others have no GPU implementation: serve them from the CPU.
                logger.warning("index stays on CPU, GPU move failed: %s", str(exc).strip().splitlines()[-1])
        return cls(index, False, faiss.ParameterSpace())

    @property
    def ntotal(self) -> int:
        return int(self.index.ntotal)

    def search(
        self, queries: np.ndarray, k: int, *, nprobe: int | None = None, ef_search: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        # Searches run one at a time on the server's event loop, so setting parameters on the
        # shared index just before the call cannot race with another request.
        if nprobe is not None:
            self._set("nprobe", nprobe, "nprobe")
        if ef_search is not None:
            self._set("efSearch", ef_search, "ef_search")
        return self.index.search(queries, k)

    def _set(self, name: str, value: int, field: str) -> None:
        try:
            self._space.set_index_parameter(self.index, name, value)
        except RuntimeError as exc:
            raise InvalidRequest(f"{field} does not apply to this index ({type(self.index).__name__})",
                                 field=field) from exc
