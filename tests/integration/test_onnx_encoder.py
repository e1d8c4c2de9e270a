"""The ONNX Runtime encoders, exported from the real MiniLM: fp32 is the same embedding version as
torch and holds nDCG@10 within ±0.001 on msmarco and dbpedia (its queries searched against the
torch-built corpus vectors, exactly); int8 is a version of its own; the gateway's encoder workers
export on first use (once, however many start together) and serve the same vectors."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from retrieval.encoders import encode_documents, load_encoder
from retrieval.errors import ConfigError, EncoderError
from retrieval.ir_metrics import ndcg_at_k
from retrieval.onnx_encoder import MANIFEST, OnnxEncoder
from retrieval.onnx_export import export_onnx
from serving.cli import main as shardrag
from serving.encoding.service import EncoderService
from serving.encoding.settings import EncoderSettings
from tests.conftest import REPORT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    root = tmp_path_factory.mktemp("onnx")
    export_onnx(None, root / "fp32")
    assert shardrag(["export-onnx", "--out", str(root / "int8"), "--int8"]) == 0  # the CLI's way
    return {precision: OnnxEncoder(root / precision, device="cpu", threads=2) for precision in ("fp32", "int8")}


def exact_ndcg(corpus, query_vectors) -> float:
    scores = query_vectors.astype(np.float64) @ corpus.vectors.astype(np.float64).T
    doc_ids = [d.doc_id for d in corpus.documents]
    rankings = {}
    for row, query_id in enumerate(corpus.query_ids):
        top = np.lexsort((np.arange(len(doc_ids)), -scores[row]))[:10]
        rankings[query_id] = [doc_ids[i] for i in top]
    return ndcg_at_k(rankings, corpus.dataset.qrels, 10)


@pytest.mark.parametrize("name", ["msmarco", "dbpedia"])
def test_fp32_is_the_torch_version_and_keeps_ndcg(name, request, exports):
    corpus = request.getfixturevalue(name)  # documents and queries encoded by torch (cached)
    onnx = exports["fp32"]
    assert onnx.version.id == corpus.version.id  # serves an index built with torch
    queries = onnx.encode_queries([corpus.dataset.queries[q] for q in corpus.query_ids])
    assert np.abs(queries - corpus.query_vectors).max() < 1e-5
    sample = np.random.default_rng(0).choice(len(corpus.documents), size=48, replace=False)
    documents = encode_documents(onnx, [corpus.documents[i] for i in sample], show_progress=False)
    assert np.abs(documents - corpus.vectors[sample]).max() < 1e-5
    torch_ndcg, onnx_ndcg = exact_ndcg(corpus, corpus.query_vectors), exact_ndcg(corpus, queries)
    REPORT.append(f"nDCG@10 {name}: onnx fp32 queries {onnx_ndcg:.5f} vs torch {torch_ndcg:.5f}")
    assert abs(onnx_ndcg - torch_ndcg) <= 0.001


def test_int8_is_a_version_of_its_own(msmarco, exports):
    int8, fp32 = exports["int8"], exports["fp32"]
    assert int8.version.id != fp32.version.id and int8.version.encoder_name == "all-MiniLM-L6-v2-int8"
    texts = [msmarco.dataset.queries[q] for q in msmarco.query_ids]
    cosines = (int8.encode_queries(texts) * fp32.encode_queries(texts)).sum(axis=1)
    assert cosines.mean() > 0.98, cosines  # the same model, approximately (per-channel int8: ~0.993)
    assert load_encoder(str(exports["int8"].export_dir)).version.id == int8.version.id  # a dir is an export


def test_bad_runtime_settings_and_exports_are_named_errors(tmp_path, exports):
    with pytest.raises(EncoderError) as error:
        load_encoder(None, runtime="tensorflow")
    assert error.value.field == "runtime"
    with pytest.raises(ConfigError) as config_error:
        EncoderSettings(runtime="onnx-fp8").validate()
    assert config_error.value.field == "encoder.runtime"
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    with pytest.raises(EncoderError) as error:
        export_onnx(None, tmp_path / "taken")
    assert error.value.field == "out" and (tmp_path / "taken" / "notes.txt").read_text() == "mine"
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / MANIFEST).write_text("{not json")
    with pytest.raises(EncoderError) as error:
        OnnxEncoder(tmp_path / "broken")
    assert error.value.field == "model" and MANIFEST in str(error.value)


def test_gateway_workers_export_once_and_serve_torch_vectors(msmarco, tmp_path, monkeypatch):
    monkeypatch.setenv("SHARDRAG_CACHE_DIR", str(tmp_path / "cache" / "embeddings"))  # a cold export cache
    texts = [msmarco.dataset.queries[q] for q in msmarco.query_ids[:24]]

    async def main() -> np.ndarray:
        service = EncoderService(EncoderSettings(workers=2, runtime="onnx", cache_size=0))
        service.start()
        try:
            encoder = service.make(msmarco.version.id, "default")
            await encoder.wait_ready(240)
            assert encoder.state == "ready", encoder.error
            assert service.describe()["runtime"] == "onnx"  # what /v1/cluster shows
            return np.stack(await asyncio.gather(*(encoder.encode(t) for t in texts)))
        finally:
            service.close()

    vectors = asyncio.run(main())
    assert np.abs(vectors - msmarco.query_vectors[:24]).max() < 1e-5
    exported = [p for p in (tmp_path / "cache" / "onnx").glob("*-fp32-e*") if p.is_dir()]  # not the lock file
    assert len(exported) == 1 and (exported[0] / MANIFEST).is_file()  # one export for both workers
    assert not [p for p in (tmp_path / "cache" / "onnx").iterdir() if p.name.startswith(".") and p.is_dir()]
