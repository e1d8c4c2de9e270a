"""The real MiniLM model, offline; vectors compared with sentence-transformers called directly."""

import numpy as np

from retrieval.embedding_cache import CachingEncoder, EmbeddingCache
from retrieval.encoders import default_model_dir, format_document, weights_sha256
from retrieval.types import Document, Preprocessing


def test_beir_document_layout():
    prep = Preprocessing()
    assert format_document(Document("1", "body", "Title"), prep) == "Title body"
    assert format_document(Document("1", "body"), prep) == "body"


def test_version_identity(encoder):
    version = encoder.version
    assert version.dim == 384
    assert version.encoder_name == "all-MiniLM-L6-v2"
    assert version.weights_sha256 == weights_sha256(default_model_dir())
    assert version.preprocessing.max_tokens == 256 and version.preprocessing.normalize


def test_vectors_match_sentence_transformers(encoder):
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(default_model_dir()), device="cpu")
    texts = ["what is the boiling point of water", "Oceanic Airlines fictional airline"]
    ours = encoder.encode_queries(texts)
    theirs = reference.encode(texts, normalize_embeddings=True)
    assert ours.dtype == np.float32 and ours.shape == (2, 384)
    assert np.allclose(ours, theirs, atol=1e-6)
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


class CountingEncoder:
    """Wraps the real encoder and counts what reaches it."""

    def __init__(self, inner):
        self.inner = inner
        self.encoded: list[str] = []

    @property
    def version(self):
        return self.inner.version

    def encode_queries(self, texts, *, show_progress=False):
        return self.inner.encode_queries(texts)

    def encode_texts(self, texts, *, show_progress=False):
        self.encoded.extend(texts)
        return self.inner.encode_texts(texts)


def test_cache_encodes_only_missing_texts(encoder, tmp_path):
    counting = CountingEncoder(encoder)
    caching = CachingEncoder(counting, EmbeddingCache(tmp_path), chunk_size=2)
    first = caching.encode_texts(["alpha", "beta", "gamma"])
    assert counting.encoded == ["alpha", "beta", "gamma"]
    again = caching.encode_texts(["gamma", "delta", "alpha"])
    assert counting.encoded[3:] == ["delta"]
    assert np.array_equal(again[0], first[2]) and np.array_equal(again[2], first[0])
    # a different embedding version never sees these vectors
    assert list(tmp_path.glob("*.sqlite")) == [tmp_path / f"{encoder.version.id}.sqlite"]
