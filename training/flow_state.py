"""The record of one ``shardrag train --rollout`` flow, kept in the collection's directory:

    <root>/<collection>/.train-flows/<flow id>/state.json   what each step did, written after it
    <root>/<collection>/.train-flows/<flow id>/run/         the training run (checkpoints, export)
    <root>/<collection>/.train-flows/<flow id>/lock         held while a flow runs (flock)

The flow id is a hash of what determines the result — the collection, the base version and
model as given (or "the active one"), the training recipe, the world size — so re-running the same command
finds the same record and continues, and a changed recipe is a new flow. The record is written
atomically (temp, fsync, rename); it is a journal of completed steps, never the only evidence:
each step also checks the world (checkpoint, export, built version, the gateway's rollout state)
before doing anything, because a flow killed after a step's work and before its record must not
do that work again. Dot-directories are never taken for versions (``index_shards.layout``).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from retrieval.atomic import atomic_write_bytes
from retrieval.errors import ConfigError

STEPS = ("train", "export", "build", "stage", "activate")
FLOWS_DIR = ".train-flows"
# Training fields that do not change the trained weights (where files go, logging, tests' probes).
_NOT_IN_ID = ("root", "out", "diagnostics", "log_every", "threads", "checkpoint_every")


def flow_id(collection: str, base_version: str, base_model: str, recipe: dict[str, Any], nproc: int) -> str:
    ident = {"collection": collection, "base_version": base_version, "base_model": base_model, "nproc": nproc,
             "recipe": {k: v for k, v in sorted(recipe.items()) if k not in _NOT_IN_ID}}
    digest = hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()
    return f"flow-{digest[:12]}"


@dataclass(slots=True)
class FlowState:
    flow: str
    collection: str
    base_version: str
    base_model: str
    steps: dict[str, dict[str, Any]] = field(default_factory=dict)  # step → what it produced, when
    outcome: str | None = None  # "activated" | "refused" (by the quality gate) | None: not finished
    created_at: float = field(default_factory=time.time)

    def done(self, step: str) -> bool:
        return step in self.steps

    def next_step(self) -> str | None:
        return next((s for s in STEPS if s not in self.steps), None)

    def to_dict(self) -> dict[str, Any]:
        return {"flow": self.flow, "collection": self.collection, "base_version": self.base_version,
                "base_model": self.base_model, "steps": self.steps, "outcome": self.outcome,
                "created_at": self.created_at}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FlowState:
        return cls(flow=data["flow"], collection=data["collection"], base_version=data["base_version"],
                   base_model=data["base_model"], steps=dict(data.get("steps", {})), outcome=data.get("outcome"),
                   created_at=float(data.get("created_at", 0.0)))


class FlowStore:
    """The flow's directory: its state file, its training run, its lock."""

    def __init__(self, collection_directory: Path, flow: str) -> None:
        self.directory = collection_directory / FLOWS_DIR / flow
        self.path = self.directory / "state.json"
        self.run_dir = self.directory / "run"

    def load(self) -> FlowState | None:
        if not self.path.exists():
            return None
        try:
            return FlowState.from_dict(json.loads(self.path.read_text()))
        except (ValueError, KeyError) as exc:  # written atomically: only a foreign edit gets here
            raise ConfigError(f"{self.path} is not a flow record ({exc}); remove it or pass --fresh",
                              field="flow") from exc

    def save(self, state: FlowState) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(self.path, json.dumps(state.to_dict(), indent=1).encode())

    def record(self, state: FlowState, step: str, **result: Any) -> None:
        state.steps[step] = {**result, "at": round(time.time(), 3)}
        self.save(state)

    def discard(self) -> None:
        """Forget this flow (its record and training run), to start the recipe over."""
        with self.locked():
            self.path.unlink(missing_ok=True)
            shutil.rmtree(self.run_dir, ignore_errors=True)

    @contextmanager
    def locked(self) -> Iterator[None]:
        """One flow process at a time per flow; a killed holder releases it with its process."""
        self.directory.mkdir(parents=True, exist_ok=True)
        handle = open(self.directory / "lock", "a+")
        try:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError as exc:
                raise ConfigError(f"another process is running this flow ({self.directory}); wait for it",
                                  field="flow") from exc
            handle.seek(0)
            handle.truncate()
            handle.write(str(os.getpid()))
            handle.flush()
            yield
        finally:
            handle.close()
