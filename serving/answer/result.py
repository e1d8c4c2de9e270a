"""What one generation produced and what the cache did for it (hits per tier, recompute, timings)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(slots=True)
class GenerationResult:
    token_ids: list[int]
    text: str
    prompt_tokens: int
    hit_tokens: int = 0
    local_hit_tokens: int = 0
    remote_hit_tokens: int = 0
    bytes_fetched: int = 0
    kv_reuse: str = "prefix"
    recomputed_tokens: int = 0  # prompt tokens run through the model (the rest came from the cache)
    blended_tokens: int = 0  # prompt tokens from the first reused passage on: their KV is approximate
    ttft_s: float = 0.0
    prefill_s: float = 0.0
    total_s: float = 0.0
    first_logits: torch.Tensor | None = field(default=None, repr=False)

    @property
    def tier(self) -> str:
        return "remote" if self.remote_hit_tokens else "local" if self.local_hit_tokens else "none"

    def stats(self) -> dict[str, Any]:
        decode_s = max(self.total_s - self.ttft_s, 1e-9)
        return {"prompt_tokens": self.prompt_tokens, "hit_tokens": self.hit_tokens,
                "local_hit_tokens": self.local_hit_tokens, "remote_hit_tokens": self.remote_hit_tokens,
                "hit_rate": self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0, "tier": self.tier,
                "bytes_fetched": self.bytes_fetched, "kv_reuse": self.kv_reuse,
                "recomputed_tokens": self.recomputed_tokens, "blended_tokens": self.blended_tokens,
                "ttft_ms": self.ttft_s * 1000.0,
                "prefill_ms": self.prefill_s * 1000.0, "total_ms": self.total_s * 1000.0,
                "new_tokens": len(self.token_ids),
                "tokens_per_s": (len(self.token_ids) - 1) / decode_s if len(self.token_ids) > 1 else 0.0}
