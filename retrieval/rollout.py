"""The embedding-version rollout protocol as a pure state machine (no I/O, no clock of its own).

    stage V+1 ──► sync V+1 ──► activate V+1 ──► retire V     (V+1 active, V drained and unloaded)
        │                          │
      abort V+1                 rollback V  (while V is still loaded: V active again, V+1 becomes previous)

``active`` is the version every new query goes to; ``staged`` is loading or loaded next to it
on every replica; ``synced`` says the staged version has been brought up to date with every write
the active one took since its build, and takes its own copy of every write from then on
(dual-write); ``previous`` stays loaded after an activation (for in-flight queries and for
rollback, and keeps taking writes) until it is retired. So replicas hold at most two versions at a
time.

Every command is idempotent: repeating it with the same arguments — a client retrying after a
timeout — returns a :class:`Transition` with ``event = None`` and the current state, never a
second transition. A command that makes no sense in the current state raises
:class:`RolloutRefused` (HTTP 409) saying why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from retrieval.errors import VersionConflict

MAX_EVENTS = 50


class RolloutRefused(VersionConflict):
    code = "rollout_refused"


@dataclass(slots=True, frozen=True)
class RolloutEvent:
    kind: str  # VersionStaged, VersionSynced, VersionActivated, VersionRetired, VersionAborted, VersionRolledBack
    version: str
    at: float
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "version": self.version, "at": self.at, "detail": self.detail}


@dataclass(slots=True, frozen=True)
class RolloutState:
    active: str
    staged: str | None = None
    previous: str | None = None
    activated_at: float = 0.0
    generation: int = 0  # +1 on every transition; stores compare-and-set on it
    models: Mapping[str, str] = field(default_factory=dict)  # version → encoder checkpoint ("default" = MiniLM)
    events: tuple[RolloutEvent, ...] = ()
    synced: bool = False  # the staged version is up to date and takes writes

    def loaded(self) -> tuple[str, ...]:
        """Versions the replicas should hold, active first."""
        return tuple(v for v in (self.active, self.staged, self.previous) if v is not None)

    def write_targets(self) -> tuple[str, ...]:
        """Versions every write goes to, active first: a staged version only once it is synced."""
        staged = self.staged if self.synced else None
        return tuple(v for v in (self.active, staged, self.previous) if v is not None)

    def to_dict(self) -> dict[str, Any]:
        return {"active": self.active, "staged": self.staged, "previous": self.previous,
                "activated_at": self.activated_at, "generation": self.generation, "models": dict(self.models),
                "events": [e.to_dict() for e in self.events], "synced": self.synced}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RolloutState:
        return cls(
            active=str(data["active"]),
            staged=data.get("staged"),
            previous=data.get("previous"),
            activated_at=float(data.get("activated_at", 0.0)),
            generation=int(data.get("generation", 0)),
            models={str(k): str(v) for k, v in dict(data.get("models", {})).items()},
            events=tuple(RolloutEvent(e["kind"], e["version"], float(e["at"]), e.get("detail", ""))
                         for e in data.get("events", [])),
            synced=bool(data.get("synced", False)),
        )


@dataclass(slots=True, frozen=True)
class Transition:
    state: RolloutState
    event: RolloutEvent | None  # None: nothing changed (an idempotent repeat)


def _advance(state: RolloutState, event: RolloutEvent, **changes: Any) -> Transition:
    events = (state.events + (event,))[-MAX_EVENTS:]
    return Transition(replace(state, generation=state.generation + 1, events=events, **changes), event)


def _same(state: RolloutState) -> Transition:
    return Transition(state, None)


def stage(state: RolloutState, version: str, model: str, now: float) -> Transition:
    if version in (state.active, state.staged):
        if version == state.staged and state.models.get(version, model) != model:
            raise RolloutRefused(f"{version} is staged with encoder {state.models[version]!r}, not {model!r}",
                                 field="model")
        return _same(state)
    if state.staged is not None:
        raise RolloutRefused(f"{state.staged} is already staged; activate or abort it first", field="version")
    if state.previous is not None:
        if version == state.previous:
            raise RolloutRefused(f"{version} is the previous version, still loaded: use rollback", field="version")
        raise RolloutRefused(f"the previous version {state.previous} is still loaded; retire it first "
                             "(replicas hold at most two versions)", field="version")
    return _advance(state, RolloutEvent("VersionStaged", version, now, f"encoder {model}"),
                    staged=version, synced=False, models={**state.models, version: model})


def sync(state: RolloutState, version: str, now: float, detail: str = "") -> Transition:
    """Record that the staged ``version`` has every write and takes its own copy of the next ones.
    The caller brought it up to date, with the active version's writes fenced, first."""
    if version == state.staged and state.synced or version == state.active:
        return _same(state)
    if version != state.staged:
        raise RolloutRefused(f"{version} is not staged (staged: {state.staged or 'none'})", field="version")
    return _advance(state, RolloutEvent("VersionSynced", version, now, detail), synced=True)


def activate(state: RolloutState, version: str, now: float, detail: str = "") -> Transition:
    """Switch new queries to ``version``. The caller checks readiness and the quality gate first."""
    if version == state.active:
        return _same(state)
    if version != state.staged:
        raise RolloutRefused(f"{version} is not staged (staged: {state.staged or 'none'})", field="version")
    if not state.synced:
        raise RolloutRefused(f"{version} is not synced: it has not been given the writes {state.active} took since "
                             "its build", field="version")
    return _advance(state, RolloutEvent("VersionActivated", version, now, detail),
                    active=version, staged=None, synced=False, previous=state.active, activated_at=now)


def retire(state: RolloutState, version: str, now: float, *, drain_s: float, force: bool = False) -> Transition:
    if version == state.active:
        raise RolloutRefused(f"{version} is the active version; it cannot be retired", field="version")
    if version == state.staged:
        raise RolloutRefused(f"{version} is staged, not active: use abort", field="version")
    if version != state.previous:
        return _same(state)  # already retired (or never loaded): nothing to do
    waited = now - state.activated_at
    if waited < drain_s and not force:
        raise RolloutRefused(f"{version} is draining: queries started on it may still be running; retire is "
                             f"allowed in {drain_s - waited:.1f} s (or force it)", field="version")
    models = {k: v for k, v in state.models.items() if k != version}
    return _advance(state, RolloutEvent("VersionRetired", version, now), previous=None, models=models)


def abort(state: RolloutState, version: str, now: float) -> Transition:
    if version == state.active:
        raise RolloutRefused(f"{version} is active: use rollback to return to the previous version", field="version")
    if version != state.staged:
        return _same(state)  # already aborted (or never staged)
    models = {k: v for k, v in state.models.items() if k != version}
    return _advance(state, RolloutEvent("VersionAborted", version, now), staged=None, synced=False, models=models)


def rollback(state: RolloutState, version: str, now: float) -> Transition:
    """Make the still-loaded previous ``version`` active again."""
    if version == state.active:
        return _same(state)
    if version != state.previous:
        raise RolloutRefused(f"{version} is not loaded any more (previous: {state.previous or 'none'})",
                             field="version")
    return _advance(state, RolloutEvent("VersionRolledBack", version, now),
                    active=version, previous=state.active, activated_at=now)
