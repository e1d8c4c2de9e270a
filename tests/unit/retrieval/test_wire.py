import numpy as np
import pytest

from retrieval.errors import DimensionMismatch, InvalidRequest, MalformedBody
from retrieval.wire import decode_vectors, encode_vectors


def test_roundtrip_is_little_endian_float32():
    vectors = np.arange(12, dtype=np.float64).reshape(3, 4)
    body = encode_vectors(vectors)
    assert body == np.asarray(vectors, dtype="<f4").tobytes()
    assert np.array_equal(decode_vectors(body, 4), vectors.astype(np.float32))


def test_single_vector_becomes_one_row():
    assert decode_vectors(encode_vectors(np.ones(4)), 4).shape == (1, 4)


@pytest.mark.parametrize("body, error", [(b"", MalformedBody), (b"\0" * 15, DimensionMismatch)])
def test_bad_lengths(body, error):
    with pytest.raises(error) as info:
        decode_vectors(body, 4)
    assert info.value.field == "body"


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_non_finite_rejected(value):
    vectors = np.zeros((2, 4), dtype=np.float32)
    vectors[1, 2] = value
    with pytest.raises(InvalidRequest, match="NaN or infinity"):
        decode_vectors(encode_vectors(vectors), 4)


def test_batch_limit():
    with pytest.raises(InvalidRequest, match="over the limit"):
        decode_vectors(encode_vectors(np.zeros((3, 4))), 4, max_rows=2)
