"""Compact binary form of query vectors between processes: little-endian float32, row-major.

The gateway sends ``n × dim`` float32 values as the raw body of a shard search; the shard
checks the length against its dimension. JSON float lists would cost ~10× the bytes and the
parse time.
"""

from __future__ import annotations

import numpy as np

from retrieval.errors import DimensionMismatch, InvalidRequest, MalformedBody

FLOAT32_LE = np.dtype("<f4")
CONTENT_TYPE = "application/octet-stream"


def encode_vectors(vectors: np.ndarray) -> bytes:
    """``vectors``: shape (n, dim) or (dim,). Returns the little-endian float32 bytes."""
    array = np.asarray(vectors, dtype=FLOAT32_LE)
    if array.ndim == 1:
        array = array[None, :]
    if array.ndim != 2:
        raise InvalidRequest(f"vectors must be 1-D or 2-D, got {array.ndim}-D", field="vector")
    return np.ascontiguousarray(array).tobytes()


def decode_vectors(body: bytes, dim: int, *, field: str = "body", max_rows: int | None = None) -> np.ndarray:
    """Parse a body of ``n × dim`` float32 values; reject bad lengths and non-finite values."""
    if dim <= 0:
        raise InvalidRequest(f"dim must be positive, got {dim}", field="dim")
    row_bytes = dim * FLOAT32_LE.itemsize
    if not body:
        raise MalformedBody("empty body: expected n × dim little-endian float32 values", field=field)
    if len(body) % row_bytes:
        raise DimensionMismatch(
            f"body of {len(body)} bytes is not a whole number of {dim}-dim float32 vectors "
            f"({row_bytes} bytes each)",
            field=field,
        )
    rows = len(body) // row_bytes
    if max_rows is not None and rows > max_rows:
        raise InvalidRequest(f"batch of {rows} vectors is over the limit of {max_rows}", field=field)
    array = np.frombuffer(body, dtype=FLOAT32_LE).reshape(rows, dim)
    check_finite(array, field=field)
    # FAISS wants native-endian, C-contiguous float32.
    return np.ascontiguousarray(array, dtype=np.float32)


def check_finite(array: np.ndarray, *, field: str) -> None:
    if not np.isfinite(array).all():
        raise InvalidRequest("vector holds NaN or infinity", field=field)
