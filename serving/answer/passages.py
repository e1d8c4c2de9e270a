"""The passage-reuse prefill of a generator: the prompt's prefix from the prefix-block chain, each
passage's KV from the passage cache (computed behind the prefix on a miss and stored in the
same tiers — local pool, kv-nodes), re-rotated to where the passage sits, then blended
(``serving.answer.blend``). Also cuts a chat prompt into those segments."""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from retrieval.errors import ConfigError
from serving.answer.blend import Segment, SegmentedPrompt, blended_prefill, llama_parts, rerotate
from serving.kvcache.blocks import BlockKey, block_keys, decode_payload, encode_payload, passage_key

if TYPE_CHECKING:
    from serving.answer.generator import Generator
    from serving.answer.result import GenerationResult

logger = logging.getLogger(__name__)
ANCHORS_KEPT = 4  # system prompts whose exact KV a generator keeps in memory


def segment_chat(tokenizer: Any, messages: Sequence[dict[str, str]], passages: Sequence[str]) -> SegmentedPrompt:
    """Cut the chat template's text at each passage (given verbatim, in order): the prefix runs up to
    the first passage's label (the ``[n]`` before it), labels and the question are computed
    segments, passages are reusable ones. Each piece is tokenized on its own, so a passage has the
    same token ids wherever it appears."""
    text = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)

    def tokens(piece: str) -> tuple[int, ...]:
        return tuple(int(t) for t in tokenizer(piece, add_special_tokens=False)["input_ids"]) if piece else ()

    cursor, pieces = 0, []
    for number, passage in enumerate(passages, start=1):
        found = text.find(passage, cursor) if passage else -1
        if found < 0:
            raise ConfigError(f"passage {number} does not occur in the messages (in order)", field="passages")
        pieces.append((text[cursor:found], False))
        pieces.append((passage, True))
        cursor = found + len(passage)
    pieces.append((text[cursor:], False))
    head = pieces[0][0]
    cut = head.rfind("[") if passages else len(head)
    cut = len(head) if cut < 0 else cut
    prompt = SegmentedPrompt(list(tokens(head[:cut])), [Segment(tokens(head[cut:]), False)])
    prompt.segments += [Segment(tokens(piece), passage) for piece, passage in pieces[1:]]
    prompt.segments = [s for s in prompt.segments if s.ids]
    prompt.validate()
    return prompt


def _passage_shape(generator: Generator, tokens: int) -> tuple[int, ...]:
    config = generator.model.config
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return (config.num_hidden_layers, 2, heads, tokens, head_dim)


def _decoded(generator: Generator, payload: bytes, tokens: int) -> np.ndarray | None:
    try:
        array = decode_payload(payload)
    except (ValueError, KeyError, TypeError, struct.error, UnicodeDecodeError) as exc:
        logger.warning("undecodable passage KV (%s): recomputing it", exc)
        return None
    if tuple(array.shape) != _passage_shape(generator, tokens) or array.dtype != np.dtype(generator.dtype):
        logger.warning("passage KV of shape %s %s does not fit: recomputing it", array.shape, array.dtype)
        return None
    return array


def _compute_passages(generator: Generator, prefix_kv: list[tuple[torch.Tensor, torch.Tensor]],
                      passages: Sequence[Sequence[int]]) -> list[torch.Tensor]:
    """Each passage's KV computed right behind the prefix, all in one batched forward:
    (layers, 2, kv_heads, tokens, head_dim) each. Shorter passages are padded on the right, which
    needs no mask: causal attention never lets a real token see the padding after it."""
    from transformers import DynamicCache

    count, longest = len(passages), max(len(ids) for ids in passages)
    batch = torch.zeros(count, longest, dtype=torch.long)
    for row, ids in enumerate(passages):
        batch[row, : len(ids)] = torch.tensor(list(ids))
    cache: Any = DynamicCache(config=generator.model.config)
    for layer, (keys, values) in enumerate(prefix_kv):
        cache.update(keys.expand(count, -1, -1, -1), values.expand(count, -1, -1, -1), layer)
    start = prefix_kv[0][0].shape[2] if prefix_kv else 0
    positions = torch.arange(start, start + longest, device=generator.device).expand(count, -1)
    generator.model(input_ids=batch.to(generator.device), position_ids=positions, use_cache=True,
                    **{generator.cache_arg: cache})
    return [torch.stack([torch.stack([layer.keys[row, :, start:start + len(ids)],
                                      layer.values[row, :, start:start + len(ids)]]) for layer in cache.layers])
            for row, ids in enumerate(passages)]


