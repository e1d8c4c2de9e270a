"""Passage-level KV reuse on a tiny Llama (real model code, random weights): RoPE re-rotation,
blending at 100 % recompute equals full prefill, reuse across orders, an exact prefix taken
first, damaged passage KV."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from serving.answer.blend import Segment, SegmentedPrompt, rerotate
from serving.answer.passages import cache_passages
from serving.kvcache.blocks import decode_payload, encode_payload, passage_key
from serving.kvcache.client import KVClient


@pytest.fixture()
def tiny():
    from serving.answer.generator import load_generator

    return load_generator("tiny:1", kv=KVClient([], local_budget_bytes=64 << 20), block_size=16)


def rag_prompt(passages: list[list[int]], question: list[int], prefix: list[int] | None = None) -> SegmentedPrompt:
    segments = []
    for number, passage in enumerate(passages, start=1):
        segments += [Segment((200 + number, 7), False), Segment(tuple(passage), True)]
    segments.append(Segment(tuple(question), False))
    return SegmentedPrompt(prefix if prefix is not None else list(range(1, 41)), segments)


def passages_of(seed: int, count: int = 4, length: int = 30) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(10, 250, length).tolist() for _ in range(count)]


def tiny_cache_arg(model) -> str:
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def keys_at(model, ids: list[int], start: int) -> list[torch.Tensor]:
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    positions = torch.arange(start, start + len(ids))[None, :]
    with torch.inference_mode():
        model(input_ids=torch.tensor([ids]), position_ids=positions, use_cache=True, **{tiny_cache_arg(model): cache})
    return [layer.keys for layer in cache.layers]


def test_rerotated_keys_equal_the_passage_computed_at_its_new_position(tiny):
    model = tiny.model
    passage = passages_of(1, 1, 48)[0]
    inv_freq = model.model.rotary_emb.inv_freq
    at_zero = keys_at(model, passage, 0)
    for start in (1, 37, 300, 900):
        moved = keys_at(model, passage, start)
        for layer, (k0, k1) in enumerate(zip(at_zero, moved, strict=True)):
            rotated = rerotate(k0, start, inv_freq)
            assert torch.allclose(rotated, k1, atol=1e-4), (start, layer, (rotated - k1).abs().max())
            if start:
                assert not torch.allclose(k0, k1, atol=1e-2)  # the rotation did something


def test_full_recompute_is_token_for_token_the_full_prefill(tiny):
    for seed in range(4):
        prompt = rag_prompt(passages_of(seed), [60 + seed, 61, 62, 63, 64])
        full = tiny.generate(prompt.ids(), max_new_tokens=32, use_cache=False, keep_logits=True)
        assert cache_passages(tiny, prompt) == 4  # the passages cached, this prompt never run
        blended = tiny.generate(prompt, max_new_tokens=32, kv_reuse="passage", recompute_fraction=1.0,
                                keep_logits=True)
        assert blended.kv_reuse == "passage" and blended.hit_tokens >= 4 * 30
        assert blended.blended_tokens == len(prompt.ids()) - 42  # from the first passage on
        assert blended.token_ids == full.token_ids
        assert torch.allclose(blended.first_logits, full.first_logits, atol=1e-4)


def test_passages_are_reused_in_any_order_and_combination(tiny):
    passages = passages_of(7, 5)
    first = tiny.generate(rag_prompt(passages[:3], [70, 71]), max_new_tokens=4, kv_reuse="passage")
    assert first.hit_tokens == 0  # nothing cached: every passage computed (and stored)
    shuffled = rag_prompt([passages[2], passages[0], passages[1]], [80, 81, 82])
    again = tiny.generate(shuffled, max_new_tokens=4, kv_reuse="passage", recompute_fraction=0.15)
    assert again.hit_tokens >= 3 * 30 and again.local_hit_tokens == again.hit_tokens
    assert again.recomputed_tokens < again.prompt_tokens // 2
    mixed = tiny.generate(rag_prompt([passages[4], passages[1]], [90]), max_new_tokens=4, kv_reuse="passage")
    assert mixed.hit_tokens >= 30 + 32  # passage 1 and the prefix blocks; passage 4 is new


def test_partial_recompute_stays_close_to_the_full_prefill(tiny):
    prompt = rag_prompt(passages_of(11), [50, 51, 52])
    full = tiny.generate(prompt.ids(), max_new_tokens=1, use_cache=False, keep_logits=True)
    cache_passages(tiny, prompt)
    errors = []
    for fraction in (0.0, 0.15, 0.5, 1.0):
        blended = tiny.generate(prompt, max_new_tokens=1, kv_reuse="passage", recompute_fraction=fraction,
                                keep_logits=True)
        errors.append(float((blended.first_logits - full.first_logits).abs().max()))
    assert errors[-1] < 1e-4
    # more recompute, closer to the full prefill — up to float32 noise: on this tiny model even no
    # recompute can land within ~1e-7 of the full prefill, where the order of two such errors is noise
    noise = 1e-6
    assert errors[0] + noise >= errors[2] and errors[2] + noise >= errors[-1]


def test_an_exact_repeat_is_an_exact_hit_not_a_blend(tiny):
    prompt = rag_prompt(passages_of(21), [33, 34])
    full = tiny.generate(prompt.ids(), max_new_tokens=16, use_cache=False, keep_logits=True)
    first = tiny.generate(prompt, max_new_tokens=16, kv_reuse="passage", recompute_fraction=0.0)
    assert first.hit_tokens == 0 and first.blended_tokens == 0  # every passage computed in place: exact
    assert first.token_ids == full.token_ids
    again = tiny.generate(prompt, max_new_tokens=16, kv_reuse="passage", recompute_fraction=0.0, keep_logits=True)
    usable = (len(prompt.ids()) - 1) // 16 * 16
    assert again.hit_tokens == usable and again.blended_tokens == 0  # the whole prompt's blocks, exact
    assert again.recomputed_tokens == len(prompt.ids()) - usable
    assert again.token_ids == full.token_ids
    assert torch.allclose(again.first_logits, full.first_logits, atol=1e-4)


def test_a_shared_opening_comes_exact_and_only_the_rest_is_blended(tiny):
    from serving.answer.passages import passage_prefill
    from serving.answer.result import GenerationResult

    p0, p1, p2 = passages_of(23, 3)
    tiny.generate(rag_prompt([p0, p1], [33]), max_new_tokens=1, kv_reuse="passage")  # exact blocks, p0 and p1 stored
    assert cache_passages(tiny, rag_prompt([p2], [1])) == 1
    later = rag_prompt([p0, p2], [35, 36])  # the same first 74 tokens (prefix, [1], p0, [2]): 4 whole blocks
    result = GenerationResult([], "", len(later.ids()))
    prefilled = passage_prefill(tiny, later, 0.0, result)
    assert result.hit_tokens == 64 + 30  # p0's last 8 tokens are computed in place, after the exact blocks
    assert result.blended_tokens == len(later.ids()) - 74  # p2 is the first reused passage
    p2_kv = torch.from_numpy(np.array(decode_payload(tiny.kv.local.prefix(
        [passage_key(p2, anchor_ids=later.prefix, model_id=tiny.model_id, dtype=tiny.dtype)])[0])))
    last = len(tiny.model.model.layers) - 1  # past the select layer, unrecomputed tokens keep the cached KV
    moved = rerotate(p2_kv[last, 0], 74 - 40, tiny.model.model.rotary_emb.inv_freq)
    assert torch.allclose(prefilled.cache.layers[last].keys[0, :, 74:104], moved, atol=1e-6)
    full = tiny.generate(later.ids(), max_new_tokens=1, use_cache=False, keep_logits=True)
    exact_part = tiny.generate(later, max_new_tokens=1, kv_reuse="passage", recompute_fraction=1.0, keep_logits=True)
    assert torch.allclose(exact_part.first_logits, full.first_logits, atol=1e-4)


def test_damaged_passage_kv_is_recomputed_never_an_error(tiny):
    passages = passages_of(5, 2)
    forward, backward = rag_prompt(passages, [44, 45]), rag_prompt(passages[::-1], [44, 45])
    reference = {name: tiny.generate(p.ids(), max_new_tokens=8, use_cache=False).token_ids
                 for name, p in (("forward", forward), ("backward", backward))}
    cache_passages(tiny, forward)
    warm = tiny.generate(backward, max_new_tokens=8, kv_reuse="passage", recompute_fraction=1.0)
    assert warm.hit_tokens == 40 + 2 * 30 and warm.token_ids == reference["backward"]
    key = passage_key(passages[0], anchor_ids=forward.prefix, model_id=tiny.model_id, dtype=tiny.dtype)
    assert key in tiny.kv.local
    tiny.kv.local.put(key, encode_payload(np.zeros((2, 2, 2, 3, 16), np.float32)), None)  # wrong shape
    damaged = tiny.generate(forward, max_new_tokens=8, kv_reuse="passage", recompute_fraction=1.0)
    assert damaged.token_ids == reference["forward"]
    assert damaged.hit_tokens == warm.hit_tokens - 30  # the damaged passage was not counted as a hit
    tiny.kv.local.put(key, b"garbage", None)
    garbled = tiny.generate(backward, max_new_tokens=8, kv_reuse="passage", recompute_fraction=1.0)
    assert garbled.token_ids == reference["backward"] and garbled.hit_tokens == warm.hit_tokens - 30
    healed = tiny.generate(backward, max_new_tokens=8, kv_reuse="passage", recompute_fraction=1.0)
    assert healed.hit_tokens == warm.hit_tokens  # the recomputed KV replaced the damaged entry


def test_passage_mode_without_segments_or_cache_falls_back_to_the_prefix_path(tiny):
    ids = list(range(30, 90))
    plain = tiny.generate(ids, max_new_tokens=6, kv_reuse="passage")
    assert plain.kv_reuse == "prefix"
    with pytest.raises(Exception, match="kv_reuse"):
        tiny.generate(ids, max_new_tokens=1, kv_reuse="blend")
