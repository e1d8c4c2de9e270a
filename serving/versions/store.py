"""Where the rollout state lives: the interface the registry and the rollout commands use, one
atomic read-modify-write at a time so two gateways can never record two different transitions.

The store is the cluster state (``clusterstate.state.RolloutStoreOnKV``): etcd, or the local
coordinator's file on one machine — every gateway of a collection shares it. Releases before the
cluster state kept the rollout state in a ``rollout.json`` of its own; :func:`read_legacy_rollout`
reads one so that it is imported once.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

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


def read_legacy_rollout(path: str | Path) -> RolloutState | None:
    """The rollout state an earlier release kept in its own JSON file (None when there is none)."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"rollout state {path} is unreadable: {exc}", field="rollout_state_path") from exc
    return RolloutState.from_dict(data)