@dataclass(slots=True)
class PassagePrefill:
    cache: Any  # the filled DynamicCache
    logits: torch.Tensor  # the last prompt token's
    prefix_keys: list[BlockKey]  # the prompt's exact blocks, to write back from first_new_block on
    first_new_block: int
    after_first_token: Callable[[], None] | None  # compute and store the passages that were missing


def _anchor_kv(generator: Generator, prompt: SegmentedPrompt, keys: Sequence[BlockKey],
               result: GenerationResult) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], int, bool]:
    """The system prompt's exact KV (kept in memory, else from the prefix blocks, else computed),
    how many of its tokens came from a cache, and whether its blocks are known to be stored."""
    from transformers import DynamicCache

    anchor = len(prompt.prefix)
    anchor_id = passage_key((), anchor_ids=prompt.prefix, model_id=generator.model_id, dtype=generator.dtype)
    prefix_kv = generator.anchors.get(anchor_id)
    if prefix_kv is not None:  # the system prompt's exact KV, kept in memory (a few MB)
        generator.anchors.move_to_end(anchor_id)
        result.hit_tokens += anchor
        result.local_hit_tokens += anchor
        return prefix_kv, anchor, True
    cache: Any = DynamicCache(config=generator.model.config)
    cached = generator.load_prefix(keys[: anchor // generator.block_size], cache, result)
    if cached < anchor:
        generator.model(input_ids=torch.tensor([prompt.prefix[cached:]], device=generator.device),
                        use_cache=True, **{generator.cache_arg: cache})
    prefix_kv = [(layer.keys, layer.values) for layer in cache.layers] if prompt.prefix else []
    generator.anchors[anchor_id] = prefix_kv
    while len(generator.anchors) > ANCHORS_KEPT:
        generator.anchors.popitem(last=False)
    return prefix_kv, cached, cached >= anchor - anchor % generator.block_size


def _exact_chain(generator: Generator, keys: Sequence[BlockKey], usable: int, anchor: int,
                 prefix_kv: list[tuple[torch.Tensor, torch.Tensor]],
                 result: GenerationResult) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], int]:
    """Extend the anchor's KV with the prompt's own cached blocks past it — an earlier prompt that
    began the same way (same passages in the same order) left them, exact. Returns the exact KV
    and its length in tokens."""
    bs = generator.block_size
    first = anchor // bs
    if usable <= first or not prefix_kv:
        return prefix_kv, anchor
    tensor, fetched = generator.fetch_chain(keys[first:usable])
    end = (first + len(fetched.payloads)) * bs
    if tensor is None or end <= anchor:
        return prefix_kv, anchor
    kept = first * bs
    exact = [(torch.cat([k[:, :, :kept], tensor[layer, 0].unsqueeze(0)], dim=2),
              torch.cat([v[:, :, :kept], tensor[layer, 1].unsqueeze(0)], dim=2))
             for layer, (k, v) in enumerate(prefix_kv)]
    local_new = max(0, kept + fetched.local_blocks * bs - anchor)
    result.hit_tokens += end - anchor
    result.local_hit_tokens += local_new
    result.remote_hit_tokens += end - anchor - local_new
    result.bytes_fetched += fetched.remote_bytes
    return exact, end


