"""The gateway's OpenAPI schema for ``POST /v1/query``, stating this gateway's real limits and the
collection's dimension, so that every request the schema allows is one the gateway accepts
(what schemathesis checks in CI)."""

from __future__ import annotations

import copy
from typing import Any

from retrieval.blank import NON_BLANK_PATTERN
from retrieval.filters import (
    MAX_DEPTH,
    MAX_KEY_CHARS,
    MAX_LIST_ITEMS,
    MAX_METADATA_KEYS,
    MAX_VALUE_CHARS,
    MAX_VALUES,
    OCCURS,
    RANGE_BOUNDS,
)
from retrieval.query_defaults import PLAIN, QueryDefaults
from serving.gateway.api_models import QueryRequest
from serving.gateway.config import Limits
from serving.versions.topology import Topology
from serving.writes.models import MAX_ID_CHARS, DeleteRequest, ScrollRequest, UpsertRequest
from serving.writes.plan import WriteSettings


def query_request_schemas(limits: Limits, topology: Topology | None,
                          defaults: QueryDefaults = PLAIN) -> dict[str, Any]:
    """``QueryRequest`` and the models it refers to (``LegWeights``), as components: a ``$ref`` to
    ``#/components/schemas/X`` must find X there, not in the request's own ``$defs``.

    ``QueryRequest`` (``/v1/query``) is exact for the collection the gateway was started with when
    its query defaults are plain: a query naming no mode is dense. ``CollectionQueryRequest``
    (``/v1/collections/{name}/query``) — and ``QueryRequest`` under other defaults — states the
    mode rules for a query that names its mode only: one naming none takes its collection's
    defaults (``retrieval.query_defaults``), which the collection checks (a 422 naming the field),
    as it checks its own vector dimension."""
    schema = QueryRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    defs = schema.pop("$defs", {})
    props = schema["properties"]
    bound = float(limits.max_vector_abs)

    def set_in(name: str, **bounds: Any) -> None:
        for option in props[name].get("anyOf", [props[name]]):
            if option.get("type") != "null":
                option.update(bounds)

    set_in("k", maximum=limits.max_k)
    set_in("timeout_ms", minimum=limits.min_timeout_ms, maximum=limits.max_timeout_ms)
    set_in("text", maxLength=limits.max_text_chars, pattern=NON_BLANK_PATTERN)
    vector: dict[str, Any] = {"type": "array", "minItems": 1,
                              "items": {"type": "number", "minimum": -bound, "maximum": bound}}
    if topology is not None:
        vector.update(minItems=int(topology.dim), maxItems=int(topology.dim))
        n = int(topology.num_shards)  # top_m < n needs kmeans centroids to route with
        set_in("top_m", minimum=1 if topology.centroids is not None else n, maximum=n)
        factory = str(topology.factory or "")
        for name, applies in (("nprobe", "IVF" in factory), ("ef_search", "HNSW" in factory)):
            if not applies:  # the index has no such knob: the field may only be null
                props[name] = {"type": "null", "title": props[name].get("title", name),
                               "description": props[name].get("description", "") + f" (not for {factory})"}
    set_in("vector", **{k: v for k, v in vector.items() if k != "type"})
    shard_names: dict[str, Any] = {"pattern": "^(0|[1-9][0-9]{0,5})$"}
    if topology is not None:
        shard_names = {"enum": [str(i) for i in range(int(topology.num_shards))]}
    set_in("min_seq", propertyNames=shard_names)
    set_in("min_term", propertyNames=shard_names)
    props["filter"] = {"anyOf": [{"$ref": f"#/components/schemas/{FILTER_SCHEMA}0"}, {"type": "null"}],
                       "description": props["filter"].get("description", "")}
    has_text = {"required": ["text"], "properties": {"text": {"type": "string"}}}
    has_vector = {"required": ["vector"], "properties": {"vector": {"type": "array"}}}
    # a created collection has its own dimension (checked by it, a 422 naming vector)
    loose = copy.deepcopy(schema)
    for option in loose["properties"]["vector"].get("anyOf", []):
        if option.get("type") == "array":
            option.update(minItems=1)
            option.pop("maxItems", None)
    loose["allOf"] = [_SESSION_RULE, *_named_mode_rules(has_text, has_vector)]
    if not defaults.is_plain:
        schema["allOf"] = [_SESSION_RULE, *_named_mode_rules(has_text, has_vector)]
        return {**defs, "QueryRequest": schema, "CollectionQueryRequest": loose}
    schema["allOf"] = [
        _SESSION_RULE,
        # dense (the default): exactly one of text and vector; lexical and hybrid: the text (hybrid
        # may add a vector for its dense leg)
        {"if": {"properties": {"mode": {"const": "dense"}}},
         "then": {"oneOf": [has_text, has_vector]},
         "else": has_text},
        # lexical ranks the text alone, on every shard: no vector, no top_m
        {"if": {"required": ["mode"], "properties": {"mode": {"const": "lexical"}}},
         "then": {"properties": {"vector": {"type": "null"}, "top_m": {"type": "null"}}}},
        # a fusion's fields only where they shape it (serving.gateway.query.check_fusion_fields):
        # none outside hybrid, no weights with rrf, no rrf_k with weighted (the default fusion)
        # (``false``: the field must be absent — a form generators handle without filtering)
        {"if": {"required": ["mode"], "properties": {"mode": {"const": "hybrid"}}},
         "then": {"if": {"required": ["fusion"], "properties": {"fusion": {"const": "rrf"}}},
                  "then": {"properties": {"weights": {"type": "null"}}},
                  "else": {"properties": {"rrf_k": False}}},
         "else": {"properties": {"fusion": False, "rrf_k": False, "weights": {"type": "null"},
                                 "candidates": {"type": "null"}}}},
    ]
    return {**defs, "QueryRequest": schema, "CollectionQueryRequest": loose}


