"""The quality gate of an activation: run a sample of queries on the old and the new version and
compare — overlap@10 of their top 10s always, nDCG@10 of each when qrels are given.

The search itself is injected (``search(text, version, k)`` → ranked doc ids), so the gate knows
nothing of encoders or fan-out.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from retrieval.errors import ConfigError
from retrieval.ir_metrics import ndcg_at_k, overlap_at_k

SearchFn = Callable[[str, str, int], Awaitable[list[str]]]  # (text, version, k) → doc ids, best first
Queries = Sequence[str] | Mapping[str, str]  # texts, or query id → text (to use qrels)
Qrels = Mapping[str, Mapping[str, int]]


@dataclass(slots=True, frozen=True)
class GateSettings:
    min_overlap: float = 0.5  # mean overlap@10 of old vs new top-10 at least this
    max_ndcg_drop: float = 0.02  # with qrels: nDCG@10 may drop at most this much
    sample: int = 50  # queries the gate runs (recent ones when none are given)
    # The share of its wall time the gate may spend searching: below 1 it pauses after each query
    # pair (as long again at 0.5), so live queries on a busy host queue behind gate work less often,
    # for a longer activation (ONNX 1.0 → 1.45 s, torch 1.8 → 3.9 s). Measured over ten rollouts
    # each, the activating phase's p99 over the quiet p99 of the same run: ONNX ×2.15 → ×1.36,
    # torch ×2.25 → ×1.39 (docs/benchmarks.md, rollout); 1 turns the pacing off.
    busy_share: float = 0.5

    def validate(self) -> None:
        if not 0 <= self.min_overlap <= 1:
            raise ConfigError("gate.min_overlap must be in [0, 1]", field="gate.min_overlap")
        if not 0 < self.busy_share <= 1:
            raise ConfigError("gate.busy_share must be in (0, 1]", field="gate.busy_share")
        if self.sample <= 0:
            raise ConfigError("gate.sample must be > 0", field="gate.sample")


async def quality_gate(old: str, new: str, queries: Queries | None, qrels: Qrels | None, *, search: SearchFn,
                       settings: GateSettings, recent: Sequence[str], encoders_loaded: bool) -> dict[str, Any]:
    """The gate's verdict: ``passed``, ``reason`` and the numbers behind them."""
    if isinstance(queries, Mapping):
        sample = dict(list(queries.items())[: settings.sample])
    else:
        texts = list(queries) if queries is not None else list(dict.fromkeys(reversed(recent)))
        sample = {f"q{i}": t for i, t in enumerate(texts[: settings.sample])}
    result: dict[str, Any] = {"queries": len(sample), "min_overlap": settings.min_overlap,
                              "max_ndcg_drop": settings.max_ndcg_drop}
    if not sample:
        return {**result, "passed": False, "reason": "no queries to compare: pass queries (or force)"}
    if not encoders_loaded:
        return {**result, "passed": False,
                "reason": "the gate compares text queries and this gateway runs without encoders (force to skip)"}
    rankings: dict[str, dict[str, list[str]]] = {old: {}, new: {}}

    async def run(query_id: str, text: str, version: str) -> None:
        rankings[version][query_id] = await search(text, version, 10)

    # One gate query at a time: its texts join the live encoder batches one by one instead of
    # queueing a whole sample in front of the live traffic (measured: a 400 ms stall otherwise).
    for query_id, text in sample.items():
        started = time.monotonic()
        await asyncio.gather(run(query_id, text, old), run(query_id, text, new))
        if settings.busy_share < 1:
            await asyncio.sleep((time.monotonic() - started) * (1 / settings.busy_share - 1))
    overlaps = [overlap_at_k(rankings[new][q], rankings[old][q], 10) for q in sample]
    result["overlap_at_10"] = round(sum(overlaps) / len(overlaps), 4)
    reasons = []
    if result["overlap_at_10"] < settings.min_overlap:
        reasons.append(f"overlap@10 {result['overlap_at_10']:.3f} < {settings.min_overlap}")
    if qrels:
        judged = {q: dict(qrels[q]) for q in sample if q in qrels}
        if judged:
            result["ndcg_at_10"] = {"old": round(ndcg_at_k(rankings[old], judged, 10), 4),
                                    "new": round(ndcg_at_k(rankings[new], judged, 10), 4)}
            drop = result["ndcg_at_10"]["old"] - result["ndcg_at_10"]["new"]
            if drop > settings.max_ndcg_drop:
                reasons.append(f"nDCG@10 drops by {drop:.3f} > {settings.max_ndcg_drop}")
    result["passed"] = not reasons
    result["reason"] = "; ".join(reasons) if reasons else "passed"
    return result
