"""A collection's query defaults: the mode, fusion, weights and RRF offset a query gets when it
names none.

The weights that fuse BM25 with the vectors best depend on the corpus (on msmarco 0.8 / 0.2 gains
0.010 nDCG@10 over dense; on the dbpedia subset BM25 lowers the dense ranking at every weight:
docs/hybrid.md), so a collection carries its own: measured with ``shardrag eval --url`` on its
judged queries, set once (``PUT /v1/collections/{name}/query-defaults``, ``shardrag collections
defaults``, or the gateway config's ``query_defaults`` section for the collection it was started
with), then used by every query and answer that does not choose for itself (the framework
integrations choose: their frameworks name a mode). A query's own fields always win; a query
with a vector and no text stays dense (a lexical leg needs text).

JSON, in the cluster state, the REST body and the gateway config alike::

    {"mode": "hybrid", "fusion": "weighted", "weights": {"dense": 0.95, "lexical": 0.05}, "rrf_k": 60}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from retrieval.errors import ConfigError

DENSE, LEXICAL, HYBRID = "dense", "lexical", "hybrid"  # the modes (dense and lexical: the legs too)
RRF, WEIGHTED = "rrf", "weighted"  # the fusions (retrieval.fusion)
DEFAULT_FUSION = WEIGHTED
DEFAULT_RRF_K = 60
DEFAULT_WEIGHTS: Mapping[str, float] = {DENSE: 0.8, LEXICAL: 0.2}  # chosen on msmarco (docs/hybrid.md)
MAX_WEIGHT = 1000.0
MODES = (DENSE, LEXICAL, HYBRID)
FUSIONS = (RRF, WEIGHTED)
MAX_RRF_K = 10_000


@dataclass(slots=True, frozen=True)
class QueryDefaults:
    """What a query that names no mode (fusion, weights, rrf_k) is searched with."""

    mode: str = DENSE  # dense | lexical | hybrid
    fusion: str = DEFAULT_FUSION  # hybrid: weighted | rrf
    weights: Mapping[str, float] | None = None  # weighted: {"dense", "lexical"} (None: retrieval.fusion's)
    rrf_k: int = DEFAULT_RRF_K  # rrf: a document scores Σ 1/(rrf_k + rank)

    def validate(self, prefix: str = "query_defaults") -> QueryDefaults:
        """Itself, or a ConfigError naming the field (``prefix.weights.dense``, ...)."""
        if self.mode not in MODES:
            raise ConfigError(f"{prefix}.mode is one of {', '.join(MODES)}; got {self.mode!r}", field=f"{prefix}.mode")
        if self.fusion not in FUSIONS:
            raise ConfigError(f"{prefix}.fusion is one of {', '.join(FUSIONS)}; got {self.fusion!r}",
                              field=f"{prefix}.fusion")
        if isinstance(self.rrf_k, bool) or not isinstance(self.rrf_k, int) or not 0 <= self.rrf_k <= MAX_RRF_K:
            raise ConfigError(f"{prefix}.rrf_k is an integer from 0 to {MAX_RRF_K}; got {self.rrf_k!r}",
                              field=f"{prefix}.rrf_k")
        if self.weights is not None:
            if not isinstance(self.weights, Mapping) or set(self.weights) - {DENSE, LEXICAL}:
                raise ConfigError(f"{prefix}.weights is {{\"dense\": w, \"lexical\": w}}", field=f"{prefix}.weights")
            for leg in (DENSE, LEXICAL):
                weight = self.weights.get(leg, 0.0)
                if isinstance(weight, bool) or not isinstance(weight, (int, float)) or \
                        not 0.0 <= weight <= MAX_WEIGHT:
                    raise ConfigError(f"{prefix}.weights.{leg} is a number from 0 to {MAX_WEIGHT:g}; got {weight!r}",
                                      field=f"{prefix}.weights.{leg}")
            if not any(self.weights.get(leg, 0.0) > 0 for leg in (DENSE, LEXICAL)):
                raise ConfigError(f"{prefix}.weights: at least one leg must weigh more than 0",
                                  field=f"{prefix}.weights")
        return self

    @property
    def is_plain(self) -> bool:
        """Whether a query gets exactly what it would without defaults (its own fields' defaults)."""
        return self == PLAIN

    def leg_weights(self) -> dict[str, float] | None:
        """The weights as a query's ``weights`` field (both legs named), or None for retrieval.fusion's."""
        if self.weights is None:
            return None
        return {DENSE: float(self.weights.get(DENSE, 0.0)), LEXICAL: float(self.weights.get(LEXICAL, 0.0))}

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "fusion": self.fusion, "weights": self.leg_weights(), "rrf_k": self.rrf_k}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None, prefix: str = "query_defaults") -> QueryDefaults:
        """From the JSON form (absent keys take the plain defaults); validated."""
        if data is None:
            return PLAIN
        if not isinstance(data, Mapping):
            raise ConfigError(f"{prefix} is an object: {{\"mode\", \"fusion\", \"weights\", \"rrf_k\"}}",
                              field=prefix)
        unknown = sorted(set(data) - {"mode", "fusion", "weights", "rrf_k"})
        if unknown:
            raise ConfigError(f"unknown {prefix} keys: {[f'{prefix}.{u}' for u in unknown]}",
                              field=f"{prefix}.{unknown[0]}")
        weights = data.get("weights")
        return cls(mode=data.get("mode", DENSE), fusion=data.get("fusion", DEFAULT_FUSION),
                   weights=dict(weights) if isinstance(weights, Mapping) else weights,
                   rrf_k=data.get("rrf_k", DEFAULT_RRF_K)).validate(prefix)


PLAIN = QueryDefaults()
