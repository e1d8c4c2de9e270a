"""retrieval.bert_encoder: bit for bit the vectors sentence-transformers gives, on the real model and
real texts, without importing sentence-transformers; checkpoints it cannot run are named and left
to sentence-transformers."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from retrieval.bert_encoder import LeanBert, lean_checkpoint
from retrieval.datasets import load_beir
from retrieval.encoders import SentenceTransformerEncoder, default_model_dir, format_document
from retrieval.types import Preprocessing
from tests.conftest import REPO, data_dir

EDGE_TEXTS = ["", " ", "  leading and trailing spaces  ", "Ünïcödé ÀÉÎ ß 日本語のテキスト", "tab\tand\nnewline",
              "[CLS] [SEP] [PAD] [MASK]", "x", "word " * 400]  # the last one is cut at 256 tokens


def _real_texts(per_dataset: int) -> list[str]:
    texts: list[str] = []
    for name in ("msmarco", "dbpedia"):
        dataset = load_beir(data_dir() / name)
        texts += [dataset.queries[q] for q in sorted(dataset.queries)][:per_dataset]
        texts += [format_document(d, Preprocessing()) for d in dataset.corpus[:per_dataset]]
    return texts + EDGE_TEXTS


def _reference(model_dir: Path):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(model_dir), device="cpu")
    model.max_seq_length = 256
    return model


@pytest.mark.parametrize("batch_size, per_dataset", [(64, 25), (5, 8)])
def test_minilm_vectors_are_bit_identical(batch_size, per_dataset):
    texts = _real_texts(per_dataset)
    reference = _reference(default_model_dir()).encode(texts, batch_size=batch_size, normalize_embeddings=True,
                                                       convert_to_numpy=True)
    ours = LeanBert(default_model_dir(), max_seq_length=256).encode(texts, batch_size=batch_size,
                                                                    normalize_embeddings=True)
    assert ours.dtype == np.float32 and ours.shape == (len(texts), 384)
    assert np.array_equal(ours, reference)


def test_a_tiny_trained_checkpoint_is_bit_identical(tmp_path):
    from training.model import make_tiny_checkpoint

    tiny = make_tiny_checkpoint(tmp_path / "tiny", hidden=32, layers=2, seed=3)
    assert lean_checkpoint(tiny) is None
    texts = _real_texts(10)
    reference = _reference(tiny).encode(texts, batch_size=16, normalize_embeddings=True, convert_to_numpy=True)
    ours = LeanBert(tiny, max_seq_length=256).encode(texts, batch_size=16, normalize_embeddings=True)
    assert ours.shape == (len(texts), 32) and np.array_equal(ours, reference)


def test_an_empty_batch():
    assert LeanBert(default_model_dir(), max_seq_length=256).encode([], batch_size=8,
                                                                    normalize_embeddings=True).shape == (0, 384)


def _copy_model(tmp_path: Path) -> Path:
    target = tmp_path / "model"
    shutil.copytree(default_model_dir(), target)
    return target


def _edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("change, reason", [
    (lambda d: _edit_json(d / "1_Pooling" / "config.json", pooling_mode_mean_tokens=False,
                          pooling_mode_cls_token=True), "pooling"),
    (lambda d: _edit_json(d / "config.json", model_type="roberta"), "not a BERT"),
    (lambda d: _edit_json(d / "config.json", position_embedding_type="relative_key"), "variant"),
    (lambda d: _edit_json(d / "sentence_bert_config.json", do_lower_case=True), "lowercases"),
    (lambda d: (d / "tokenizer.json").unlink(), "tokenizer.json"),
    (lambda d: (d / "modules.json").write_text(json.dumps(
        json.loads((d / "modules.json").read_text())[:2]
        + [{"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"}])), "modules"),
])
def test_checkpoints_it_cannot_run_are_named(tmp_path, change, reason):
    model_dir = _copy_model(tmp_path)
    change(model_dir)
    why = lean_checkpoint(model_dir)
    assert why is not None and reason in why


def test_half_precision_weights_go_to_sentence_transformers(tmp_path):
    from safetensors.torch import load_file, save_file

    model_dir = _copy_model(tmp_path)
    weights = load_file(str(model_dir / "model.safetensors"))
    save_file({k: v.half() if v.is_floating_point() else v for k, v in weights.items()},
              str(model_dir / "model.safetensors"))
    assert "F16" in (lean_checkpoint(model_dir) or "")
    encoder = SentenceTransformerEncoder(model_dir, device="cpu")
    assert type(encoder._model).__name__ == "SentenceTransformer"


def test_the_default_encoder_never_imports_sentence_transformers():
    """What made an encoder worker's start 4-6 s slower: the default model must not need it."""
    probe = ("import sys\n"
             "from retrieval.encoders import load_default_encoder\n"
             "encoder = load_default_encoder(device='cpu')\n"
             "vectors = encoder.encode_queries(['what is the boiling point of water'])\n"
             "print(type(encoder._model).__name__, vectors.shape, 'sentence_transformers' in sys.modules)\n")
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["LeanBert", "(1,", "384)", "False"]
