"""The bodies of ``PUT /v1/collections/{name}`` — what a created collection is (its space, its
index, its slices and copies, how its texts are analysed), its quotas and its query defaults —
and of ``PUT /v1/collections/{name}/query-defaults``, checked field by field so bad input is a
422 naming the field."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from httpkit.api import JSON_INTEGER
from retrieval.analysis import DEFAULT_LANGUAGE, languages
from retrieval.query_defaults import MAX_RRF_K, QueryDefaults
from retrieval.types import EF_CONSTRUCTION_RANGE
from serving.gateway.api_models import LegWeights


class QuotasModel(BaseModel):
    # strict: false is not a rate of 0 nor "5" a count (lax mode took both, found by the fuzzer)
    model_config = ConfigDict(extra="forbid", strict=True)

    # bounded: the cluster state's JSON holds 64-bit integers (a larger one was a 500, found by the fuzzer)
    max_documents: Annotated[int, JSON_INTEGER] = Field(
        0, ge=0, le=10**15, description="live documents the collection may hold (0: no limit)")
    max_rps: float = Field(0.0, ge=0, le=1e6, description="requests per second per gateway (0: no limit)")


class QueryDefaultsModel(BaseModel):
    """What a query of the collection that names no mode (fusion, weights, rrf_k) is searched with;
    a query's own fields win, and one with a vector and no text stays dense."""

    model_config = ConfigDict(extra="forbid", strict=True)

    mode: Literal["dense", "lexical", "hybrid"] = Field("dense", description="a text query's mode")
    fusion: Literal["rrf", "weighted"] = Field("weighted", description="a hybrid query's fusion")
    weights: LegWeights | None = Field(None, description="a weighted hybrid's per-leg weights (default: the ones "
                                       "chosen on msmarco; measure yours with shardrag eval --url)")
    rrf_k: Annotated[int, JSON_INTEGER] = Field(60, ge=0, le=MAX_RRF_K, description="an rrf hybrid's rank offset")

    def to_defaults(self) -> QueryDefaults:
        weights = self.weights.model_dump() if self.weights is not None else None
        return QueryDefaults(self.mode, self.fusion, weights, self.rrf_k).validate()


class CollectionCreate(BaseModel):
    """Give ``dim`` (a vector-only collection: clients send vectors) or ``model`` (text is embedded
    by that encoder; it must be one this gateway serves)."""

    # Exactly one of the two (the schema's oneOf says so); neither takes null. Strict: a boolean is
    # not a number and "3" not a count; JSON_INTEGER still takes 3.0 as 3, as JSON Schema does.
    model_config = ConfigDict(extra="forbid", strict=True,
                              json_schema_extra={"oneOf": [{"required": ["dim"]}, {"required": ["model"]}]})

    dim: Annotated[int, JSON_INTEGER] = Field(  # type: ignore[assignment]
        None, ge=1, le=65536, description="vector dimension (vector-only collections)")
    model: str = Field(None, min_length=1, max_length=200,  # type: ignore[assignment]
                       description="encoder that embeds text (one this gateway serves)")
    metric: Literal["ip", "l2"] = Field("ip", description="ip (cosine on normalised vectors) or l2")
    shards: Annotated[int, JSON_INTEGER] = Field(1, ge=1, le=16, description="slices of the index")
    replicas: Annotated[int, JSON_INTEGER] = Field(1, ge=1, le=7,
                                                   description="copies of each slice, on distinct nodes")
    factory: str = Field("Flat", pattern=r"^(Flat|HNSW(4|8|16|24|32|48|64))$",
                         description="FAISS index: Flat (exact) or HNSW<M> — kinds a collection that starts "
                                     "empty can hold without training")
    ef_construction: Annotated[int, JSON_INTEGER] | None = Field(
        None, ge=EF_CONSTRUCTION_RANGE[0], le=EF_CONSTRUCTION_RANGE[1],
        description="HNSW factories only: candidates kept while linking each vector into the graph when a "
                    "compaction builds it — larger recalls more at the same ef_search and builds more slowly "
                    "(default FAISS's 40)")
    partitioner: Literal["hash"] = Field("hash", description="how ids map to shards")
    tenant_field: str | None = Field(None, min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.\-]+$",
                                     description="payload field holding each document's tenant (tenant-scoped keys)")
    lexical_language: str = Field(DEFAULT_LANGUAGE, min_length=1, max_length=32,
                                  description="how lexical and hybrid search analyse the texts: a Snowball "
                                              "stemmer's language (english, which also drops English stop words; "
                                              "german, french, spanish, ...), cjk (Chinese, Japanese, Korean: "
                                              "character bigrams) or none (words as they are)")
    quotas: QuotasModel = Field(default_factory=QuotasModel)
    query_defaults: QueryDefaultsModel = Field(default_factory=QueryDefaultsModel)

    @field_validator("lexical_language")
    @classmethod
    def _known_language(cls, value: str) -> str:
        if value not in languages():
            raise PydanticCustomError("lexical_language", f"lexical_language must be one of {', '.join(languages())}")
        return value

    @field_validator("ef_construction")
    @classmethod
    def _hnsw_only(cls, value: int | None, info: ValidationInfo) -> int | None:
        factory = str(info.data.get("factory", ""))  # declared before it: already validated (absent if invalid)
        if value is not None and not factory.startswith("HNSW"):
            raise PydanticCustomError("ef_construction", f"ef_construction applies to HNSW factories, not {factory!r}")
        return value

    @model_validator(mode="after")
    def _one_space(self) -> CollectionCreate:
        if (self.dim is None) == (self.model is None):
            raise ValueError("give exactly one of dim (vector-only) and model (text)")
        return self