# min_seq and min_term only with consistency "session" (a session read); "eventual" takes none
_SESSION_RULE: dict[str, Any] = {
    "if": {"anyOf": [{"required": [name], "properties": {name: {"type": "object", "minProperties": 1}}}
                     for name in ("min_seq", "min_term")]},
    "then": {"required": ["consistency"], "properties": {"consistency": {"const": "session"}}}}


def _named_mode_rules(has_text: dict[str, Any], has_vector: dict[str, Any]) -> list[dict[str, Any]]:
    """The mode rules for a query that names its mode (and fusion); one naming neither needs a text
    or a vector, the rest being its collection's query defaults."""
    def named(field: str, value: str) -> dict[str, Any]:
        return {"required": [field], "properties": {field: {"const": value}}}

    no_fusion = {"properties": {"fusion": False, "rrf_k": False, "weights": {"type": "null"},
                                "candidates": {"type": "null"}}}
    return [
        {"if": named("mode", "dense"), "then": {"oneOf": [has_text, has_vector]},
         "else": {"if": {"required": ["mode"]}, "then": has_text, "else": {"anyOf": [has_text, has_vector]}}},
        {"if": named("mode", "lexical"),
         "then": {"properties": {"vector": {"type": "null"}, "top_m": {"type": "null"}}}},
        {"if": named("mode", "hybrid"),
         "then": {"if": named("fusion", "rrf"), "then": {"properties": {"weights": {"type": "null"}}},
                  "else": {"if": named("fusion", "weighted"), "then": {"properties": {"rrf_k": False}}}},
         "else": {"if": {"required": ["mode"]}, "then": no_fusion}},
    ]


FILTER_SCHEMA = "ShardragFilter"  # components/schemas/ShardragFilter0 .. ShardragFilter{MAX_DEPTH}


