"""KV-cache pieces without processes: block keys, the binary codec, the pool's budget and
eviction order, rendezvous placement, and the generator with a local pool (tiny Llama)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from serving.kvcache.blocks import (
    block_keys,
    decode_payload,
    encode_payload,
    pack_blocks,
    pack_puts,
    unpack_blocks,
    unpack_keys,
    unpack_puts,
)
from serving.kvcache.client import KVClient, owner
from serving.kvcache.pool import BlockPool


def keys_of(tokens: list[int], **overrides: object) -> list[bytes]:
    options = {"block_size": 4, "model_id": "m", "dtype": "float32", **overrides}
    return block_keys(tokens, **options)  # type: ignore[arg-type]


# -- block keys ---------------------------------------------------------------------------------
def test_only_full_blocks_are_keyed():
    assert len(keys_of(list(range(3)))) == 0
    assert len(keys_of(list(range(4)))) == 1
    assert len(keys_of(list(range(11)))) == 2


def test_keys_chain_so_equal_keys_mean_equal_prefixes():
    a = keys_of(list(range(12)))
    b = keys_of(list(range(12)) + [99, 98, 97, 96])
    assert b[:3] == a  # same prefix → same keys
    changed = keys_of([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 77])
    assert changed[:2] == a[:2] and changed[2] != a[2]
    early = keys_of([0, 1, 2, 3, 4, 5, 6, 70, 8, 9, 10, 11])
    assert early[0] == a[0] and early[1] != a[1] and early[2] != a[2]  # a change poisons every later block
    moved = keys_of([4, 5, 6, 7, 0, 1, 2, 3])  # the same block at another position has another key
    assert moved[1] != a[0]


def test_keys_depend_on_model_dtype_and_block_size():
    base = keys_of(list(range(8)))
    assert keys_of(list(range(8)), model_id="other") != base
    assert keys_of(list(range(8)), dtype="float16") != base
    assert keys_of(list(range(8)), block_size=8)[0] not in base
    with pytest.raises(ValueError):
        keys_of([1], block_size=0)


# -- codec --------------------------------------------------------------------------------------
def test_payload_round_trip_is_exact():
    array = np.random.default_rng(0).standard_normal((2, 2, 3, 4, 5)).astype(np.float32)
    decoded = decode_payload(encode_payload(array))
    assert decoded.dtype == np.float32 and decoded.shape == array.shape
    assert np.array_equal(decoded, array)


def test_frames_round_trip_and_reject_garbage():
    keys = keys_of(list(range(12)))
    blocks = [(k, bytes([i]) * (10 + i)) for i, k in enumerate(keys)]
    assert unpack_blocks(pack_blocks(blocks)) == blocks
    puts = [(keys[0], None, b"a"), (keys[1], keys[0], b"bb")]
    assert unpack_puts(pack_puts(puts)) == puts
    assert unpack_keys(b"".join(keys)) == keys
    for garbage in (b"x" * 5, pack_blocks(blocks)[:-3]):
        with pytest.raises(ValueError):
            unpack_blocks(garbage)
    with pytest.raises(ValueError):
        unpack_keys(b"x" * 17)
    with pytest.raises(ValueError):
        unpack_puts(pack_puts(puts)[:-1])


# -- pool ---------------------------------------------------------------------------------------
def test_pool_respects_its_budget_and_evicts_least_recent_leaves_first():
    pool = BlockPool(budget_bytes=100)
    chain = keys_of(list(range(16)))  # 4 blocks: root → … → leaf
    for index, key in enumerate(chain):
        assert pool.put(key, b"x" * 20, chain[index - 1] if index else None)
    other = keys_of([9] * 4)[0]
    pool.get(chain[0])  # the chain's root is the most recently used, but it has a child
    assert pool.put(other, b"y" * 30, None)  # needs 10 more bytes → evict one block
    assert pool.used_bytes <= 100
    assert chain[3] not in pool and chain[0] in pool  # the leaf went, not the (recent) root
    assert pool.prefix(chain) == [b"x" * 20] * 3
    for n in range(50):  # sustained pressure: never over budget
        pool.put(keys_of([n] * 4)[0], b"z" * 25, None)
        assert pool.used_bytes <= 100
    assert pool.evictions > 0
    assert not pool.put(keys_of([1000] * 4)[0], b"w" * 101, None)  # bigger than the budget


def test_rendezvous_moves_only_the_lost_nodes_keys():
    nodes = ["http://a", "http://b", "http://c"]
    keys = [keys_of([n] * 4)[0] for n in range(300)]
    placed = {k: owner(k, nodes) for k in keys}
    counts = {n: list(placed.values()).count(n) for n in nodes}
    assert min(counts.values()) > 60  # spread over every node
    survivors = ["http://a", "http://c"]
    for key, node in placed.items():
        if node != "http://b":
            assert owner(key, survivors) == node


def test_client_with_only_a_dead_node_is_a_miss_not_an_error():
    client = KVClient(["http://127.0.0.1:9"], local_budget_bytes=1 << 20, timeout_s=0.5, retry_after_s=30)
    try:
        keys = keys_of(list(range(8)))
        fetched = client.fetch_prefix(keys)
        assert fetched.payloads == [] and client.stats.node_errors == 1
        client.store([(keys[0], None, b"p0"), (keys[1], keys[0], b"p1")])
        assert client.flush(5)
        assert client.fetch_prefix(keys).payloads == [b"p0", b"p1"]  # the local tier still works
    finally:
        client.close()


# -- generator (tiny model, local pool) ------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny():
    from serving.answer.generator import load_generator

    return load_generator("tiny:1", kv=KVClient([], local_budget_bytes=64 << 20), block_size=16)


def test_greedy_output_with_the_local_pool_equals_output_without(tiny):
    rng = np.random.default_rng(3)
    shared = rng.integers(0, 256, 80).tolist()
    for tail_length in (5, 16, 37):
        prompt = shared + rng.integers(0, 256, tail_length).tolist()
        cold = tiny.generate(prompt, max_new_tokens=24, use_cache=False, keep_logits=True)
        first = tiny.generate(prompt, max_new_tokens=24, keep_logits=True)
        warm = tiny.generate(prompt, max_new_tokens=24, keep_logits=True)
        assert warm.hit_tokens >= 80 and warm.local_hit_tokens == warm.hit_tokens
        assert cold.token_ids == first.token_ids == warm.token_ids
        assert torch.allclose(cold.first_logits, warm.first_logits, atol=1e-4)


def test_sampled_output_is_reproducible_with_a_seed_and_the_cache(tiny):
    prompt = list(range(40, 120))
    cold = tiny.generate(prompt, max_new_tokens=16, greedy=False, seed=7, use_cache=False)
    tiny.generate(prompt, max_new_tokens=1)
    warm = tiny.generate(prompt, max_new_tokens=16, greedy=False, seed=7)
    assert warm.hit_tokens > 0 and warm.token_ids == cold.token_ids


def test_a_damaged_cached_block_is_recomputed_not_used(tiny):
    prompt = list(range(100, 180))
    reference = tiny.generate(prompt, max_new_tokens=8, use_cache=False)
    keys = block_keys(prompt, block_size=16, model_id=tiny.model_id, dtype=tiny.dtype)
    tiny.kv.local.put(keys[0], encode_payload(np.zeros((1, 2, 3), np.float32)), None)  # wrong shape
    result = tiny.generate(prompt, max_new_tokens=8)
    assert result.hit_tokens == 0 and result.token_ids == reference.token_ids
