"""``POST /v1/collections/{name}/tune``: the cheapest ``ef_search`` / ``nprobe`` that meets a
recall target, measured on the running replicas and applied to all of them — the REST twin of
``shardrag tune`` (which measures a built version's files), for the launched collection and the
created ones alike.

1. pseudo-queries: stored vectors drawn from every shard's base (each left out of its own
   answers);
2. one replica per shard answers all of them exactly and at every candidate value of its knob,
   on a clone of its index, one query at a time (index_shards.live_tuning);
3. the answers are merged as a fan-out merges them and the cheapest value whose recall@k meets
   the target with 95 % confidence is chosen (retrieval.tuning_choice.choose), a held-out share
   of the queries checking it;
4. unless ``dry_run``, every replica of the active version keeps it (``<data dir>/<version>/
   search.json``) and uses it at once for queries that set no knob.

What is measured is each shard's base index; documents still in the write segment are scored
exactly. A version whose bases hold too few documents (a new collection before its first
compaction) is refused, naming why.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

import numpy as np
from fastapi import FastAPI, Path
from fastapi import Response as FastAPIResponse
from pydantic import BaseModel, ConfigDict, Field

from clusterstate.collections import NAME_PATTERN
from httpkit.api import ERROR_RESPONSES, ErrorResponse
from httpkit.responses import json_response
from retrieval.errors import InvalidRequest, ShardragError, ShardUnavailable
from retrieval.tuning_choice import choose, decode_queries, decode_result, encode_queries, split_holdout
from serving.versions.registry import VersionRegistry

TUNE_TIMEOUT_S = 300.0  # one shard's evaluation of every candidate value
MIN_QUERIES = 20
NamePath = Annotated[str, Path(pattern=NAME_PATTERN.pattern, description="collection name")]
RESPONSES: dict[int | str, dict[str, Any]] = {
    **ERROR_RESPONSES, 404: {"model": ErrorResponse, "description": "no such collection"}}


class TuneCommand(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    recall: float = Field(0.95, gt=0, le=1, description="recall@k target (met with 95 % confidence)")
    k: int = Field(10, ge=1, le=100, description="the k of recall@k")
    sample: int = Field(200, ge=MIN_QUERIES, le=5000, description="pseudo-queries drawn over all shards")
    max_value: int | None = Field(None, ge=1, description="never choose the knob above this (a latency budget)")
    holdout: float = Field(0.3, ge=0, lt=1, description="share of the queries kept to check the choice")
    seed: int = Field(0, ge=0)
    dry_run: bool = Field(False, description="measure and report, change nothing")


async def tune_active(registry: VersionRegistry, command: TuneCommand) -> dict[str, Any]:
    """Measure the active version on its replicas, choose, and (unless a dry run) apply."""
    client = registry.client
    version = registry.view.state.active
    measuring = []
    for shard in range(len(registry.shard_replicas)):
        ready = registry.eligible(shard, version)
        if not ready:
            raise ShardUnavailable(f"no replica of shard {shard} holds {version} ready", shard=shard)
        measuring.append(ready[0])
    per_shard = -(-command.sample // len(measuring))
    sampled = [decode_queries(data) for data in await asyncio.gather(*(
        client.tune_sample(replica, version, per_shard, command.seed + shard, TUNE_TIMEOUT_S)
        for shard, replica in enumerate(measuring)))]
    queries = np.concatenate([q for q, _ in sampled])
    exclude = np.concatenate([ids for _, ids in sampled])
    if len(queries) < MIN_QUERIES:
        raise InvalidRequest(f"the shards' bases of {version} hold {len(queries)} documents to draw tuning queries "
                             f"from (at least {MIN_QUERIES} needed): written documents join the base at the next "
                             "compaction, and the write segment is searched exactly until then", field="sample")
    body = encode_queries(queries, exclude)
    results = [decode_result(data) for data in await asyncio.gather(*(
        client.tune_evaluate(replica, version, body, command.k, command.max_value, TUNE_TIMEOUT_S)
        for replica in measuring))]
    tune_rows, holdout_rows = split_holdout(len(queries), command.holdout, command.seed)
    report = choose(results, command.recall, command.k, tune_rows, holdout_rows)
    answer: dict[str, Any] = {"version": version, "queries": len(queries), "measured_on": measuring,
                              "report": report.to_dict(), "applied": False}
    if report.knob is None:
        return {**answer, "reason": f"{report.factory} is an exact index: there is nothing to tune"}
    if report.chosen is None:
        best = max(report.candidates, key=lambda c: c.recall, default=None)
        return {**answer, "reason": f"no value of {report.knob} reaches recall@{command.k} {command.recall} with 95 % "
                                    f"confidence (best {best.recall:.4f} at {best.value})" if best else
                                    f"no value of {report.knob} was tried under max_value"}
    defaults = {report.knob: report.chosen.value, "recall_target": command.recall, "recall": report.chosen.recall,
                "k": command.k, "queries": len(tune_rows)}
    answer["search_defaults"] = {report.knob: report.chosen.value}
    if command.dry_run:
        return {**answer, "reason": "dry run"}

    async def apply(replica: str) -> str:
        try:
            await client.set_search_defaults(replica, version, defaults, TUNE_TIMEOUT_S)
            return "applied"
        except ShardragError as exc:
            return f"not applied: {exc.message}"

    replicas = [r for group in registry.shard_replicas for r in group]
    outcomes = dict(zip(replicas, await asyncio.gather(*(apply(r) for r in replicas)), strict=True))
    return {**answer, "applied": all(o == "applied" for o in outcomes.values()), "replicas": outcomes}


def add_collection_tune_route(app: FastAPI, registry_of: Any) -> None:
    """``registry_of(name)``: awaitable → the collection's version registry (404 when none)."""

    @app.post("/v1/collections/{name}/tune", summary="Choose and apply the cheapest ef_search / nprobe that "
              "meets a recall target, measured on the running replicas", responses=RESPONSES)
    async def tune(name: NamePath, command: TuneCommand) -> FastAPIResponse:
        return json_response(await tune_active(await registry_of(name), command))
