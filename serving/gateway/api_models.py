"""Request and response models of the gateway's public API (they also make its OpenAPI schema)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import Path
from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from clusterstate.collections import NAME_PATTERN
from httpkit.api import ERROR_RESPONSES, JSON_INTEGER, ErrorDetail, ErrorResponse, FiniteFloat, PositiveInt
from retrieval.blank import NON_BLANK_PATTERN
from retrieval.fusion import DEFAULT_WEIGHTS, DENSE, LEXICAL

__all__ = ["ERROR_RESPONSES", "ErrorDetail", "ErrorResponse", "QueryRequest", "QueryResponse", "StageCommand",
           "ActivateCommand", "RetireCommand", "VersionCommand", "NamePath", "DocIdPath"]

KnobInt = Annotated[int, Field(ge=1, le=65536), JSON_INTEGER]
SeqInt = Annotated[int, Field(ge=0), JSON_INTEGER]
NamePath = Annotated[str, Path(pattern=NAME_PATTERN.pattern, description="collection name")]
# A document id in a path: the schema says "not blank" as the write bodies do; the write service's
# own check refuses a blank one (422 naming "id"), so the pattern is the schema's only, not FastAPI's.
DocIdPath = Annotated[str, Path(description="the document's id", json_schema_extra={"pattern": NON_BLANK_PATTERN})]
# Embedding version ids: encoder name, weights hash, preprocessing hash — a file-name-safe token.
VERSION_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,199}$"


class LegWeights(BaseModel):
    # both legs at 0 is refused (below); the schema says so, so that what it allows is accepted
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"anyOf": [
        {"properties": {"dense": {"exclusiveMinimum": 0}}}, {"properties": {"lexical": {"exclusiveMinimum": 0}}}]})

    dense: Annotated[float, Field(ge=0, le=1000)] = DEFAULT_WEIGHTS[DENSE]
    lexical: Annotated[float, Field(ge=0, le=1000)] = DEFAULT_WEIGHTS[LEXICAL]

    @model_validator(mode="after")
    def _some_leg_counts(self) -> LegWeights:
        # both at 0 would score every document 0: a ranking by doc id, never what was meant
        if self.dense == 0 and self.lexical == 0:
            raise PydanticCustomError("weights", "at least one leg must weigh more than 0")
        return self


class LegRankModel(BaseModel):
    rank: int | None = Field(description="the document's rank in this leg (from 1; weighted: null when it is below "
                             "the leg's top `candidates` on some shard)")
    score: float = Field(description="its score in this leg (cosine / inner product, or BM25)")


class QueryRequest(BaseModel):
    """Exactly one of ``text`` and ``vector``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    text: str | None = Field(None, description="query text, embedded by the gateway's encoder")
    vector: list[FiniteFloat] | None = Field(None, description="query vector of the collection's dimension")
    k: PositiveInt | None = Field(None, description="hits to return (default from config, at most max_k)")
    nprobe: KnobInt | None = Field(None, description="IVF lists to visit per shard")
    ef_search: KnobInt | None = Field(None, description="HNSW search breadth per shard")
    top_m: PositiveInt | None = Field(None, description="kmeans collections: query only the top_m nearest shards")
    timeout_ms: PositiveInt | None = Field(None, description="deadline for the whole query")
    with_text: bool = Field(True, description="return titles and texts with the hits")
    version: str | None = Field(None, pattern=VERSION_PATTERN,
                                description="embedding version to pin; 409 unless it is served")
    allow_partial: bool | None = Field(None, description="answer with the shards that made the deadline "
                                       "(default from config); false: 504 naming the missing shards")
    filter: dict[str, Any] | None = Field(
        None, description="only documents whose metadata match: {\"must\"|\"should\"|\"must_not\": [conditions]} "
        "with conditions {\"key\", \"match\": {\"value\"|\"any\"}}, {\"key\", \"range\": {gt, gte, lt, lte}}, "
        "{\"has_id\": [...]} or a nested filter (docs/filters.md)")
    with_metadata: bool = Field(False, description="return each hit's metadata")
    consistency: Literal["eventual", "session"] = Field(
        "eventual", description="session: only replicas that applied min_seq answer (read your writes)")
    min_seq: dict[str, SeqInt] | None = Field(
        None, description="per shard, the seq a write returned: what a session read must see")
    min_term: dict[str, SeqInt] | None = Field(
        None, description="per shard, the term a write returned (with min_seq): a replica whose log diverged "
        "in a failover never answers for it")
    exact: bool = Field(False, description="ask every shard for the full k (no per-shard top-k trimming; the "
                        "answer is the same either way, trimming only moves fewer hits)")
    mode: Literal["dense", "lexical", "hybrid"] = Field(
        "dense", description="dense: the vector index; lexical: BM25 over titles and texts, ranked as on one "
        "unsharded index; hybrid: both legs fused (docs/hybrid.md). Left out: the collection's query defaults "
        "(dense unless set; a query with a vector and no text is dense); so are fusion, rrf_k and weights")
    fusion: Literal["rrf", "weighted"] = Field(
        "weighted", description="hybrid: weighted (each leg's score normalized by its bounds — cosine to [0, 1], "
        "BM25 over the most the query's terms can score — times its weight, summed: the exact top k of every "
        "document) or rrf (reciprocal rank fusion of the legs' top `candidates`)")
    rrf_k: Annotated[int, Field(ge=0, le=10_000), JSON_INTEGER] = Field(
        60, description="rrf: a document scores Σ 1/(rrf_k + rank) over the legs")
    weights: LegWeights | None = Field(None, description="weighted: per-leg weights, 0–1000 each, not both 0 "
                                       "(default: the ones chosen on msmarco, docs/hybrid.md)")
    candidates: Annotated[int, Field(ge=1, le=1000), JSON_INTEGER] | None = Field(
        None, description="hybrid: rrf — hits each leg contributes to the fusion; weighted — how deep each leg is "
        "read first, and how deep leg ranks are reported (default max(k, 20))")
    group_by: str | None = Field(
        None, min_length=1, max_length=128, description="a metadata key: answer the k best groups of hits "
        "sharing its value (a group ranks by its best hit), each with its best group_size hits, group after group; "
        "documents without the key join none (docs/filters.md, \"Grouping\")")
    group_size: Annotated[int, Field(ge=1, le=100), JSON_INTEGER] | None = Field(
        None, description="group_by: hits per group (default 1; k × group_size at most limits.max_group_read); "
        "only with group_by (422 naming group_size otherwise)")