def filter_schemas() -> dict[str, Any]:
    """The filter language (retrieval.filters) as JSON Schema, one definition per nesting level, so
    that every filter the schema allows is one the parser accepts."""
    scalar = {"anyOf": [{"type": "string", "maxLength": MAX_VALUE_CHARS}, {"type": "number"}, {"type": "boolean"}]}
    key = {"type": "string", "minLength": 1, "maxLength": MAX_KEY_CHARS}
    match = {"type": "object", "required": ["key", "match"], "additionalProperties": False, "properties": {
        "key": key, "match": {"oneOf": [
            {"type": "object", "required": ["value"], "additionalProperties": False, "properties": {"value": scalar}},
            {"type": "object", "required": ["any"], "additionalProperties": False, "properties": {
                "any": {"type": "array", "minItems": 1, "maxItems": MAX_VALUES, "items": scalar}}}]}}}
    def range_of(bound_schema: dict[str, Any]) -> dict[str, Any]:
        return {"type": "object", "required": ["key", "range"], "additionalProperties": False, "properties": {
            "key": key, "range": {"type": "object", "minProperties": 1, "additionalProperties": False,
                                  "properties": {bound: bound_schema for bound in RANGE_BOUNDS}}}}

    number_range = range_of({"type": "number"})
    date_range = range_of({"type": "string", "format": "date-time"})  # every bound one (retrieval.datetimes)
    is_empty = {"type": "object", "required": ["is_empty"], "additionalProperties": False, "properties": {
        "is_empty": {"type": "object", "required": ["key"], "additionalProperties": False,
                     "properties": {"key": key}}}}
    has_id = {"type": "object", "required": ["has_id"], "additionalProperties": False, "properties": {
        "has_id": {"type": "array", "minItems": 1, "maxItems": MAX_VALUES,
                   "items": {"type": "string", "minLength": 1}}}}
    schemas = {}
    for depth in range(MAX_DEPTH + 1):
        options: list[dict[str, Any]] = [match, number_range, date_range, is_empty, has_id]
        if depth < MAX_DEPTH:
            options.append({"$ref": f"#/components/schemas/{FILTER_SCHEMA}{depth + 1}"})
        condition = {"anyOf": options}
        schemas[f"{FILTER_SCHEMA}{depth}"] = {
            "type": "object", "additionalProperties": False,
            "description": "must: all hold; should: one holds; must_not: none holds (docs/filters.md)",
            "properties": {occur: {"type": "array", "maxItems": MAX_LIST_ITEMS, "items": condition}
                           for occur in OCCURS}}
    return schemas


def _non_null(prop: dict[str, Any]) -> dict[str, Any]:
    """A pydantic ``X | None`` property without its null option (absent means None)."""
    options = [o for o in prop.get("anyOf", [prop]) if o.get("type") != "null"]
    out = dict(options[0]) if len(options) == 1 else {"anyOf": options}
    for key in ("description", "title"):
        if key in prop:
            out[key] = prop[key]
    return out


def _one_of(present: str, present_type: str, absent: str, absent_type: str) -> dict[str, Any]:
    """``present`` is given (not null) and ``absent`` is missing or null."""
    return {"required": [present], "properties": {present: {"type": present_type}},
            "not": {"required": [absent], "properties": {absent: {"type": absent_type}}}}


