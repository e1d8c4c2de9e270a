"""Atomic training checkpoints: model, optimizer, scheduler, every rank's RNG states, the step
(which is the sampler's position, see training.data), the base embedding version and the config.

Written by rank 0 only: to a temp file in the run directory, fsynced, renamed over
``checkpoint.pt`` (the previous one stays intact until the rename), directory fsynced.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from retrieval.atomic import fsync_dir

CHECKPOINT = "checkpoint.pt"


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(directory: Path, payload: dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / CHECKPOINT
    temp = directory / f".{CHECKPOINT}.{os.getpid()}.tmp"
    with open(temp, "wb") as handle:
        torch.save(payload, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temp, path)
    fsync_dir(directory)
    return path


def load_checkpoint(directory: Path) -> dict[str, Any] | None:
    path = directory / CHECKPOINT
    if not path.exists():
        return None
    state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=False)
    return state
