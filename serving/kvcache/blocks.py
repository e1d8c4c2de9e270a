"""KV-cache block identity and wire form.

A prompt's tokens are cut into fixed-size blocks (default 16 tokens); only full blocks are
cached. A block's key hashes its parent's key, its token ids, the model id and the KV dtype —
a chain, so equal keys mean equal prefixes, and a block computed by one model or dtype can
never be served to another. A block's payload is the keys and values of every layer for its
tokens: a tensor of shape (layers, 2, kv_heads, block_size, head_dim) in the model's dtype,
sent as raw little-endian bytes behind a small header (no pickle).
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Sequence
from typing import NewType

import numpy as np

BlockKey = NewType("BlockKey", bytes)
KEY_BYTES = 16


def block_keys(token_ids: Sequence[int], *, block_size: int, model_id: str, dtype: str) -> list[BlockKey]:
    """Keys of the full blocks of ``token_ids``, first to last."""
    if block_size < 1:
        raise ValueError("block_size must be ≥ 1")
    tag = f"{model_id}|{dtype}|{block_size}".encode()
    tokens = np.asarray(token_ids, dtype="<i8")
    keys: list[BlockKey] = []
    parent = b"shardrag-kv-root"
    for start in range(0, len(tokens) - block_size + 1, block_size):
        digest = hashlib.blake2b(digest_size=KEY_BYTES)
        digest.update(parent)
        digest.update(tokens[start:start + block_size].tobytes())
        digest.update(tag)
        parent = digest.digest()
        keys.append(BlockKey(parent))
    return keys


def passage_key(passage_ids: Sequence[int], *, anchor_ids: Sequence[int], model_id: str, dtype: str) -> BlockKey:
    """Key of a passage's KV computed on its own right after ``anchor_ids`` (the fixed prompt
    prefix it was computed behind): reusable wherever the passage appears after that prefix."""
    digest = hashlib.blake2b(digest_size=KEY_BYTES)
    digest.update(b"shardrag-kv-passage")
    digest.update(hashlib.blake2b(np.asarray(anchor_ids, dtype="<i8").tobytes(), digest_size=KEY_BYTES).digest())
    digest.update(np.asarray(passage_ids, dtype="<i8").tobytes())
    digest.update(f"{model_id}|{dtype}".encode())
    return BlockKey(digest.digest())


# -- payload codec: header {dtype, shape} + raw bytes ---------------------------------------------
_HEADER = struct.Struct("<I")


def encode_payload(array: np.ndarray) -> bytes:
    array = np.ascontiguousarray(array)
    header = json.dumps({"dtype": array.dtype.str, "shape": list(array.shape)}).encode()
    return _HEADER.pack(len(header)) + header + array.tobytes()


def decode_payload(blob: bytes | memoryview) -> np.ndarray:
    (length,) = _HEADER.unpack_from(blob, 0)
    header = json.loads(bytes(blob[_HEADER.size:_HEADER.size + length]))
    data = blob[_HEADER.size + length:]
    return np.frombuffer(data, dtype=np.dtype(header["dtype"])).reshape(header["shape"])


# -- multi-block frames: [16-byte key][u32 length][payload] ... ------------------------------------
_FRAME = struct.Struct("<I")


def pack_blocks(blocks: Sequence[tuple[bytes, bytes]]) -> bytes:
    parts = []
    for key, payload in blocks:
        if len(key) != KEY_BYTES:
            raise ValueError(f"block keys are {KEY_BYTES} bytes")
        parts += [key, _FRAME.pack(len(payload)), payload]
    return b"".join(parts)


def unpack_blocks(body: bytes) -> list[tuple[BlockKey, bytes]]:
    view = memoryview(body)
    out = []
    offset = 0
    while offset < len(view):
        if offset + KEY_BYTES + _FRAME.size > len(view):
            raise ValueError("truncated block frame")
        key = bytes(view[offset:offset + KEY_BYTES])
        (length,) = _FRAME.unpack_from(view, offset + KEY_BYTES)
        start = offset + KEY_BYTES + _FRAME.size
        if start + length > len(view):
            raise ValueError("truncated block payload")
        out.append((BlockKey(key), bytes(view[start:start + length])))
        offset = start + length
    return out


def unpack_keys(body: bytes) -> list[BlockKey]:
    if len(body) % KEY_BYTES:
        raise ValueError(f"body is not a whole number of {KEY_BYTES}-byte keys")
    return [BlockKey(body[i:i + KEY_BYTES]) for i in range(0, len(body), KEY_BYTES)]


# -- put frames carry the parent key too (for leaf-first eviction on the node) --------------------
NO_PARENT = b"\0" * KEY_BYTES


def pack_puts(blocks: Sequence[tuple[bytes, bytes | None, bytes]]) -> bytes:
    """(key, parent or None, payload) triples."""
    return pack_blocks([(key, (parent or NO_PARENT) + payload) for key, parent, payload in blocks])


def unpack_puts(body: bytes) -> list[tuple[BlockKey, bytes | None, bytes]]:
    out = []
    for key, blob in unpack_blocks(body):
        if len(blob) < KEY_BYTES:
            raise ValueError("put frame without a parent key")
        parent = blob[:KEY_BYTES]
        out.append((key, None if parent == NO_PARENT else parent, blob[KEY_BYTES:]))
    return out