def write_schemas(limits: Limits, topology: Topology | None, writes: WriteSettings) -> dict[str, Any]:
    """``UpsertRequest``, ``DocumentIn`` and ``DeleteRequest`` stated as exactly as JSON Schema can:
    non-blank ids and texts, text or a vector (of the collection's dimension) or both,
    flat metadata. What it cannot say — ids unique within a batch, a document's total size — is
    refused with a 422 naming the item (docs/writes.md)."""
    ref = "#/components/schemas/{model}"
    upsert = UpsertRequest.model_json_schema(ref_template=ref)
    defs = upsert.pop("$defs", {})
    document = defs["DocumentIn"]
    props = document["properties"]
    props["id"]["pattern"] = NON_BLANK_PATTERN
    props["title"]["maxLength"] = writes.max_text_chars
    text = {**_non_null(props["text"]), "pattern": NON_BLANK_PATTERN, "maxLength": writes.max_text_chars}
    props["text"] = {"anyOf": [text, {"type": "null"}]}
    upsert["properties"]["documents"]["maxItems"] = writes.max_documents
    bound = float(limits.max_vector_abs)
    vector: dict[str, Any] = {"type": "array", "minItems": 1,
                              "items": {"type": "number", "minimum": -bound, "maximum": bound}}
    if topology is not None:
        vector.update(minItems=int(topology.dim), maxItems=int(topology.dim))
    props["vector"] = {"anyOf": [vector, {"type": "null"}], "description": props["vector"].get("description", "")}
    scalar = [{"type": "string", "maxLength": MAX_VALUE_CHARS}, {"type": "number"}, {"type": "boolean"}]
    props["metadata"] = {
        "type": "object", "maxProperties": MAX_METADATA_KEYS, "description": props["metadata"].get("description", ""),
        "propertyNames": {"minLength": 1, "maxLength": MAX_KEY_CHARS},
        "additionalProperties": {"anyOf": [*scalar, {"type": "array", "maxItems": MAX_VALUES,
                                                     "items": {"type": "string", "maxLength": MAX_VALUE_CHARS}}]}}
    document["anyOf"] = [{"required": [name], "properties": {name: {"type": kind}}}
                         for name, kind in (("text", "string"), ("vector", "array"))]
    document["anyOf"].append({"required": ["no_vector"], "properties": {"no_vector": {"const": True}}})
    # no_vector: true never comes with a vector
    document["not"] = {"required": ["no_vector", "vector"],
                       "properties": {"no_vector": {"const": True}, "vector": {"type": "array"}}}
    delete = DeleteRequest.model_json_schema(ref_template=ref)
    dprops = delete["properties"]
    ids = {**_non_null(dprops["ids"]), "uniqueItems": True, "maxItems": writes.max_documents,
           "items": {"type": "string", "minLength": 1, "maxLength": MAX_ID_CHARS, "pattern": NON_BLANK_PATTERN}}
    dprops["ids"] = {"anyOf": [ids, {"type": "null"}]}
    not_empty = {"anyOf": [{"required": [occur], "properties": {occur: {"minItems": 1}}} for occur in OCCURS]}
    dprops["filter"] = {"anyOf": [{"allOf": [{"$ref": f"#/components/schemas/{FILTER_SCHEMA}0"}, not_empty]},
                                  {"type": "null"}],
                        "description": dprops["filter"].get("description", "") + " (not empty: an empty filter "
                                       "would delete everything)"}
    delete["oneOf"] = [_one_of("ids", "array", "filter", "object"), _one_of("filter", "object", "ids", "array")]
    scroll = ScrollRequest.model_json_schema(ref_template=ref)
    scroll["properties"]["filter"] = {"anyOf": [{"$ref": f"#/components/schemas/{FILTER_SCHEMA}0"}, {"type": "null"}],
                                      "description": scroll["properties"]["filter"].get("description", "")}
    return {"UpsertRequest": upsert, "DocumentIn": document, "DeleteRequest": delete, "ScrollRequest": scroll}


_HTTP_METHODS = ("get", "put", "post", "delete", "patch", "head", "options", "trace")


def build_openapi(**kwargs: Any) -> dict[str, Any]:
    """FastAPI's ``get_openapi`` with an operationId per method. A route serving several methods
    (``/admin/faults``: GET and DELETE, one route so a 405 there lists both in Allow) gets one id
    from FastAPI for all of them, which OpenAPI forbids and client generators trip on. Each
    method's operation is renamed ``<id without its method>_<method>``; a duplicate across
    different paths is a programming error and raises."""
    import warnings

    from fastapi.openapi.utils import get_openapi

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Duplicate Operation ID")  # fixed below, or raised
        schema = get_openapi(**kwargs)
    seen: dict[str, str] = {}
    for path, operations in schema.get("paths", {}).items():
        methods = [m for m in operations if m in _HTTP_METHODS]
        ids = [operations[m].get("operationId") for m in methods]
        if len(methods) > 1 and len(set(ids)) == 1 and ids[0]:
            stem = ids[0]
            for method in _HTTP_METHODS:
                stem = stem.removesuffix(f"_{method}")
            for method in methods:
                operations[method]["operationId"] = f"{stem}_{method}"
        for method in methods:
            operation_id = operations[method].get("operationId")
            if operation_id is None:
                continue
            if operation_id in seen:
                raise RuntimeError(f"OpenAPI operationId {operation_id!r} is used by {seen[operation_id]} and "
                                   f"{method.upper()} {path}")
            seen[operation_id] = f"{method.upper()} {path}"
    return schema
