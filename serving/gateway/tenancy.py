"""Tenants inside one collection: what a tenant-scoped API key may see and touch.

A collection made with a ``tenant_field`` keeps every document's tenant in that payload field
and its id in the tenant's namespace: the stored id is ``<tenant>::<id>``. So

* a tenant-scoped key works in its own namespace: the ids it sends are prefixed with its tenant
  before they reach a shard, the ids it gets back are shown without the prefix — it cannot name,
  overwrite or delete another tenant's document, whatever id it sends;
* every query and delete-by-filter of such a key runs under a mandatory filter
  ``{tenant_field: <its tenant>}`` AND-ed with its own, which it cannot remove or widen (the
  shards' payload index on the field selects the tenant's documents before any vector is scored);
* every document it writes gets its tenant in the field (a different value is refused, 403);
* hits are checked once more on the way out (a hit outside the tenant's namespace is dropped and
  logged): the filter is the confinement, this is the alarm.

An unscoped key sees the stored ids (``acme::doc-1``) and writes documents naming their tenant
in the id's prefix, the field, or both (they must agree).
"""

from __future__ import annotations

import logging
from typing import Any

from retrieval.blank import is_blank
from retrieval.errors import Forbidden, InvalidRequest
from serving.writes.models import MAX_ID_CHARS, DeleteRequest, DocumentIn, ScrollRequest, UpsertRequest

logger = logging.getLogger(__name__)

SEPARATOR = "::"


def stored_id(tenant: str, doc_id: str, *, field: str = "id", may_be_blank: bool = False) -> str:
    """``doc_id`` in ``tenant``'s namespace. A blank id is refused (as the write API refuses it
    unscoped: the prefix must not make it look named), except where it only matches, never
    names, a document (``may_be_blank``: a filter's ``has_id``, a listing's cursor)."""
    if not may_be_blank and is_blank(doc_id):
        raise InvalidRequest(f"{field} is empty or white space only", field=field)
    stored = f"{tenant}{SEPARATOR}{doc_id}"
    if len(stored) > MAX_ID_CHARS:
        raise InvalidRequest(f"id {doc_id[:40]!r}… with its tenant prefix is longer than {MAX_ID_CHARS} characters",
                             field=field)
    return stored


def shown_id(tenant: str, doc_id: str) -> str:
    prefix = tenant + SEPARATOR
    return doc_id[len(prefix):] if doc_id.startswith(prefix) else doc_id


def tenant_clause(tenant_field: str, tenant: str) -> dict[str, Any]:
    return {"key": tenant_field, "match": {"value": tenant}}


def _prefix_ids(node: Any, tenant: str) -> Any:
    """A filter with every ``has_id`` list moved into the tenant's namespace."""
    if isinstance(node, dict):
        return {key: ([stored_id(tenant, str(v), field="filter.has_id", may_be_blank=True) for v in value]
                      if key == "has_id" and isinstance(value, list) else _prefix_ids(value, tenant))
                for key, value in node.items()}
    if isinstance(node, list):
        return [_prefix_ids(item, tenant) for item in node]
    return node


def confine_filter(user_filter: dict[str, Any] | None, tenant_field: str, tenant: str) -> dict[str, Any]:
    """The tenant's mandatory clause AND the caller's own filter (its ids in the tenant's namespace)."""
    clauses: list[dict[str, Any]] = [tenant_clause(tenant_field, tenant)]
    if user_filter:
        clauses.append(_prefix_ids(user_filter, tenant))
    return {"must": clauses}


