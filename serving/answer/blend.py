"""Passage-level KV reuse (CacheBlend): a retrieved passage's KV is computed once, on its own,
and reused wherever the passage appears — in any order, next to any other passages.

A RAG prompt is a fixed prefix (system prompt), then passages with small labels between them,
then the question. A passage's KV is computed right after the prefix (the *anchor*, so every
passage sees the same system prompt as context, as it will in use) and cached under
(model, dtype, anchor, passage token ids) in the same tiers as prefix blocks. To use it at
another position, its keys are re-rotated (RoPE is a rotation by position, and rotations
compose: rotating a key computed at p by d gives the key at p + d).

What reuse loses is cross-passage attention: a cached passage never saw the passages before it.
``blended_prefill`` restores the part that matters: the first layers run over every token; at
``SELECT_LAYER`` the fresh K/V of each reused token is compared with its cached K/V, and the
tokens that deviate most (a ``fraction`` of them) are recomputed through every later layer, with
the labels and the question; the rest keep their cached K/V. ``fraction`` 1.0 recomputes everything — exactly a
full prefill; 0.0 recomputes only the new tokens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from retrieval.errors import ConfigError

ROTATION_COMPATIBLE = ("default", "linear", "llama3")  # rope types whose angle is linear in the position
# Layers 0..SELECT_LAYER-1 run over every token; the tokens to recompute are chosen at SELECT_LAYER.
# Measured on SmolLM2 (benchmarks/rag_passages.py, 6 prompts, 15 %): first-token KL to the full
# prefill 0.20 choosing at layer 1, 0.11 at layer 2, no better deeper (0.14 at 4, 0.12 at 8) for
# more work; choosing by the question's attention instead of KV deviation was worse (0.33).
SELECT_LAYER = 2


@dataclass(frozen=True, slots=True)
class Segment:
    ids: tuple[int, ...]
    passage: bool  # True: the KV may come from the passage cache; False: always computed


@dataclass(slots=True)
class SegmentedPrompt:
    """A prompt cut where passage KV can be reused: prefix, then segments in order."""

    prefix: list[int]
    segments: list[Segment] = field(default_factory=list)

    def ids(self) -> list[int]:
        return self.prefix + [t for s in self.segments for t in s.ids]

    def passage_spans(self) -> list[tuple[int, Segment]]:
        """(start position, segment) of every non-empty passage segment."""
        spans, position = [], len(self.prefix)
        for segment in self.segments:
            if segment.passage and segment.ids:
                spans.append((position, segment))
            position += len(segment.ids)
        return spans

    def validate(self) -> None:
        if not self.segments or self.segments[-1].passage or not self.segments[-1].ids:
            raise ConfigError("a segmented prompt must end with computed tokens (the question)", field="passages")


def llama_parts(model: Any) -> tuple[Any, Any]:
    """(decoder, rotary embedding) of a Llama-style causal LM, or a ConfigError."""
    decoder = getattr(model, "model", None)
    needed = ("embed_tokens", "layers", "norm", "rotary_emb")
    if decoder is None or not all(hasattr(decoder, name) for name in needed) or not hasattr(model, "lm_head"):
        raise ConfigError("passage KV reuse needs a Llama-style model (embed_tokens, layers, rotary_emb)",
                          field="kv_reuse")
    rotary = decoder.rotary_emb
    if getattr(rotary, "rope_type", "default") not in ROTATION_COMPATIBLE or \
            float(getattr(rotary, "attention_scaling", 1.0)) != 1.0:
        raise ConfigError(f"passage KV reuse needs a RoPE linear in the position, not {rotary.rope_type!r}",
                          field="kv_reuse")
    return decoder, rotary


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rerotate(keys: torch.Tensor, delta: int, inv_freq: torch.Tensor) -> torch.Tensor:
    """Keys (..., tokens, head_dim) computed at positions p moved to p + delta."""
    if delta == 0:
        return keys
    angles = (float(delta) * inv_freq.double()).to(keys.device)
    emb = torch.cat((angles, angles))
    cos, sin = emb.cos().to(keys.dtype), emb.sin().to(keys.dtype)
    rotated: torch.Tensor = keys * cos + rotate_half(keys) * sin
    return rotated


@dataclass(slots=True)
class BlendStats:
    recomputed_tokens: int = 0  # reused tokens recomputed through the later layers
    new_tokens: int = 0


def _project(layer: Any, hidden: torch.Tensor, cos: torch.Tensor,
             sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    attention = layer.self_attn
    x = layer.input_layernorm(hidden)
    shape = (1, hidden.shape[1], -1, attention.head_dim)
    q = attention.q_proj(x).view(shape).transpose(1, 2)
    k = attention.k_proj(x).view(shape).transpose(1, 2)
    v = attention.v_proj(x).view(shape).transpose(1, 2)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin, v


def _attend(layer: Any, hidden: torch.Tensor, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
            positions: torch.Tensor) -> torch.Tensor:
    """Finish the decoder layer for the tokens at ``positions``, attending causally to all keys."""
    attention = layer.self_attn
    repeat = q.shape[1] // keys.shape[1]  # grouped-query attention: each K/V head serves `repeat` heads
    allowed = torch.arange(keys.shape[2], device=q.device)[None, :] <= positions[:, None]
    out = F.scaled_dot_product_attention(q, keys.repeat_interleave(repeat, dim=1),
                                         values.repeat_interleave(repeat, dim=1), attn_mask=allowed,
                                         scale=attention.scaling)
    hidden = hidden + attention.o_proj(out.transpose(1, 2).reshape(1, q.shape[2], -1))
    finished: torch.Tensor = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
    return finished


@torch.inference_mode()
def blended_prefill(model: Any, token_ids: Sequence[int], prefix_kv: Sequence[tuple[torch.Tensor, torch.Tensor]],
                    reused_positions: torch.Tensor, reused_kv: torch.Tensor | None, fraction: float,
                    select_layer: int = SELECT_LAYER,
                    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]], BlendStats]:
    """Prefill ``token_ids`` given the prefix's exact K/V (per layer, (1, kv_heads, P, head_dim))
    and, for the reused positions (ascending), their cached K/V already at their position:
    ``reused_kv`` of shape (layers, 2, kv_heads, len(reused_positions), head_dim). Returns the
    last token's logits and every layer's K/V for the whole prompt."""
    if not 0.0 <= fraction <= 1.0:
        raise ConfigError("recompute_fraction must be in [0, 1]", field="recompute_fraction")
    decoder, rotary = llama_parts(model)
    device = next(model.parameters()).device
    total, start = len(token_ids), prefix_kv[0][0].shape[2] if prefix_kv else 0
    rest = torch.arange(start, total, device=device)
    is_reused = torch.zeros(total, dtype=torch.bool, device=device)
    order = reused_positions.to(device=device, dtype=torch.long)
    has_reused = reused_kv is not None and len(order) > 0
    if has_reused:
        is_reused[order] = True
    new_positions = rest[~is_reused[rest]]
    if len(new_positions) == 0 or int(new_positions[-1]) != total - 1:
        raise ConfigError("the last prompt token must be computed, not reused", field="passages")
    stats = BlendStats(new_tokens=len(new_positions))
    layers = decoder.layers
    config = model.config
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = layers[0].self_attn.head_dim
    dtype = next(model.parameters()).dtype
    keys_all = torch.zeros(len(layers), 1, heads, total, head_dim, dtype=dtype, device=device)
    values_all = torch.zeros_like(keys_all)
    for index, (keys, values) in enumerate(prefix_kv):
        keys_all[index, :, :, :start], values_all[index, :, :, :start] = keys, values
    if has_reused:
        assert reused_kv is not None
        keys_all[:, 0, :, order], values_all[:, 0, :, order] = reused_kv[:, 0].to(device), reused_kv[:, 1].to(device)
    caches = [(keys_all[index], values_all[index]) for index in range(len(layers))]
    # with nothing to select, only the new tokens are ever computed
    select_at = min(select_layer, len(layers) - 1) if fraction > 0 and has_reused else None
    active = rest if select_at is not None else new_positions
    ids = torch.tensor([list(token_ids)], device=device)
    hidden = decoder.embed_tokens(ids[:, active])
    cos_all, sin_all = rotary(hidden, torch.arange(total, device=device)[None, :])
    for index, layer in enumerate(layers):
        keys, values = caches[index]
        q, k, v = _project(layer, hidden, cos_all[:, active], sin_all[:, active])
        if index == select_at:
            candidates = is_reused[active]
            deviation = ((k - keys[:, :, active]) ** 2).sum(dim=(0, 1, 3)) + \
                ((v - values[:, :, active]) ** 2).sum(dim=(0, 1, 3))
            deviation = torch.where(candidates, deviation, torch.full_like(deviation, -1.0))
            chosen = math.ceil(fraction * int(candidates.sum()))
            top = torch.topk(deviation, chosen).indices if chosen else deviation.new_zeros(0, dtype=torch.long)
            keep = ~candidates
            keep[top] = True
            stats.recomputed_tokens = chosen
            keys[:, :, active], values[:, :, active] = k, v  # fresh at this layer for every computed token
            hidden, q, active = hidden[:, keep], q[:, :, keep], active[keep]
        else:
            keys[:, :, active], values[:, :, active] = k, v
        hidden = _attend(layer, hidden, q, keys, values, active)
    logits = model.lm_head(decoder.norm(hidden[:, -1:]))[0, -1].float()
    return logits, caches, stats
