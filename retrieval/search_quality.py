"""Retrieval quality through a running gateway: a BEIR dataset's judged queries sent as text to
``POST /v1/query`` under each search setting — dense, lexical (BM25), hybrid rrf, hybrid weighted
at chosen per-leg weights — and nDCG@10, recall@10 and MRR@10 of what came back (and recall@k
when asked for k > 10). The queries ask for k hits as an application would: a hybrid's lists
depend on k (each leg brings at least k candidates), so nDCG@10 is measured at the k it is for.

What ``shardrag eval --url`` prints, so that a collection's own judged queries choose its search
mode and fusion weights: on some corpora BM25 lowers a dense ranking at any weight, on others it
lifts it (docs/hybrid.md). ``benchmarks.hybrid_quality`` measures issue 36's figures with it. The
metrics are the offline evaluation's (``metrics_of``, used by ``training.evaluate`` too).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from retrieval.errors import ConfigError
from retrieval.ir_metrics import mrr_at_k, ndcg_at_k, recall_at_k

if TYPE_CHECKING:
    from retrieval.client import ShardragClient
    from retrieval.datasets import BeirDataset

MODES = ("dense", "lexical", "rrf", "weighted")  # what ``--modes`` may name
K = 10  # hits asked per query unless told: what nDCG@10 is measured on


@dataclass(frozen=True)
class SearchSetting:
    """One way to search: its label in a report and the ``/v1/query`` fields that select it."""

    label: str
    mode: str = "dense"
    fusion: str | None = None
    weights: Mapping[str, float] | None = field(default=None, hash=False)

    @property
    def dense_weight(self) -> float | None:
        return None if self.weights is None else self.weights["dense"]


def settings_for(modes: Sequence[str], dense_weights: Sequence[float] = ()) -> list[SearchSetting]:
    """The settings ``modes`` name (``MODES``; ``weighted`` at the gateway's default weights), then
    the weighted hybrid at each dense weight w of ``dense_weights`` (lexical 1 − w)."""
    unknown = [mode for mode in modes if mode not in MODES]
    if unknown:
        raise ConfigError(f"unknown mode(s) {', '.join(unknown)}: choose from {', '.join(MODES)}", field="modes")
    bad = [w for w in dense_weights if not 0.0 <= w <= 1.0]
    if bad:
        raise ConfigError(f"a dense weight is between 0 and 1 (the lexical leg gets 1 − w), got {bad[0]}",
                          field="weights")
    named = {"dense": SearchSetting("dense"), "lexical": SearchSetting("lexical", "lexical"),
             "rrf": SearchSetting("hybrid rrf", "hybrid", "rrf"),
             "weighted": SearchSetting("hybrid weighted", "hybrid", "weighted")}
    chosen = [named[mode] for mode in dict.fromkeys(modes)]
    for w in dict.fromkeys(round(w, 4) for w in dense_weights):
        chosen.append(SearchSetting(f"weighted w={w:g}", "hybrid", "weighted",
                                    {"dense": w, "lexical": round(1.0 - w, 4)}))
    if not chosen:
        raise ConfigError("nothing to evaluate: name a mode (dense, lexical, rrf, weighted) or a dense weight",
                          field="modes")
    return chosen


def dense_weights_from(text: str | None) -> list[float]:
    """``--weights``: dense weights, comma-separated, or ``start:stop:step`` (both ends included)."""
    if not text:
        return []
    try:
        if ":" in text:
            start, stop, step = (float(part) for part in text.split(":"))
            if step <= 0 or stop < start:
                raise ValueError
            count = int(round((stop - start) / step)) + 1
            return [round(start + i * step, 4) for i in range(count)]
        return [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ConfigError(f"--weights takes dense weights as 0.5,0.8,0.95 or start:stop:step (0.5:0.95:0.05), "
                          f"got {text!r}", field="weights") from None


def metrics_of(rankings: Mapping[str, Sequence[str]], qrels: Mapping[str, Mapping[str, int]],
               deepest: int = 100) -> dict[str, float]:
    """nDCG@10, recall@10, recall@``deepest`` (when deeper than 10) and MRR@10 of ranked doc ids per
    query (BEIR's judged ones)."""
    metrics = {"ndcg@10": ndcg_at_k(rankings, qrels, 10), "recall@10": recall_at_k(rankings, qrels, 10)}
    if deepest > 10:
        metrics[f"recall@{deepest}"] = recall_at_k(rankings, qrels, deepest)
    metrics["mrr@10"] = mrr_at_k(rankings, qrels, 10)
    return metrics


def rankings_of(client: ShardragClient, queries: Mapping[str, str], setting: SearchSetting, *,
                k: int = K, on_query: Callable[[], None] | None = None) -> dict[str, list[str]]:
    """Each query's top ``k`` doc ids as the gateway ranks them under ``setting`` (no texts in the replies)."""
    rankings = {}
    for query_id, text in queries.items():
        reply = client.query(text=text, k=k, with_text=False, mode=setting.mode, fusion=setting.fusion,
                             weights=dict(setting.weights) if setting.weights is not None else None)
        rankings[query_id] = [hit["doc_id"] for hit in reply["hits"]]
        if on_query is not None:
            on_query()
    return rankings


def evaluate_settings(client: ShardragClient, dataset: BeirDataset, settings: Sequence[SearchSetting], *,
                      k: int = K, show_progress: bool = False) -> list[dict[str, Any]]:
    """One row per setting: its label, mode, fusion, dense weight (weighted at explicit weights),
    k, the number of judged queries and the metrics (``metrics_of`` down to ``k``)."""
    if k < 10:
        raise ConfigError(f"k is at least 10 (nDCG@10 needs ten hits), got {k}", field="k")
    queries = dataset.judged_queries()
    if not queries:
        raise ConfigError(f"{dataset.name} has no query with a positive judgment to evaluate", field="dataset")
    bar: Any = None
    if show_progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(queries) * len(settings), desc="queries", unit="query")
    rows = []
    try:
        for setting in settings:
            rankings = rankings_of(client, queries, setting, k=k, on_query=bar.update if bar is not None else None)
            rows.append({"setting": setting.label, "mode": setting.mode, "fusion": setting.fusion,
                         "dense_weight": setting.dense_weight, "k": k, "queries": len(queries),
                         **metrics_of(rankings, dataset.qrels, k)})
    finally:
        if bar is not None:
            bar.close()
    return rows


def best_weight(rows: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The weighted row at explicit weights with the best nDCG@10 (a tie: the larger dense weight,
    the leg less likely to drag a ranking down), or None when there is none."""
    weighted = [row for row in rows if row.get("dense_weight") is not None]
    return max(weighted, key=lambda row: (row["ndcg@10"], row["dense_weight"])) if weighted else None