def confine_upsert(request: UpsertRequest, tenant_field: str, tenant: str | None) -> UpsertRequest:
    """The documents as they are stored: ids in their tenant's namespace, the tenant in the field."""
    documents: list[DocumentIn] = []
    for number, document in enumerate(request.documents):
        where = f"documents.{number}"
        given = document.metadata.get(tenant_field)
        if tenant is not None:
            if given is not None and given != tenant:
                raise Forbidden(f"{where}.metadata.{tenant_field} is {given!r}; this key writes only tenant "
                                f"{tenant!r}", field=f"{where}.metadata.{tenant_field}")
            owner: Any = tenant
            doc_id = stored_id(tenant, document.id, field=f"{where}.id")
        else:
            prefix, sep, own_id = document.id.partition(SEPARATOR)
            if sep and is_blank(own_id):
                raise InvalidRequest(f"{where}.id names tenant {prefix!r} and no id after {SEPARATOR!r}",
                                     field=f"{where}.id")
            owner = given if given is not None else (prefix if sep else None)
            if not isinstance(owner, str) or not owner:
                raise InvalidRequest(f"{where}: this collection keeps tenants in {tenant_field!r}; give the tenant in "
                                     f"metadata.{tenant_field} or the id as '<tenant>{SEPARATOR}<id>'",
                                     field=f"{where}.metadata.{tenant_field}")
            if sep and prefix != owner:
                raise InvalidRequest(f"{where}.id is in tenant {prefix!r}'s namespace but metadata.{tenant_field} "
                                     f"is {owner!r}", field=f"{where}.id")
            doc_id = document.id if sep else stored_id(owner, document.id, field=f"{where}.id")
        documents.append(document.model_copy(update={"id": doc_id,
                                                     "metadata": {**document.metadata, tenant_field: owner}}))
    return request.model_copy(update={"documents": documents})


def confine_delete(request: DeleteRequest, tenant_field: str, tenant: str) -> DeleteRequest:
    if request.ids is not None:
        ids = [stored_id(tenant, doc_id, field=f"ids[{n}]") for n, doc_id in enumerate(request.ids)]
        return request.model_copy(update={"ids": ids})
    return request.model_copy(update={"filter": confine_filter(request.filter, tenant_field, tenant)})


def confine_scroll(request: ScrollRequest, tenant_field: str, tenant: str) -> ScrollRequest:
    """A listing of the tenant's documents only, its cursor in the tenant's namespace (the
    namespace's ids sort as the shown ones do: one prefix)."""
    offset = (stored_id(tenant, request.offset, field="offset", may_be_blank=True)
              if request.offset is not None else None)
    return request.model_copy(update={"filter": confine_filter(request.filter, tenant_field, tenant),
                                      "offset": offset})


def confine_listing(reply: dict[str, Any], tenant: str) -> dict[str, Any]:
    """A listing's page in the tenant's namespace (a document from outside it is dropped and logged)."""
    prefix = tenant + SEPARATOR
    kept = []
    for document in reply["documents"]:
        if not str(document["id"]).startswith(prefix):
            logger.error("a document outside tenant %r reached a listing (%s): dropped", tenant, document["id"])
            continue
        kept.append({**document, "id": document["id"][len(prefix):]})
    cursor = reply.get("next_offset")
    return {**reply, "documents": kept, "next_offset": shown_id(tenant, cursor) if cursor else None}


def confine_hits(response: dict[str, Any], tenant: str) -> dict[str, Any]:
    """A query answer in the tenant's namespace; a hit from outside it is dropped (and logged)."""
    prefix = tenant + SEPARATOR
    kept = []
    for hit in response.get("hits", []):
        doc_id = str(hit.get("doc_id", ""))
        if not doc_id.startswith(prefix):
            logger.error("a hit outside tenant %r reached the gateway (%s): dropped", tenant, doc_id)
            continue
        kept.append({**hit, "doc_id": doc_id[len(prefix):]})
    return {**response, "hits": kept}


def confine_ids(reply: dict[str, Any], tenant: str) -> dict[str, Any]:
    """A write's reply with its ids shown in the tenant's namespace."""
    if isinstance(reply.get("ids"), list):
        return {**reply, "ids": [shown_id(tenant, str(i)) for i in reply["ids"]]}
    return reply
