"""Where the rollout state lives, behind one small interface so a Kubernetes deployment can put
it in a ConfigMap or a small KV store. Every gateway polls it; admin commands change it with an
atomic read-modify-write, so two gateways can never record two different transitions.

* :class:`FileRolloutStore` — the embedded default: one JSON file, changed under an exclusive
  ``flock`` and written crash-safely (temp file, fsync, rename, directory fsync).
* :class:`MemoryRolloutStore` — one process only (tests, a single in-process gateway).
"""

from __future__ import annotations

import fcntl
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from retrieval.atomic import atomic_write_bytes
from retrieval.errors import ConfigError
from retrieval.rollout import RolloutState

Change = Callable[[RolloutState | None], RolloutState]


class RolloutStore(Protocol):
    def load(self) -> RolloutState | None:
        """The current state, or None before the first write."""
        ...

    def update(self, change: Change) -> RolloutState:
        """Apply ``change`` to the current state atomically and return the result. ``change`` may
        raise (nothing is written) or return the state unchanged (nothing is written either)."""
        ...


class MemoryRolloutStore:
    def __init__(self, state: RolloutState | None = None) -> None:
        self._state = state
        self._lock = threading.Lock()

    def load(self) -> RolloutState | None:
        return self._state

    def update(self, change: Change) -> RolloutState:
        with self._lock:
            self._state = change(self._state)
            return self._state


class FileRolloutStore:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock_path = self.path.with_name(self.path.name + ".lock")

    def load(self) -> RolloutState | None:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"rollout state {self.path} is unreadable: {exc}", field="rollout_state_path") from exc
        return RolloutState.from_dict(data)

    def update(self, change: Change) -> RolloutState:
        with open(self._lock_path, "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                current = self.load()
                new = change(current)
                if new is not current and new != current:
                    self._write(new)
                return new
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _write(self, state: RolloutState) -> None:
        atomic_write_bytes(self.path, json.dumps(state.to_dict(), indent=1).encode())


def make_store(path: str | None) -> RolloutStore:
    return FileRolloutStore(path) if path else MemoryRolloutStore()
