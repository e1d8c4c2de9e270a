"""Shared pieces of the benchmarks: real data + cached embeddings, percentiles, CPU accounting,
result files."""

from __future__ import annotations

import atexit
import json
import os
import platform
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from retrieval import env

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def data_dir() -> Path:
    configured = env.read("SHARDRAG_DATA_DIR")
    return Path(configured) if configured else REPO.parent / "shared" / "data"


@dataclass
class Corpus:
    doc_ids: list[str]
    documents: list[Any]
    vectors: np.ndarray
    query_vectors: np.ndarray
    version: Any


def load_corpus(names: tuple[str, ...] = ("msmarco", "dbpedia")) -> Corpus:
    """Both shared corpora (10k passages) embedded with MiniLM, through the embedding cache."""
    from retrieval.datasets import load_beir
    from retrieval.embedding_cache import CachingEncoder, EmbeddingCache, default_cache_dir
    from retrieval.encoders import encode_documents, load_default_encoder

    encoder = CachingEncoder(load_default_encoder(device="cpu"), EmbeddingCache(default_cache_dir()))
    documents, vectors, queries = [], [], []
    for name in names:
        dataset = load_beir(data_dir() / name)
        documents.extend(dataset.corpus)
        vectors.append(encode_documents(encoder, dataset.corpus, show_progress=True))
        queries.extend(dataset.queries[q] for q in sorted(dataset.queries))
    query_vectors = encoder.encode_queries(queries)
    return Corpus([d.doc_id for d in documents], documents, np.concatenate(vectors), query_vectors, encoder.version)


def query_texts(names: tuple[str, ...] = ("msmarco", "dbpedia")) -> list[str]:
    """The shared corpora's real query texts (100), in the order ``load_corpus`` embeds them."""
    from retrieval.datasets import load_beir

    texts: list[str] = []
    for name in names:
        dataset = load_beir(data_dir() / name)
        texts.extend(dataset.queries[q] for q in sorted(dataset.queries))
    return texts


def percentiles_ms(latencies_s: list[float] | np.ndarray) -> dict[str, float]:
    values = np.asarray(latencies_s, dtype=np.float64) * 1000.0
    if values.size == 0:
        return {"p50_ms": float("nan"), "p99_ms": float("nan"), "mean_ms": float("nan")}
    return {"p50_ms": float(np.percentile(values, 50)), "p99_ms": float(np.percentile(values, 99)),
            "mean_ms": float(values.mean())}


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used so far (Linux /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def machine_busy_cpu_s() -> float:
    parts = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = parts[3] + parts[4]
    return (sum(parts[:8]) - idle) / CLOCK_TICKS


def machine_info() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S")}


def scratch_dir(prefix: str) -> Path:
    """A new temporary folder for one benchmark run (collections, logs, request bodies), removed
    when the run's process exits — a run builds hundreds of MB, and runs are many."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, work, ignore_errors=True)
    return work


def write_result(name: str, payload: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    temp = path.with_suffix(".json.tmp")
    temp.write_text(json.dumps(payload, indent=1))
    os.replace(temp, path)
    return path


def closed_loop(url: str, bodies: list[dict[str, Any]], work: Path, concurrency: int,
                duration_s: float) -> dict[str, Any]:
    """benchmarks/loadgen.py in its own process against ``url``/v1/query, closed loop; its summary."""
    import json
    import subprocess
    import sys

    path = work / "closed_loop_bodies.json"
    path.write_text(json.dumps(bodies))
    output = subprocess.run([sys.executable, "-m", "benchmarks.loadgen", "--url", f"{url}/v1/query", "--bodies",
                             str(path), "--concurrency", str(concurrency), "--duration", str(duration_s),
                             "--warmup", "1"], capture_output=True, text=True, cwd=REPO, check=True)
    summary: dict[str, Any] = json.loads(output.stdout.strip().splitlines()[-1])
    return summary
