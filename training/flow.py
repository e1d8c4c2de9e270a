"""``shardrag train --rollout``: from the active version's slices to an activated new version, in
one resumable command.

    train     DDP on the slices of the active version V (torchrun; resumes from its checkpoint)
    export    the trained transformer as a sentence-transformers checkpoint → version V'
    build     V' on the same slices (V's documents, shard count, partitioner, factory, metric, ...)
    stage     V' loaded by every replica and the gateway's query encoder (through the gateway)
    activate  once ready everywhere, behind the quality gate: passed → V' serves every query;
              refused → V' is aborted and V keeps serving; the gate's numbers are recorded

Each step first looks at the world — the checkpoint, the export, the built version, the
gateway's rollout state — and only does work that is not there; its result is then journalled
(``training.flow_state``). So a flow killed at any point (even with SIGKILL between a step's
work and its record) and re-run ends where an uninterrupted run would, without training,
building or staging twice. Fault injection for tests and game days:
``SHARDRAG_FLOW_KILL_AFTER=<step>`` SIGKILLs the flow right after that step's work, before its
record.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from index_shards.layout import collection_dir, resolve_version
from retrieval import env
from retrieval.errors import ConfigError, NotFound, ShardragError, VersionConflict
from training.config import TrainConfig
from training.flow_state import STEPS, FlowState, FlowStore, flow_id

REFUSED_EXIT = 3  # the quality gate refused the trained version (V stays active)


@dataclass(slots=True, frozen=True)
class FlowSettings:
    url: str  # the gateway that runs the rollout
    nproc: int = 2  # ranks = slices
    api_key: str | None = None  # an admin key, when the gateway requires keys
    queries: str | None = None  # the gate's queries (BEIR queries.jsonl); None: the gateway's recent ones
    qrels: str | None = None  # with queries: nDCG@10 in the gate
    max_restarts: int = 3  # torchrun restarts of a dead rank
    ready_timeout_s: float = 900.0  # staged version loaded everywhere within this
    name: str | None = None  # flow name (default: a hash of the recipe)
    retire_previous: bool = False  # retire the previous version when stage needs its room

    def validate(self) -> FlowSettings:
        if self.nproc < 1:
            raise ConfigError("nproc must be ≥ 1", field="nproc")
        if self.qrels and not self.queries:
            raise ConfigError("--qrels needs --queries", field="qrels")
        for name in ("queries", "qrels"):
            path = getattr(self, name)
            if path and not Path(path).is_file():
                raise ConfigError(f"--{name}: no such file {path}", field=name)
        return self


class TrainFlow:
    """One flow. ``config.model`` "" or "default" and no ``config.version``: start from the active
    version and the model the gateway serves it with; ``fresh``: forget an earlier record of this
    recipe and start over from what is active now."""

    def __init__(self, config: TrainConfig, settings: FlowSettings, *, client: Any = None,
                 say: Callable[[str], None] | None = None, fresh: bool = False) -> None:
        from retrieval.client import ShardragClient

        self.settings = settings.validate()
        self.client = client or ShardragClient(settings.url, timeout_s=600.0, api_key=settings.api_key)
        self.say = say or (lambda line: print(line, file=sys.stderr, flush=True))
        self.root = Path(config.root)
        self.collection = config.collection
        self.requested = config
        rollout = self.client.rollout_status()["state"]
        self.gateway_state: dict[str, Any] = rollout
        # The record (if any) pins V and its model; otherwise V is what the gateway serves now.
        explicit_model = config.model not in ("", "default") or config.version is not None
        name = settings.name or flow_id(config.collection, config.version or "<active>",
                                        config.model if explicit_model else "<active>", config.to_dict(),
                                        settings.nproc)
        self.store = FlowStore(collection_dir(self.root, self.collection), name)
        if fresh:
            self.store.discard()
        existing = self.store.load()
        if existing is not None:
            self.state = existing
        else:
            base_version = config.version or rollout["active"]
            if base_version != rollout["active"]:
                raise ConfigError(f"the flow trains on the active version's slices; {base_version} is not active "
                                  f"({rollout['active']} is)", field="version")
            model = config.model if explicit_model else rollout["models"].get(base_version, "default")
            self.state = FlowState(flow=name, collection=self.collection, base_version=base_version, base_model=model)
        resolve_version(self.root, self.collection, self.state.base_version)  # V must be on disk here
        self.config = dataclasses.replace(config, version=self.state.base_version, model=self.state.base_model,
                                          out=str(self.store.run_dir), export=False)

    # -- plan ----------------------------------------------------------------------------------
    def plan(self) -> list[str]:
        lines = [f"flow {self.state.flow} on {self.collection} (record: {self.store.path})",
                 f"base: version {self.state.base_version}, model {self.state.base_model}"]
        what = {"train": f"{self.settings.nproc} ranks × {self.config.max_steps} steps, run dir {self.store.run_dir}",
                "export": f"the last checkpoint → {self.store.run_dir / self.config.export_name}",
                "build": "the new version on the same slices (layout of the base version)",
                "stage": f"through {self.settings.url}",
                "activate": "behind the quality gate (" + (f"queries {self.settings.queries}"
                                                          + (" with qrels" if self.settings.qrels else "")
                                                          if self.settings.queries else "the gateway's recent queries")
                            + "); refused → abort, base stays active"}
        for number, step in enumerate(STEPS, 1):
            record = self.state.steps.get(step)
            status = "done" if record is not None else "to do"
            detail = {k: v for k, v in (record or {}).items() if k in ("version", "outcome", "refused")}
            lines.append(f"  {number}. {step:8} {status:6} {what[step]}" + (f"  {detail}" if detail else ""))
        if self.state.outcome:
            lines.append(f"outcome: {self.state.outcome}")
        return lines

    # -- run -----------------------------------------------------------------------------------
    def run(self) -> FlowState:
        with self.store.locked():
            if self.state.outcome is not None:
                self.say(f"this flow ended earlier: {self.state.outcome} "
                         f"({self.state.steps.get('activate', {}).get('note', '')})")
            elif not self.state.done("stage"):
                self._preflight()  # before hours of training, not after
            self.store.save(self.state)
            for number, step in enumerate(STEPS, 1):
                if self.state.outcome is not None:
                    break
                if self.state.done(step):
                    self.say(f"[{number}/{len(STEPS)}] {step}: done earlier")
                    continue
                self.say(f"[{number}/{len(STEPS)}] {step} ...")
                started = time.monotonic()
                result = getattr(self, f"_{step}")()
                self.store.record(self.state, step, **result, seconds=round(time.monotonic() - started, 2))
                self.say(f"[{number}/{len(STEPS)}] {step}: {result.get('note', 'done')} "
                         f"({time.monotonic() - started:.1f} s)")
            if self.state.outcome == "refused":
                self._abort_refused()
        return self.state

    def _stage_blockers(self, state: dict[str, Any], version: str | None) -> list[str]:
        """What keeps the gateway from staging ``version`` (None: the version training will make)."""
        if version is not None and version in (state["active"], state["staged"]):
            return []
        blockers = []
        if state["staged"] is not None:
            blockers.append(f"{state['staged']} is staged on the gateway: activate or abort it first")
        if state["previous"] is not None and not self.settings.retire_previous:
            blockers.append(f"the previous version {state['previous']} is still loaded (replicas hold two versions): "
                            f"retire it (`shardrag rollout retire {state['previous']}`) or pass --retire-previous")
        return blockers

    def _preflight(self) -> None:
        state = self.client.rollout_status()["state"]
        version = self.state.steps.get("export", {}).get("version")
        blockers = self._stage_blockers(state, version)
        if blockers:
            raise ConfigError("the flow could not stage its version: " + "; ".join(blockers), field="rollout")

    def _did(self, step: str) -> None:
        """Fault injection: die right after ``step``'s work, before its record."""
        if env.read("SHARDRAG_FLOW_KILL_AFTER") == step:
            self.say(f"fault injection: the flow kills itself after {step}'s work")
            os.kill(os.getpid(), signal.SIGKILL)

    def _new_version(self) -> tuple[str, str]:
        export = self.state.steps["export"]
        return export["version"], export["path"]

    # -- steps ---------------------------------------------------------------------------------
    def _train(self) -> dict[str, Any]:
        from training.checkpoint import load_checkpoint
        from training.launch import launch_local

        checkpoint = load_checkpoint(self.store.run_dir)
        if checkpoint is not None and int(checkpoint["step"]) >= self.config.max_steps:
            return {"steps": int(checkpoint["step"]), "note": "already trained (final checkpoint found)"}
        launch_local(self.config, self.settings.nproc, max_restarts=self.settings.max_restarts)
        self._did("train")
        return {"steps": self.config.max_steps}

    def _export(self) -> dict[str, Any]:
        from retrieval.encoders import SentenceTransformerEncoder
        from training.export import export_checkpoint

        path = self.store.run_dir / self.config.export_name
        if (path / "model.safetensors").exists():  # exported before a kill (the export dir is renamed in whole)
            version = SentenceTransformerEncoder(path, name=self.config.export_name, device="cpu").version
            note = "found the export"
        else:
            version = export_checkpoint(self.store.run_dir, self.config.model, self.config.export_name,
                                        scale=self.config.scale, learn_scale=self.config.learn_scale)
            note = "exported from the last checkpoint"
            self._did("export")
        if version.id == self.state.base_version:
            raise ConfigError("training left the weights unchanged: the export is the base version", field="max_steps")
        return {"version": version.id, "path": str(path), "note": f"{note}: {version.id}"}

    def _build(self) -> dict[str, Any]:
        from index_shards.build import BuildConfig, documents_of_version, encode_and_build
        from retrieval.encoders import load_encoder

        version, path = self._new_version()
        try:
            resolve_version(self.root, self.collection, version)
            return {"version": version, "note": f"{version} already built"}
        except NotFound:
            pass
        base_dir, base = resolve_version(self.root, self.collection, self.state.base_version)
        for leftover in base_dir.parent.glob(f".staging-{version}-*"):  # a build of ours that was killed
            shutil.rmtree(leftover, ignore_errors=True)
        documents = documents_of_version(self.root, self.collection, self.state.base_version)
        encoder = load_encoder(path)
        config = BuildConfig(collection=self.collection, num_shards=base.num_shards, partitioner=base.partitioner,
                             factory=base.factory, metric=base.metric, lexical_language=base.lexical_language,
                             ef_construction=base.ef_construction)
        manifest = encode_and_build(self.root, documents, encoder, config)
        self._did("build")
        return {"version": version, "count": manifest.count, "shards": manifest.num_shards,
                "note": f"{manifest.count} documents in {manifest.num_shards} shards"}

    def _stage(self) -> dict[str, Any]:
        version, path = self._new_version()
        state = self.client.rollout_status()["state"]
        if version in (state["active"], state["staged"]):
            where = "active" if version == state["active"] else "staged"
            return {"version": version, "note": f"{version} already {where}"}
        blockers = self._stage_blockers(state, version)
        if blockers:
            raise ConfigError("cannot stage: " + "; ".join(blockers), field="rollout")
        if state["previous"] is not None:
            self.say(f"retiring the previous version {state['previous']} (--retire-previous)")
            self.client.rollout("retire", state["previous"])
        self.client.rollout("stage", version, model=path)
        self._did("stage")
        return {"version": version}

    def _activate(self) -> dict[str, Any]:
        version, path = self._new_version()
        state = self.client.rollout_status()["state"]
        if state["active"] == version:
            self.state.outcome = "activated"
            return {"version": version, "note": f"{version} already active"}
        if state["staged"] != version:  # aborted by someone since: stage it again
            self.say(f"{version} is no longer staged; staging it again")
            self.client.rollout("stage", version, model=path)
        self._wait_ready(version)
        body: dict[str, Any] = {}
        if self.settings.queries:
            from retrieval.datasets import load_qrels, load_queries

            body["queries"] = load_queries(self.settings.queries)
            if self.settings.qrels:
                body["qrels"] = load_qrels(self.settings.qrels)
        try:
            answer = self.client.rollout("activate", version, **body)
        except VersionConflict as exc:  # the gate's refusal: a 409 with the gate's numbers
            gate = getattr(exc, "gate", None)
            if gate is None:
                raise
            self.state.outcome = "refused"
            return {"version": version, "refused": True, "gate": gate,
                    "note": f"refused by the quality gate: {gate.get('reason')}"}
        self._did("activate")
        self.state.outcome = "activated"
        return {"version": version, "gate": answer.get("gate"), "note": f"{version} is active"}

    def _abort_refused(self) -> None:
        """A refused version leaves the replicas (idempotent: a re-run after a kill repeats it)."""
        version, _ = self._new_version()
        state = self.client.rollout_status()["state"]
        if state["staged"] == version:
            self.client.rollout("abort", version)
        self.say(f"aborted {version}")

    def _wait_ready(self, version: str) -> None:
        deadline = time.monotonic() + self.settings.ready_timeout_s
        last = ""
        while True:
            status = self.client.rollout_status()
            rows = [row for rows in status.get("replicas", {}).get(version, {}).values() for row in rows]
            encoder = status.get("encoders", {}).get(version, {})
            failed = [row for row in rows if row["state"] == "failed"]
            if failed or encoder.get("state") == "failed":
                raise ShardragError(f"{version} failed to load: replicas {failed}, encoder {encoder}")
            ready = sum(row["state"] == "ready" for row in rows)
            line = f"waiting for {version}: {ready}/{len(rows)} replicas ready, encoder {encoder.get('state')}"
            if rows and ready == len(rows) and encoder.get("state") in ("ready", None):
                return
            if line != last:
                self.say(line)
                last = line
            if time.monotonic() > deadline:
                raise ShardragError(f"{version} not ready after {self.settings.ready_timeout_s:.0f} s: {line}")
            time.sleep(0.5)
