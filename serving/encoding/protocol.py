"""Frames between the gateway and an encoder worker process, over the worker's stdin/stdout.

A frame is an 8-byte little-endian length and a pickle (protocol 5) of a tuple. Pickle is safe
here: both ends are this package, and the pipe is private to the two processes. Requests:

    ("load", key, model)                 → ("loaded", key, version_dict | None, error | None)
    ("unload", key)                      → nothing
    ("encode", req_id, key, kind, texts) → ("vectors", req_id, float32 array | None, error | None)

``kind`` is "query" (the version's query preprocessing) or "document" (already formatted text).
"""

from __future__ import annotations

import pickle
import struct
from typing import IO, Any

_LENGTH = struct.Struct("<Q")
MAX_FRAME_BYTES = 1 << 31  # a frame longer than this means the stream is out of step


def write_frame(stream: IO[bytes], message: tuple[Any, ...]) -> None:
    payload = pickle.dumps(message, protocol=5)
    stream.write(_LENGTH.pack(len(payload)) + payload)
    stream.flush()


def read_frame(stream: IO[bytes]) -> tuple[Any, ...] | None:
    """The next message, or None at end of stream (the other side exited)."""
    header = stream.read(_LENGTH.size)
    if len(header) < _LENGTH.size:
        return None
    (length,) = _LENGTH.unpack(header)
    if length > MAX_FRAME_BYTES:
        raise ValueError(f"encoder frame of {length} bytes: the stream is out of step")
    payload = stream.read(length)
    if len(payload) < length:
        return None
    message = pickle.loads(payload)  # noqa: S301 - our own child process, over a private pipe
    if not isinstance(message, tuple) or not message:
        raise ValueError(f"encoder frame is not a message: {type(message).__name__}")
    return message
