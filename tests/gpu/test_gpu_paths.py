"""The GPU code paths, on a machine that has one (``gpu`` marker; skipped without CUDA / faiss-gpu).

A shard served from the GPU must answer as the same shard on the CPU does; the query encoder on
CUDA must give the CPU's vectors. Run there with ``pytest -m gpu tests/gpu``; the figures are
``python -m benchmarks.gpu``'s.
"""

from __future__ import annotations

import numpy as np
import pytest

from index_shards.build import BuildConfig, build_collection
from index_shards.faiss_index import gpu_count
from index_shards.layout import resolve_version, shard_dir
from index_shards.shard import Shard
from retrieval.types import Document, EmbeddingVersion

pytestmark = pytest.mark.gpu
needs_faiss_gpu = pytest.mark.skipif(gpu_count() == 0, reason="needs a GPU and faiss-gpu")


def _cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _shard(tmp_path, factory: str) -> tuple[np.ndarray, object]:
    rng = np.random.default_rng(5)
    vectors = rng.standard_normal((20_000, 64)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    build_collection(tmp_path, [Document(f"d{i}", f"text {i}") for i in range(len(vectors))], vectors,
                     EmbeddingVersion("m", "0" * 64, 64), BuildConfig("c", 1, "hash", factory), show_progress=False)
    queries = vectors[:64] + 0.05 * rng.standard_normal((64, 64)).astype(np.float32)
    return queries, shard_dir(resolve_version(tmp_path, "c")[0], 0)


@needs_faiss_gpu
@pytest.mark.parametrize("device", ["gpu", "auto"])
def test_flat_shard_on_the_gpu_answers_as_on_the_cpu(tmp_path, device):
    queries, directory = _shard(tmp_path, "Flat")
    on_gpu = Shard.load(directory, device=device)
    on_cpu = Shard.load(directory, device="cpu")
    assert on_gpu.index.on_gpu and not on_cpu.index.on_gpu  # "auto" picks the GPU by itself
    for got, want in zip(on_gpu.search(queries, 10), on_cpu.search(queries, 10), strict=True):
        assert got["doc_ids"] == want["doc_ids"]
        np.testing.assert_allclose(got["scores"], want["scores"], atol=1e-4)


@needs_faiss_gpu
def test_ivf_on_the_gpu_honours_nprobe(tmp_path):
    queries, directory = _shard(tmp_path, "IVF64,Flat")
    on_gpu = Shard.load(directory, device="gpu")
    on_cpu = Shard.load(directory, device="cpu")
    assert on_gpu.index.on_gpu
    wide_cpu, narrow_cpu = on_cpu.search(queries, 10, nprobe=64), on_cpu.search(queries, 10, nprobe=1)
    assert any(w["doc_ids"] != n["doc_ids"] for w, n in zip(wide_cpu, narrow_cpu, strict=True))  # the knob matters
    # same trained lists on both devices: the same nprobe gives the same ids, in either order of calls
    for nprobe, want in ((64, wide_cpu), (1, narrow_cpu), (64, wide_cpu)):
        got = on_gpu.search(queries, 10, nprobe=nprobe)
        assert [g["doc_ids"] for g in got] == [w["doc_ids"] for w in want], f"nprobe={nprobe}"


@needs_faiss_gpu
def test_hnsw_stays_on_the_cpu_and_still_answers(tmp_path):
    queries, directory = _shard(tmp_path, "HNSW16")
    shard = Shard.load(directory, device="auto")
    assert not shard.index.on_gpu  # FAISS has no GPU HNSW: served from the CPU, not refused
    assert all(len(hits["doc_ids"]) == 10 for hits in shard.search(queries, 10))


@pytest.mark.skipif(not _cuda(), reason="needs CUDA")
def test_encoder_on_cuda_gives_the_cpu_vectors():
    from retrieval.encoders import load_default_encoder

    texts = ["how do I open a file", "the sun is a star", "gradient descent", "what is a shard"] * 8
    cuda = load_default_encoder()  # "auto": CUDA by itself
    cpu = load_default_encoder(device="cpu")
    assert "cuda" in str(cuda.device)
    np.testing.assert_allclose(cuda.encode_queries(texts), cpu.encode_queries(texts), atol=1e-4)