class HitModel(BaseModel):
    doc_id: str
    score: float
    shard: int
    version: str = Field(description="embedding version the score was computed in (always the response's)")
    title: str = ""
    text: str = ""
    metadata: dict[str, Any] | None = Field(None, description="the document's metadata (with_metadata)")
    legs: dict[str, LegRankModel] | None = Field(None, description="hybrid: where each leg that returned the "
                                                 "document ranked it, and its score there")
    group: str | int | float | bool | None = Field(None, description="group_by: the value of the group this hit is "
                                                   "in (a document with a list value can be in several)")


class ShardCallModel(BaseModel):
    shard: int
    replica: str
    latency_ms: float = Field(description="the shard call as the gateway timed it (wire, queueing, search)")
    server_ms: float = Field(description="the replica's own search time; latency_ms minus this is the hop")
    batch_size: int = Field(description="queries that shared this shard call (coalescing)")
    attempts: int = Field(description="replicas the call went to (primary + retries + hedges)")
    hedged: bool = Field(description="a hedge (second copy) was sent for this shard call")
    hedge_won: bool = Field(description="the answer came from the hedge")
    leg: str = Field("dense", description="dense, lexical (BM25 under the collection's statistics), or hybrid "
                     "(a weighted hybrid's call: both legs fused on the shard)")


class MissingShardModel(BaseModel):
    shard: int
    reason: str


class GroupingModel(BaseModel):
    by: str = Field(description="the metadata key grouped by")
    size: int = Field(description="hits per group asked (group_size)")
    groups: int = Field(description="groups answered (below k: fewer values among the matching documents)")
    read: int = Field(description="how deep the last round read the ranked list")
    rounds: int = Field(description="searches it took (each twice as deep as the one before)")
    filled: bool = Field(description="every group holds group_size hits, or every matching document was read; "
                         "false: limits.max_group_read was reached first")


class DiagnosticsModel(BaseModel):
    embedding_version: str
    shards_total: int
    shards_queried: int
    shards_answered: int
    took_ms: float = Field(description="the gateway's time on this query, from parsed request to answer")
    encode_ms: float = Field(description="embedding the text (0 for a vector query)")
    fanout_ms: float = Field(description="from the first shard call sent to the merged top k "
                             "(took_ms minus this and encode_ms is the gateway's own work)")
    shard_k: int = Field(description="hits asked of each shard (below k: per-shard top-k trimming)")
    second_round: list[int] = Field(description="shards asked again for the full k (their last hit could "
                                    "still make the top k)")
    trimming: str = Field(description="per-shard top-k trimming: \"on\", or \"off: <why>\" (asked for exact, "
                          "one shard, HNSW without ef_search ≥ k, a refined index, on which a trimmed list is "
                          "not a prefix of the full one)")
    per_shard: list[ShardCallModel]
    mode: str = Field("dense", description="the query's mode: dense, lexical or hybrid")
    fusion: str | None = Field(None, description="hybrid: how the legs were fused (rrf k=…, or weighted …)")
    lexical_ms: float = Field(0.0, description="the lexical leg: both phases, from the first call to the merged "
                              "list (0 for a dense query)")
    lexical_terms: list[str] | None = Field(None, description="lexical and hybrid: the query's terms as the "
                                            "lexical leg searched them — analysed in the collection's language "
                                            "(stemmed, stop words dropped); empty: no term to search for")
    defaulted: list[str] = Field(default_factory=list, description="the fields (mode, fusion, weights, rrf_k) "
                                 "this query took from its collection's search defaults because it named none "
                                 "(docs/hybrid.md)")
    groups: GroupingModel | None = Field(None, description="group_by: how the groups were filled")


class QueryResponse(BaseModel):
    hits: list[HitModel]
    version: str
    partial: bool = Field(description="true when some queried shards did not answer; see missing_shards")
    coverage: float = Field(description="shards answered / shards queried")
    missing_shards: list[MissingShardModel]
    diagnostics: DiagnosticsModel


class VersionCommand(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    version: str = Field(pattern=VERSION_PATTERN,
                         description="embedding version id, e.g. all-MiniLM-L6-v2.w7e54b3bcd8c7bda9.p522cae28")


class StageCommand(VersionCommand):
    model: str = Field("default", min_length=1,
                       description="encoder checkpoint directory of the version ('default' = all-MiniLM-L6-v2)")


class ActivateCommand(VersionCommand):
    force: bool = Field(False, description="activate even when the quality gate fails (never when not ready)")
    queries: list[str] | dict[str, str] | None = Field(
        None, description="quality-gate queries (a list, or query id → text to use qrels); default: recent queries")
    qrels: dict[str, dict[str, int]] | None = Field(None, description="query id → {doc id → grade} for nDCG@10")


class RetireCommand(VersionCommand):
    force: bool = Field(False, description="retire before the drain period has passed")
