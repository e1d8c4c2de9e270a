"""A version's tuned search parameters: ``<version dir>/search.json``, written by ``shardrag tune``.

A replica reads the file when it loads the version and uses its ``nprobe`` / ``ef_search`` for
every query that does not set them itself, and its ``k_factor`` (a refine stage's re-ranked
candidates per result) for every query. The file sits next to ``collection.json`` (not in a
shard's manifest) so that tuning never rewrites a published, checksummed shard; it is written
crash-safely (temp file, fsync, rename) and a damaged file is reported, never half-applied.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from retrieval.atomic import atomic_write_bytes
from retrieval.errors import IndexIntegrityError

SEARCH_DEFAULTS_FILE = "search.json"
_PARAMS = ("nprobe", "ef_search", "k_factor")


@dataclass(frozen=True, slots=True)
class SearchDefaults:
    nprobe: int | None = None
    ef_search: int | None = None
    k_factor: int | None = None
    # How they were chosen (shown by /v1/info and `shardrag tune`; never used to search).
    recall_target: float | None = None
    recall: float | None = None  # mean recall@k on the tuning queries at this setting
    k: int | None = None
    queries: int | None = None
    tuned_at: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        for name in _PARAMS:
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise IndexIntegrityError(f"{SEARCH_DEFAULTS_FILE}: {name} must be a positive integer, not {value!r}")

    @property
    def params(self) -> dict[str, int]:
        """The parameters a search uses when the query names none (only those that are set)."""
        return {name: getattr(self, name) for name in _PARAMS if getattr(self, name) is not None}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def read_search_defaults(version_directory: str | Path) -> SearchDefaults | None:
    """The tuned defaults of a version, or None when it was never tuned."""
    path = Path(version_directory) / SEARCH_DEFAULTS_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_bytes())
        if not isinstance(data, dict):
            raise TypeError("not a JSON object")
        return SearchDefaults(**data)
    except (json.JSONDecodeError, UnicodeDecodeError, TypeError) as exc:
        raise IndexIntegrityError(f"{path} is malformed ({exc}); re-run `shardrag tune` or delete it") from exc


def write_search_defaults(version_directory: str | Path, defaults: SearchDefaults) -> Path:
    path = Path(version_directory) / SEARCH_DEFAULTS_FILE
    atomic_write_bytes(path, json.dumps(defaults.to_dict(), indent=1).encode())
    return path
