"""A collection's rollouts: re-embed a created text collection in place, while it serves.

    GET  /v1/collections/{name}/rollout            state, replicas per version, encoders
    POST /v1/collections/{name}/rollout/stage      {"model"} (the version is named by the model)
    POST /v1/collections/{name}/rollout/activate   {"version", "queries", "qrels", "force"}
    POST /v1/collections/{name}/rollout/retire | abort | rollback   {"version"}

The launched collection's name routes to its own rollout (as ``/admin/rollout``: its new versions
are built offline by ``shardrag build --collection``). For a created collection the commands are
the same two-phase protocol (retrieval.rollout), over its own rollout state in the cluster state:

1. **stage**: the model is loaded once to learn its embedding version; the version is recorded in
   the collection's spec, every node hosting a replica builds an empty base of it (any dimension),
   and every replica loads it; the gateways load its query encoder;
2. **activate**: every live document of the active version is read from each shard's primary at
   one seq and written to the staged version re-embedded by its encoder, then the writes after that
   cut are replayed (serving.writes.staging: rounds without a pause, then a short fence) — queries
   and writes go on meanwhile; then the quality gate, then the switch;
3. **retire** after the drain period unloads the old version (abort, rollback as for the launched
   collection).

Vector-only collections have no model to re-embed with (422).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi import Response as FastAPIResponse
from pydantic import BaseModel, ConfigDict, Field

from httpkit.api import ERROR_RESPONSES, ErrorResponse
from httpkit.responses import json_response
from retrieval.errors import EncoderError, InvalidRequest, NotFound, ShardragError, ShardUnavailable
from serving.gateway.api_models import (
    VERSION_PATTERN,
    ActivateCommand,
    NamePath,
    RetireCommand,
    VersionCommand,
)
from serving.gateway.collections import READY_TIMEOUT_S, CollectionStack, CollectionStacks
from serving.versions.rollout import ADMIN_TIMEOUT_S, RolloutService

RESPONSES: dict[int | str, dict[str, Any]] = {
    **ERROR_RESPONSES, 404: {"model": ErrorResponse, "description": "no such collection"}}


class CollectionStageCommand(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str = Field(min_length=1, description="encoder checkpoint directory on the gateways' hosts "
                                                 "('default' = all-MiniLM-L6-v2)")
    version: str | None = Field(None, pattern=VERSION_PATTERN,
                                description="the version id the model should produce (checked; default: the "
                                            "model's own)")


async def stage_created(stacks: CollectionStacks, stack: CollectionStack, model: str,
                        expected: str | None) -> dict[str, Any]:
    """Stage ``model`` as a new version of a created collection (module docstring, step 1)."""
    spec = stack.spec
    if spec.model is None:
        raise InvalidRequest(f"collection {spec.name!r} holds the client's vectors (no model): there is nothing "
                             "to re-embed them with; create a collection with a model", field="model")
    if stacks.encoders is None:
        raise ShardUnavailable("this gateway runs without encoders: it cannot embed for a new version",
                               field="model")
    try:
        version = await stacks.encoders.probe(model)
    except EncoderError as exc:
        raise InvalidRequest(f"model {model!r} does not load: {exc.message}", field="model") from exc
    if expected is not None and expected != version.id:
        raise InvalidRequest(f"model {model!r} produces version {version.id}, not {expected}", field="version")
    stack.rollout.check_stage(version.id, model)  # refused before the spec or any replica changes
    await asyncio.to_thread(stacks.collections.add_version, spec.name, spec.uid, version)
    await _wait_stageable(stack, version.id)
    return await stack.rollout.stage(version.id, model)


async def _wait_stageable(stack: CollectionStack, version: str, timeout_s: float = READY_TIMEOUT_S) -> None:
    """Until every replica has the base of ``version`` to load (its node builds it within a
    reconcile tick of the spec's change: until then the replica answers 404). Any other answer —
    a replica out of room for another version, one that does not answer — ends the wait for it:
    the stage that follows refuses with every replica's reason."""
    client = stack.registry.client
    waiting = [replica for group in stack.replicas for replica in group]
    deadline = time.monotonic() + timeout_s
    while waiting and time.monotonic() < deadline:
        for replica in list(waiting):
            try:
                await client.stage(replica, version, ADMIN_TIMEOUT_S)
            except NotFound:
                continue
            except ShardragError:
                pass
            waiting.remove(replica)
        if waiting:
            await asyncio.sleep(0.2)


def add_collection_rollout_routes(app: FastAPI, gateway: Callable[[], Any],
                                  default_name: Callable[[], str]) -> None:
    """``gateway()``: the running Gateway; ``default_name()``: its launched collection's name."""

    async def service(name: str) -> tuple[RolloutService, CollectionStack | None]:
        if name == default_name():
            return gateway().rollout, None
        stack: CollectionStack = await gateway().collections.get(name)
        return stack.rollout, stack

    @app.get("/v1/collections/{name}/rollout", summary="A collection's rollout state, replicas per version, encoders",
             responses=RESPONSES)
    async def status(name: NamePath) -> FastAPIResponse:
        rollout, _ = await service(name)
        return json_response(await rollout.status())

    @app.post("/v1/collections/{name}/rollout/stage", summary="Stage a new embedding model for the collection "
              "(an empty version on every replica, its encoder loaded)", responses=RESPONSES)
    async def stage(name: NamePath, command: CollectionStageCommand) -> FastAPIResponse:
        rollout, stack = await service(name)
        if stack is None:  # the launched collection: its versions are built offline and named
            if command.version is None:
                raise InvalidRequest(f"{name!r} is the launched collection: name the version `shardrag build "
                                     "--collection` made", field="version")
            return json_response(await rollout.stage(command.version, command.model))
        return json_response(await stage_created(gateway().collections, stack, command.model, command.version))

    @app.post("/v1/collections/{name}/rollout/activate", summary="Fill the staged version from the live one, "
              "bring it up to date, run the quality gate, switch queries to it", responses=RESPONSES)
    async def activate(name: NamePath, command: ActivateCommand) -> FastAPIResponse:
        rollout, _ = await service(name)
        return json_response(await rollout.activate(command.version, force=command.force, queries=command.queries,
                                                    qrels=command.qrels))

    @app.post("/v1/collections/{name}/rollout/retire", summary="Unload the previous version after the drain period",
              responses=RESPONSES)
    async def retire(name: NamePath, command: RetireCommand) -> FastAPIResponse:
        rollout, stack = await service(name)
        answer = await rollout.retire(command.version, force=command.force)
        await forget_unloaded(stack, command.version, answer)
        return json_response(answer)

    @app.post("/v1/collections/{name}/rollout/abort", summary="Unload a staged version", responses=RESPONSES)
    async def abort(name: NamePath, command: VersionCommand) -> FastAPIResponse:
        rollout, stack = await service(name)
        answer = await rollout.abort(command.version)
        await forget_unloaded(stack, command.version, answer)
        return json_response(answer)

    async def forget_unloaded(stack: CollectionStack | None, version: str, answer: dict[str, Any]) -> None:
        """A created collection's version the rollout no longer loads: recorded as retired, so its
        nodes remove its files (a stage of the same model brings it back, empty)."""
        state = answer["state"]
        if stack is not None and version not in (state["active"], state["staged"], state["previous"]):
            await asyncio.to_thread(gateway().collections.collections.retire_version, stack.spec.name,
                                    stack.spec.uid, version)

    @app.post("/v1/collections/{name}/rollout/rollback", summary="Re-activate the previous version while it is "
              "loaded", responses=RESPONSES)
    async def rollback(name: NamePath, command: VersionCommand) -> FastAPIResponse:
        rollout, _ = await service(name)
        return json_response(await rollout.rollback(command.version))

