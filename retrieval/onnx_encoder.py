"""Encoders on ONNX Runtime: a sentence-transformers checkpoint exported by
:mod:`retrieval.onnx_export`, run without torch.

An export directory holds ``model.onnx`` (the transformer: token ids → last hidden state),
``tokenizer.json`` and ``shardrag-onnx.json`` (:class:`OnnxManifest`); pooling and normalisation
run here in numpy, as sentence-transformers does them. An fp32 export computes the same function
as the checkpoint it came from, so it *is* the same embedding version (same id: an index built
with torch serves queries encoded here — ``tests/integration/test_onnx_encoder.py`` holds nDCG@10
within ±0.001); an int8 export is a different function, hence a version of its own (name
``<name>-int8``, weights hash of its ``model.onnx``). onnxruntime and tokenizers are imported when
an encoder is built, never at import.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from retrieval.errors import EncoderError
from retrieval.types import EmbeddingVersion, Preprocessing

MANIFEST = "shardrag-onnx.json"
PRECISIONS = ("fp32", "int8")
POOLINGS = ("mean", "cls")


@dataclass(frozen=True, slots=True)
class OnnxManifest:
    encoder_name: str  # the source checkpoint's encoder name
    source_weights_sha256: str  # of the checkpoint it was exported from
    precision: str  # fp32: the same function as the source; int8: dynamically quantised
    pooling: str  # mean or cls, from the checkpoint's 1_Pooling config
    dim: int
    preprocessing: Preprocessing = field(default_factory=Preprocessing)
    onnx_sha256: str = ""  # of model.onnx (the int8 version's weights)
    opset: int = 17

    def version(self) -> EmbeddingVersion:
        if self.precision == "fp32":
            return EmbeddingVersion(self.encoder_name, self.source_weights_sha256, self.dim, self.preprocessing)
        return EmbeddingVersion(f"{self.encoder_name}-{self.precision}", self.onnx_sha256, self.dim,
                                self.preprocessing)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def read(cls, directory: Path) -> OnnxManifest:
        try:
            raw = json.loads((directory / MANIFEST).read_text())
            raw["preprocessing"] = Preprocessing(**raw.get("preprocessing", {}))
            manifest = cls(**raw)
        except (OSError, ValueError, TypeError) as exc:
            raise EncoderError(f"{directory / MANIFEST} is not a readable ONNX export manifest: {exc}",
                               field="model") from exc
        if manifest.precision not in PRECISIONS or manifest.pooling not in POOLINGS:
            raise EncoderError(f"{directory / MANIFEST}: precision must be one of {PRECISIONS} and pooling one "
                               f"of {POOLINGS}", field="model")
        return manifest


def is_onnx_export(path: str | Path) -> bool:
    return (Path(path) / MANIFEST).is_file()


def pool(hidden: np.ndarray, mask: np.ndarray, how: str, normalize: bool) -> np.ndarray:
    """Sentence vectors from token states ``hidden`` [batch, tokens, dim] and ``mask`` [batch, tokens]."""
    if how == "cls":
        vectors = hidden[:, 0, :]
    else:
        weights = mask[:, :, None].astype(np.float32)
        vectors = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
    if normalize:
        vectors = vectors / np.clip(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12, None)
    return np.ascontiguousarray(vectors, dtype=np.float32)


class OnnxEncoder:
    """An export directory on ONNX Runtime (CUDA execution provider when one is installed and
    ``device`` allows it, else CPU). ``threads``: intra-op threads (0: onnxruntime's default)."""

    def __init__(self, export_dir: str | Path, *, batch_size: int = 64, device: str = "auto",
                 threads: int = 0) -> None:
        self.export_dir = export_dir = Path(export_dir)
        self.manifest = OnnxManifest.read(export_dir)
        self._batch_size = batch_size
        try:
            import onnxruntime as ort
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise EncoderError("the ONNX runtime needs onnxruntime and tokenizers (pip install -e '.[onnx]')",
                               field="model") from exc
        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        available = ort.get_available_providers()
        providers = (["CUDAExecutionProvider"] if device != "cpu" and "CUDAExecutionProvider" in available
                     else []) + ["CPUExecutionProvider"]
        try:
            self._session = ort.InferenceSession(str(export_dir / "model.onnx"), options, providers=providers)
            self._tokenizer = Tokenizer.from_file(str(export_dir / "tokenizer.json"))
        except Exception as exc:
            raise EncoderError(f"cannot load the ONNX export {export_dir}: {exc}", field="model") from exc
        self.device = "cuda" if self._session.get_providers()[0] == "CUDAExecutionProvider" else "cpu"
        self._tokenizer.enable_truncation(self.manifest.preprocessing.max_tokens)
        self._tokenizer.enable_padding()
        self._inputs = {i.name for i in self._session.get_inputs()}
        self._version = self.manifest.version()

    @property
    def version(self) -> EmbeddingVersion:
        return self._version

    def _batch(self, texts: Sequence[str]) -> np.ndarray:
        # sentence-transformers strips each text before tokenising; so must we, for the same ids
        encodings = self._tokenizer.encode_batch([text.strip() for text in texts])
        feeds: dict[str, Any] = {"input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
                                 "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64)}
        if "token_type_ids" in self._inputs:
            feeds["token_type_ids"] = np.array([e.type_ids for e in encodings], dtype=np.int64)
        (hidden,) = self._session.run(["last_hidden_state"], feeds)
        return pool(hidden, feeds["attention_mask"], self.manifest.pooling, self.manifest.preprocessing.normalize)

    def _encode(self, texts: Sequence[str], show_progress: bool) -> np.ndarray:
        if not texts:
            return np.zeros((0, self._version.dim), dtype=np.float32)
        # length-sorted batches pad less (sentence-transformers does the same)
        order = np.argsort([-len(t) for t in texts], kind="stable")
        out = np.empty((len(texts), self._version.dim), dtype=np.float32)
        starts = range(0, len(texts), self._batch_size)
        if show_progress and len(texts) > self._batch_size:
            from tqdm.auto import tqdm

            starts = tqdm(starts, desc="encoding (onnx)", unit="batch")
        for start in starts:
            rows = order[start:start + self._batch_size]
            out[rows] = self._batch([texts[i] for i in rows])
        return out

    def encode_queries(self, texts: Sequence[str], *, show_progress: bool = False) -> np.ndarray:
        prefix = self.manifest.preprocessing.query_prefix
        return self._encode([prefix + t for t in texts] if prefix else list(texts), show_progress)

    def encode_texts(self, texts: Sequence[str], *, show_progress: bool = False) -> np.ndarray:
        return self._encode(list(texts), show_progress)


def export_cache_dir() -> Path:
    """Where exports made on first use live: beside the embedding cache ($SHARDRAG_CACHE_DIR/../onnx)."""
    from retrieval.embedding_cache import default_cache_dir

    return default_cache_dir().parent / "onnx"