def passage_prefill(generator: Generator, prompt: SegmentedPrompt, fraction: float,
                    result: GenerationResult) -> PassagePrefill:
    """The prompt's longest exact prefix comes first: the system prompt, then any blocks an earlier
    prompt with the same opening left (an exact repeat is an exact hit, as in prefix mode). Past it,
    each passage comes from the passage cache and is blended; a passage that is not cached yet is
    computed in place, as a new token (exact, with the passages before it), so a miss costs about
    what a prefill costs, and its standalone KV is computed and stored after the first token is out.
    Only blocks before the first reused passage are exact, so only those are written back."""
    from transformers import DynamicCache

    _, rotary = llama_parts(generator.model)
    kv = generator.kv
    assert kv is not None
    prompt.validate()
    ids = prompt.ids()
    bs = generator.block_size
    keys = block_keys(ids, block_size=bs, model_id=generator.model_id, dtype=generator.dtype)
    usable = (len(ids) - 1) // bs  # at least one token is computed
    anchor = len(prompt.prefix)
    prefix_kv, cached, anchor_stored = _anchor_kv(generator, prompt, keys, result)
    exact_kv, exact = _exact_chain(generator, keys, usable, anchor, prefix_kv, result)
    # a passage the exact prefix runs into is computed in place: its rest is the prompt's last partial
    # block (under block_size tokens) unless a block in the middle was lost, and an exact repeat stays exact
    spans = [(start, segment) for start, segment in prompt.passage_spans() if start >= exact]
    span_keys = [passage_key(s.ids, anchor_ids=prompt.prefix, model_id=generator.model_id, dtype=generator.dtype)
                 for _, s in spans]
    wanted = dict(zip(span_keys, (s for _, s in spans), strict=True))  # a passage given twice is fetched once
    found, remote = kv.fetch_many(list(wanted)) if wanted else ({}, set())
    passage_kv: dict[BlockKey, torch.Tensor] = {}
    for key, segment in wanted.items():
        array = _decoded(generator, found[key], len(segment.ids)) if key in found else None
        if array is None:
            continue
        passage_kv[key] = torch.from_numpy(np.array(array)).to(generator.device)
        if key in remote:
            result.bytes_fetched += len(found[key])
            kv.local.put(key, found[key], None)  # warm the local tier with what was valid
    inv_freq = rotary.inv_freq
    moved, positions = [], []
    for (start, segment), key in zip(spans, span_keys, strict=True):
        tensor = passage_kv.get(key)
        if tensor is None:
            continue
        moved.append(torch.stack([rerotate(tensor[:, 0], start - anchor, inv_freq), tensor[:, 1]], dim=1))
        positions.append(torch.arange(start, start + len(segment.ids)))
        result.hit_tokens += len(segment.ids)
        if key in remote:
            result.remote_hit_tokens += len(segment.ids)
        else:
            result.local_hit_tokens += len(segment.ids)
    reused_kv = torch.cat(moved, dim=3) if moved else None
    reused_positions = torch.cat(positions) if positions else torch.zeros(0, dtype=torch.long)
    logits, layers, stats = blended_prefill(generator.model, ids, exact_kv, reused_positions, reused_kv, fraction)
    filled = DynamicCache(config=generator.model.config)
    for layer, (layer_keys, layer_values) in enumerate(layers):
        filled.update(layer_keys, layer_values, layer)
    result.recomputed_tokens = stats.recomputed_tokens + stats.new_tokens + anchor - cached
    exact_end = int(reused_positions[0]) if len(reused_positions) else len(ids)
    result.blended_tokens = len(ids) - exact_end
    missing = [key for key in wanted if key not in passage_kv]
    anchor_kv = prefix_kv

    def store_missing() -> None:
        _store_passages(generator, anchor_kv, {key: wanted[key] for key in missing})

    known = exact // bs if exact > anchor else (anchor // bs if anchor_stored else cached // bs)
    return PassagePrefill(filled, logits, keys[: exact_end // bs], known, store_missing if missing else None)


@torch.inference_mode()
def cache_passages(generator: Generator, prompt: SegmentedPrompt) -> int:
    """Compute and store the standalone KV of every passage of ``prompt`` not cached yet, without
    running the prompt (warming a cache ahead of traffic); returns how many were computed."""
    kv = generator.kv
    if kv is None:
        raise ConfigError("caching passages needs a KV cache", field="kv")
    from serving.answer.result import GenerationResult

    result = GenerationResult([], "", len(prompt.ids()))  # the counts of a warm-up are not reported
    prefix_kv, _, _ = _anchor_kv(generator, prompt, block_keys(prompt.prefix, block_size=generator.block_size,
                                                                model_id=generator.model_id,
                                                                dtype=generator.dtype), result)
    wanted = {passage_key(s.ids, anchor_ids=prompt.prefix, model_id=generator.model_id, dtype=generator.dtype): s
              for _, s in prompt.passage_spans()}
    found, _ = kv.fetch_many(list(wanted))
    missing = [key for key in wanted if key not in found or _decoded(generator, found[key],
                                                                      len(wanted[key].ids)) is None]
    if missing:
        _store_passages(generator, prefix_kv, {key: wanted[key] for key in missing})
    return len(missing)


def _store_passages(generator: Generator, anchor_kv: list[tuple[torch.Tensor, torch.Tensor]],
                    passages: dict[BlockKey, Segment]) -> None:
    """Compute each passage's standalone KV behind the anchor and store it in every tier."""
    assert generator.kv is not None
    computed = _compute_passages(generator, anchor_kv, [segment.ids for segment in passages.values()])
    generator.kv.store([(key, None, encode_payload(tensor.cpu().numpy()))
                        for key, tensor in zip(passages, computed, strict=True)])
