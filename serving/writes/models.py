"""Request models of the write API (they also make its OpenAPI schema)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from httpkit.api import FiniteFloat

MAX_ID_CHARS = 512
MAX_DOCUMENTS = 1000  # per request
MAX_TEXT_CHARS = 100_000
WriteAck = Literal["one", "majority", "all"]


class DocumentIn(BaseModel):
    """``text`` (embedded by the gateway), ``vector``, or both: a given vector is used as it is and the
    text stored beside it (a framework that embeds on its side still keeps its passages here).
    ``no_vector``: stored without a vector — BM25, filters, listings and reads find it, a dense
    search never does (a framework's documents that have no embedding)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    id: str = Field(min_length=1, max_length=MAX_ID_CHARS, description="the document's id (an upsert replaces it)")
    title: str = Field("", max_length=MAX_TEXT_CHARS)
    text: str | None = Field(None, max_length=MAX_TEXT_CHARS,
                             description="embedded with each loaded version, unless a vector is given")
    vector: list[FiniteFloat] | None = Field(
        None, description="the active version's vector (with text: that text is stored, not embedded)")
    metadata: dict[str, Any] = Field(default_factory=dict,
                                     description="flat: strings, numbers, booleans, lists of strings")
    no_vector: bool = Field(False, description="store it without a vector (text not embedded): found by BM25, "
                                               "filters and listings, never by a dense search")


class UpsertRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    documents: list[DocumentIn] = Field(min_length=1, max_length=MAX_DOCUMENTS)
    idempotency_key: str | None = Field(None, min_length=1, max_length=200,
                                        description="a retry with the same key returns the first reply")
    write_ack: WriteAck = Field("majority", description="replicas of every touched shard that must have it fsynced")


MAX_DELETE_BY_FILTER = 100_000  # documents one delete-by-filter request may remove


class DeleteRequest(BaseModel):
    """Exactly one of ``ids`` and ``filter``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    ids: list[Annotated[str, Field(min_length=1, max_length=MAX_ID_CHARS)]] | None = Field(
        None, min_length=1, max_length=MAX_DOCUMENTS)
    filter: dict[str, Any] | None = Field(None, description="delete every live document the filter selects "
                                                             "(the filter language of /v1/query; docs/filters.md)")
    idempotency_key: str | None = Field(None, min_length=1, max_length=200)
    write_ack: WriteAck = "majority"


MAX_SCROLL_LIMIT = 1000  # documents one page of a listing holds


class ScrollRequest(BaseModel):
    """A page of the collection's live documents in id order (``POST …/documents/scroll``)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    filter: dict[str, Any] | None = Field(None, description="only the documents the filter selects (the filter "
                                                             "language of /v1/query; docs/filters.md)")
    limit: int = Field(100, ge=0, le=MAX_SCROLL_LIMIT, description="documents in the page (0: the count alone)")
    offset: str | None = Field(None, min_length=1, max_length=MAX_ID_CHARS,
                               description="the previous page's next_offset: the page starts after this id")
    with_vectors: bool = Field(False, description="each document's vector too")
